#!/usr/bin/env python3
"""mlx-lm's side of the speculative benchmark: its own draft-model speculative decoding
(`stream_generate(..., draft_model=..., num_draft_tokens=N)`, what `mlx_lm.generate
--draft-model DIR --num-draft-tokens N` runs) on the same target, draft, prompt, greedy
sampling and f32 compute as `examples/spec-bench.rs`, plus its plain decoding as a control.

  python3 crates/runner/examples/mlx_lm_spec.py --model models/tiny-mtp \
      [--draft-model models/tiny-draft] [--depths 1,2,3,4] [--tokens 128] [--runs 3]

One JSON line per (method, depth), the same keys as spec-bench's:
{"bench":"spec","engine":"mlx-lm","method":"off|draft-model","depth":N,"tokens_per_s":..,
 "acceptance_rate":..,"mean_accepted_length":..,"generated_tokens":..,"runs":R}
tokens_per_s is the median of mlx-lm's generation_tps over the timed runs (one warm-up
first). mlx-lm drafts N tokens every round (fewer only at the budget's end), and each
round emits exactly one token not from the draft, so rounds = non-draft tokens,
acceptance = draft tokens / (rounds x N). Needs mlx-lm (`pip install "mlx-lm[cpu]"`);
`mtp.*` tensors are skipped (strict=False), as mlx-lm's qwen3 has no MTP head.
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_model, load_tokenizer

ROOT = Path(__file__).resolve().parents[3]


def load(path):
    model, _ = load_model(Path(path), strict=False)
    model.set_dtype(mx.float32)
    return model


def one_run(model, tok, prompt, tokens, draft, depth):
    kwargs = {} if draft is None else {"draft_model": draft, "num_draft_tokens": depth}
    last, from_draft, n = None, 0, 0
    for r in stream_generate(model, tok, prompt, max_tokens=tokens, sampler=make_sampler(0.0), **kwargs):
        last = r
        n += 1
        from_draft += int(bool(getattr(r, "from_draft", False)))
    return last.generation_tps, n, from_draft


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft-model", default=str(ROOT / "models" / "tiny-draft"))
    ap.add_argument("--depths", default="1,2,3,4")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", default="Once upon a time")
    # spec-bench's other flags are accepted and ignored, so one argument list serves both.
    ap.add_argument("--methods", default=None)
    a = ap.parse_args()
    model = load(a.model)
    draft = load(a.draft_model)
    tok = load_tokenizer(Path(a.model))
    prompt = tok.encode(a.prompt)
    cases = [("off", 0, None)] + [
        ("draft-model", int(d), draft) for d in a.depths.split(",") if d.strip() not in ("", "auto")
    ]
    for method, depth, dm in cases:
        runs = []
        for run in range(a.runs + 1):
            res = one_run(model, tok, prompt, a.tokens, dm, depth)
            if run > 0:
                runs.append(res)
        runs.sort(key=lambda r: r[0])
        tps, n, from_draft = runs[len(runs) // 2]
        rounds = max(n - from_draft, 1)
        drafted = rounds * depth
        print(json.dumps({
            "bench": "spec", "engine": "mlx-lm", "method": method, "depth": depth,
            "tokens_per_s": tps,
            "acceptance_rate": (from_draft / drafted) if drafted else 0.0,
            "mean_accepted_length": n / rounds,
            "generated_tokens": n, "runs": a.runs,
        }), flush=True)


if __name__ == "__main__":
    main()
