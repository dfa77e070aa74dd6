#!/usr/bin/env python3
"""mlx-lm side of the reference checks, run as a subprocess (its own venv: needs only mlx-lm).

  python3 xtask/train/ref_mlx.py MODEL_DIR PROMPTS_JSON MAX_TOKENS > out.json

PROMPTS_JSON holds {"prompts": [[token ids], ...]}. For each prompt: the last-position logits of one
full forward (no cache), and MAX_TOKENS greedy tokens from mlx_lm.generate.generate_step (argmax, with
mlx-lm's own caches: for qwen3_5 a KV cache on the attention layers and conv + recurrent state on the
Gated DeltaNet layers, stepped one token at a time). The model is cast to float32 after loading.
Prints JSON {"mlx_lm": version, "model_class": ..., "results": [{"last_logits": [...], "tokens": [...]}]}.
"""
import json
import sys

import mlx.core as mx
import mlx_lm
from mlx_lm import load
from mlx_lm.generate import generate_step


def main():
    path, prompts_file, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    prompts = json.load(open(prompts_file))["prompts"]
    model, _ = load(path)
    model.set_dtype(mx.float32)
    results = []
    for ids in prompts:
        logits = model(mx.array([ids]))[0, -1].astype(mx.float32)
        toks = [int(t) for t, _ in generate_step(mx.array(ids), model, max_tokens=n)]
        results.append({"last_logits": logits.tolist(), "tokens": toks})
    json.dump({"mlx_lm": mlx_lm.__version__, "model_class": f"{type(model).__module__}.{type(model).__name__}",
               "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
