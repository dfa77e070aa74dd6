#!/usr/bin/env python3
"""mlx-lm's side of the decode benchmark: the same model, prompt, greedy sampling and f32
compute as `examples/decode-bench.rs`, one JSON line per timed run (after one warm-up).

  python3 crates/runner/examples/mlx_lm_decode.py --model models/tiny-mtp [--tokens 128] [--runs 2]
Needs mlx-lm (`pip install "mlx-lm[cpu]"`). `mtp.*` tensors are skipped (strict=False).
"""
import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load_model, load_tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--prompt", default="Once upon a time")
    a = ap.parse_args()
    model, _ = load_model(Path(a.model), strict=False)
    model.set_dtype(mx.float32)
    tok = load_tokenizer(Path(a.model))
    prompt = tok.encode(a.prompt)
    for run in range(a.runs + 1):
        last = None
        for r in stream_generate(model, tok, prompt, max_tokens=a.tokens, sampler=make_sampler(0.0)):
            last = r
        if run == 0:
            continue
        print(json.dumps({"engine": "mlx-lm", "run": run - 1, "prompt_tokens": last.prompt_tokens,
                          "generated_tokens": last.generation_tokens, "prefill_tps": last.prompt_tps,
                          "decode_tps": last.generation_tps}), flush=True)


if __name__ == "__main__":
    main()
