#!/usr/bin/env python3
"""mlx-lm's side of the `spec-scale` benchmark: plain decoding and its draft-model
speculative decoding (`stream_generate(..., draft_model=..., num_draft_tokens=N)`) on the
same weights, prompts, greedy sampling and dtype as `examples/scale-bench.rs`.

  python3 crates/runner/examples/mlx_lm_scale.py --model DIR --prompts FILE \
      [--draft-model DIR] [--shape NAME] [--dtype bf16|f32] [--depths 2,3,4] [--tokens 256] \
      [--ttft-tokens 1000,600] [--deadline-s S]

The model (and draft) is loaded once, in --dtype. Each prompt is id 0 then the text's
tokens (no special tokens), as scale-bench does. One JSON line per result, the keys of
scale-bench's lines: kind "load", "decode" (per method and depth: tokens_per_s = tokens
after each run's first / the decode time mlx-lm reports, over all prompts;
mean_accepted_length; greedy_equal_plain against mlx-lm's own plain tokens), "ttft"
(fresh plain requests of 1,000 and another number of prompt tokens) and "skipped" (a case
--deadline-s would not have left time for). Every case runs a 16-token warm-up first.
`mtp.*` tensors are skipped (strict=False): mlx-lm's qwen3 has no MTP head.
"""
import argparse
import json
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_model, load_tokenizer

START = time.perf_counter()


def emit(row):
    print(json.dumps(row), flush=True)


def load(path, dtype):
    model, _ = load_model(Path(path), strict=False)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def one_run(model, tok, ids, tokens, draft, depth):
    """(tokens, decode seconds of tokens after the first, prefill seconds, from_draft, rounds)."""
    kwargs = {} if draft is None else {"draft_model": draft, "num_draft_tokens": depth}
    out, last, from_draft = [], None, 0
    for r in stream_generate(model, tok, ids, max_tokens=tokens, sampler=make_sampler(0.0), **kwargs):
        last = r
        out.append(int(r.token))
        from_draft += int(bool(getattr(r, "from_draft", False)))
    n = len(out)
    # Each round ends with one token not from the draft, except a last round the budget cut.
    rounds = (n - from_draft) + int(last is not None and bool(getattr(last, "from_draft", False)))
    # generation_tps is tokens / time since the first token: that time carries n - 1 tokens.
    decode_s = n / last.generation_tps if last.generation_tps > 0 and n > 1 else 0.0
    prefill_s = last.prompt_tokens / last.prompt_tps if last.prompt_tps > 0 else 0.0
    return out, decode_s, prefill_s, from_draft, max(rounds, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--shape", default="?")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--depths", default="2,3,4")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--ttft-tokens", default="1000,600")
    ap.add_argument("--deadline-s", type=float, default=None)
    a = ap.parse_args()
    dtype = {"f32": mx.float32, "bf16": mx.bfloat16}[a.dtype]
    base = {"bench": "spec-scale", "engine": "mlx-lm", "shape": a.shape, "dtype": a.dtype}

    t0 = time.perf_counter()
    before = mx.get_active_memory()
    model = load(a.model, dtype)
    weight_bytes = mx.get_active_memory() - before
    draft = load(a.draft_model, dtype) if a.draft_model else None
    emit({**base, "kind": "load", "load_s": time.perf_counter() - t0, "weight_bytes": weight_bytes,
          "model": a.model, "draft_model": a.draft_model})
    tok = load_tokenizer(Path(a.model))
    texts = json.loads(Path(a.prompts).read_text())
    prompts = [[0] + tok.encode(t, add_special_tokens=False) for t in texts]

    cases = [("off", 0, None)]
    if draft is not None:
        cases += [("draft-model", int(d), draft) for d in a.depths.split(",") if d.strip()]
    plain, last_case = None, None
    for i, (method, depth, dm) in enumerate(cases):
        guess = None if last_case is None else last_case * (3 if i == 1 else 1)
        if a.deadline_s is not None and guess is not None and time.perf_counter() - START + guess > a.deadline_s:
            emit({**base, "kind": "skipped", "method": method, "depth": depth,
                  "reason": f"--deadline-s {a.deadline_s}: the last case took {guess:.1f} s"})
            continue
        case_start = time.perf_counter()
        one_run(model, tok, prompts[0], 16, dm, depth)
        outs, decode_s, prefill_s, timed, from_draft, rounds = [], 0.0, 0.0, 0, 0, 0
        for ids in prompts:
            out, d, p, f, r = one_run(model, tok, ids, a.tokens, dm, depth)
            outs.append(out)
            decode_s += d
            prefill_s += p
            timed += max(len(out) - 1, 0)
            from_draft += f
            rounds += r
        last_case = time.perf_counter() - case_start
        equal, first = True, None
        if method == "off":
            plain = outs
        elif plain is not None:
            for p, (want, got) in enumerate(zip(plain, outs)):
                k = next((j for j, (x, y) in enumerate(zip(want, got)) if x != y), None)
                if k is None and len(want) != len(got):
                    k = min(len(want), len(got))
                if k is not None:
                    equal, first = False, [p, k]
                    break
        else:
            equal = None
        # Approximate: mlx-lm drafts fewer than N only where the budget ends.
        drafted = rounds * depth
        emit({**base, "kind": "decode", "method": method, "depth": depth,
              "tokens_per_s": timed / decode_s if decode_s > 0 else 0.0,
              "step_ms": decode_s * 1e3 / timed if timed else 0.0,
              "mean_accepted_length": sum(map(len, outs)) / rounds if method != "off" else 1.0,
              "acceptance_rate": from_draft / drafted if drafted else 0.0,
              "rounds": rounds if method != "off" else 0,
              "greedy_equal_plain": equal, "first_divergence": first,
              "ttft_ms": prefill_s * 1e3 / len(prompts),
              "generated_tokens": sum(map(len, outs)), "prompts": len(prompts), "tokens": a.tokens})
        if method == "off":
            flat = [t for p in prompts for t in p]
            lengths = [int(x) for x in a.ttft_tokens.split(",") if x.strip()]
            need = max(lengths, default=0)
            flat = (flat * (need // max(len(flat), 1) + 1))[:need]
            for r, n in enumerate(lengths):
                _, _, p, _, _ = one_run(model, tok, flat[:n], 2, None, 0)
                emit({**base, "kind": "ttft", "method": "off", "depth": 0, "request": r + 1,
                      "prompt_tokens": n, "ttft_ms": p * 1e3})


if __name__ == "__main__":
    main()
