"""Fixtures in MLX's floating-point quantization modes (mxfp4, mxfp8, nvfp4), with mlx-lm's greedy ids.

mlx-community ships models converted with `mlx_lm.convert --q-mode mxfp4|mxfp8|nvfp4`: per module
`{p}.weight` (uint32 codes) and `{p}.scales` (uint8: e8m0 exponents for mx*, e4m3 for nvfp4) and
no `{p}.biases`. This script converts the shipped `{family}-mlx-f32` folders (themselves
`mlx_lm.convert` outputs of `ref_formats.py`'s transformers models) into those modes and stores
mlx-lm's own greedy ids, computed in f32, as `expected.json` (the layout `ref_formats.py` writes;
`crates/runner/tests/it/formats.rs` checks them token for token). `qwen3-mlx-mixed-fp` is nvfp4
with mxfp8 overrides for the embedding and the unembedding (per-module `mode` in the config).

Run by hand when a format changes (`cargo xtask ref-fp-modes`; needs mlx-lm 0.32.2).

Usage: ref_fp_modes.py [--out crates/runner/tests/fixtures/formats]
"""
import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

# (source family, folder suffix, mode, overrides: module-path suffix -> mode)
BUILDS = [
    ("qwen3", "mxfp4", "mxfp4", {}),
    ("qwen3", "mxfp8", "mxfp8", {}),
    ("qwen3", "nvfp4", "nvfp4", {}),
    ("qwen3", "mixed-fp", "nvfp4", {"embed_tokens": "mxfp8", "lm_head": "mxfp8"}),
    # The expert stacks through gather_qmm.
    ("qwen3_moe", "mxfp4", "mxfp4", {}),
    ("qwen3_moe", "nvfp4", "nvfp4", {}),
]
DEFAULTS = {"mxfp4": (32, 4), "mxfp8": (32, 8), "nvfp4": (16, 4)}


def main():
    import ref_formats as rf
    import mlx_lm
    from mlx_lm import convert

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "crates/runner/tests/fixtures/formats"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        for family, suffix, mode, overrides in BUILDS:
            src = os.path.join(work, family)
            if not os.path.isdir(src):
                shutil.copytree(os.path.join(a.out, f"{family}-mlx-f32"), src)
                os.remove(os.path.join(src, "expected.json"))
                rf.write_tokenizer(src)

            def predicate(path, module, overrides=overrides):
                for name, m in overrides.items():
                    if path.endswith(name):
                        g, b = DEFAULTS[m]
                        return {"group_size": g, "bits": b, "mode": m}
                return True

            d = os.path.join(a.out, f"{family}-mlx-{suffix}")
            shutil.rmtree(d, ignore_errors=True)
            convert(src, d, quantize=True, q_mode=mode, dtype="float32",
                    quant_predicate=predicate if overrides else None)
            ids = rf.greedy_mlx(d, rf.PROMPT, rf.MAX_TOKENS)
            rf.strip(d)
            rf.expected(d, ids, f"mlx-lm {mlx_lm.__version__} f32", {"mtp": False})
            print(f"{family}-mlx-{suffix}: {ids}")


if __name__ == "__main__":
    sys.exit(main())
