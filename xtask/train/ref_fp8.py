"""A block-scaled fp8 checkpoint, as DeepSeek-V3 and the `-FP8` releases are stored, from a fixture.

Reads transformers-written fixtures (the sharded hub folders of ref_formats.py: Qwen3.5 with its
MTP head and vision tower, DeepSeek-V3 with MLA, MoE and its MTP layer) and writes, per family,
two folders:

- `<out>/<family>-hf-fp8/`: every linear weight of the text model and the MTP head (2-D `.weight`
  outside embeddings, `lm_head` and its MTP copy, norms and routers) as `F8_E4M3` codes with `.weight_scale_inv`
  (f32, one per block of `weight_block_size`), the rest as stored; the scales all sit in the last
  shard, away from most of their weights; config.json gets the `quantization_config` block those
  checkpoints carry.
- `<out>/<family>-fp8-dequantized/`: the same model with each fp8 weight decoded and multiplied by
  its block's scale in float32 by `ml_dtypes` (an implementation of the format independent of
  MLX's), one f32 file: what the fp8 folder must load as, bit for bit.

The block is 16 x 24 so that blocks are partial along both axes of most weights (real checkpoints
use 128 x 128 and have partial blocks too, e.g. DeepSeek-V3's 576-row `kv_a_proj_with_mqa`).

Needs numpy, ml_dtypes and safetensors only (no torch):
  python3 -m venv /tmp/fp8 && /tmp/fp8/bin/pip install numpy ml_dtypes safetensors
  /tmp/fp8/bin/python xtask/train/ref_fp8.py [FAMILY...]
"""
import argparse
import json
import os
import shutil

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(ROOT, "crates/runner/tests/fixtures")
BLOCK = (16, 24)
FP8_MAX = 448.0
KEEP = ("embed_tokens", "lm_head", "shared_head.head", "norm", "mlp.gate.", "shared_expert_gate",
        "visual.")


def quantized(name, a):
    return a.ndim == 2 and name.endswith(".weight") and not any(k in name for k in KEEP)


def to_fp8(w):
    """Codes and per-block scales (amax / 448, as DeepSeek's and transformers' quantizers do)."""
    rows, cols = BLOCK
    so, si = -(-w.shape[0] // rows), -(-w.shape[1] // cols)
    scales = np.zeros((so, si), np.float32)
    codes = np.zeros(w.shape, ml_dtypes.float8_e4m3fn)
    for i in range(so):
        for j in range(si):
            blk = w[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols]
            s = max(float(np.abs(blk).max()), 1e-12) / FP8_MAX
            scales[i, j] = s
            codes[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols] = (blk / s).astype(
                ml_dtypes.float8_e4m3fn)
    return codes, scales


def dequantized(codes, scales):
    rows, cols = BLOCK
    full = np.repeat(np.repeat(scales, rows, 0), cols, 1)[:codes.shape[0], :codes.shape[1]]
    return codes.astype(np.float32) * full


def save(path, tensors):
    """A safetensors file written by hand: the `safetensors` package has no fp8 numpy dtype."""
    names = {np.dtype(np.float32): "F32", np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3"}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        b = a.tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(FIXTURES, "fp8"))
    ap.add_argument("families", nargs="*", default=["qwen3_5", "deepseek_v3"])
    args = ap.parse_args()
    for family in args.families:
        build(os.path.join(FIXTURES, f"formats/{family}-hf-sharded"), args.out, family)


def build(src, out_root, family):
    index = json.load(open(os.path.join(src, "model.safetensors.index.json")))
    shards = sorted(set(index["weight_map"].values()))
    fp8_dir = os.path.join(out_root, f"{family}-hf-fp8")
    ref_dir = os.path.join(out_root, f"{family}-fp8-dequantized")
    for d in (fp8_dir, ref_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    weight_map, ref, scales, outs, count = {}, {}, {}, {}, 0
    for shard in shards:
        out = outs.setdefault(shard, {})
        for name, a in load_file(os.path.join(src, shard)).items():
            a = a.astype(np.float32)
            if quantized(name, a):
                codes, s = to_fp8(a)
                out[name] = codes
                scales[name + "_scale_inv"] = s
                ref[name] = dequantized(codes, s)
                count += 1
            else:
                out[name] = a
                ref[name] = a
            weight_map[name] = shard
    # Every scale in the last shard: most sit away from their weights.
    outs[shards[-1]].update(scales)
    weight_map.update({s: shards[-1] for s in scales})
    for shard, out in outs.items():
        save(os.path.join(fp8_dir, shard), out)
    with open(os.path.join(fp8_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=1)
    config = json.load(open(os.path.join(src, "config.json")))
    config["quantization_config"] = {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": list(BLOCK)}
    with open(os.path.join(fp8_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    ref_config = {k: v for k, v in config.items() if k != "quantization_config"}
    with open(os.path.join(ref_dir, "config.json"), "w") as f:
        json.dump(ref_config, f, indent=1)
    save(os.path.join(ref_dir, "model.safetensors"), ref)
    expected = json.load(open(os.path.join(src, "expected.json")))
    with open(os.path.join(fp8_dir, "fp8.json"), "w") as f:
        json.dump({"prompt": expected["prompt"], "max_tokens": expected["max_tokens"],
                   "fp8_weights": count, "block": list(BLOCK), "mtp": expected["mtp"]}, f, indent=1)
    print(f"{count} fp8 weights in {len(shards)} shards -> {fp8_dir}, {ref_dir}")


if __name__ == "__main__":
    main()
