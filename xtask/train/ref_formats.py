"""Reference checkpoints in the formats users download, with the references' own greedy ids.

Run by hand when a format changes (`cargo xtask ref-formats`; needs torch, transformers 5.x and
mlx-lm, see requirements.txt). For every family the runner supports it writes a tiny random model
with transformers' own class (`save_pretrained`: f32, bf16, sharded with an index) and converts it
with `mlx_lm.convert` (f32, 4-bit and 8-bit), moving every norm and bias off its initial value so a
wrong convention (a missed or doubled +1, a dropped bias) changes the tokens. Each folder gets an
`expected.json` with the prompt and the reference greedy ids, computed by transformers (hub
layouts, in f32 on the stored weights) or by mlx-lm (converted layouts, in f32); the runner test
`crates/runner/tests/formats.rs` checks every folder token for token without torch.

MTP heads: transformers drops `mtp.*` and `model.mtp_layers.*` on load, so the hub folders of
Qwen3.5 and MiMo get random MTP tensors under their real names after saving (the reference is
unaffected); mlx-lm removes them on conversion, as it does for real checkpoints.

Mixture-of-experts families are built by `ref_moe.py` (Qwen3.5-MoE) and, when present,
`ref_moe_families.py`: each exports `BUILDERS`, name -> `build(out, work, rf)` with this module as `rf`.

Usage: ref_formats.py [--out crates/runner/tests/fixtures/formats] [--only NAME]
"""
import argparse
import importlib
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VOCAB = 272
EOT, IM_START, IM_END = 256, 257, 258
PROMPT = [5, 77, 130, 9, 201, 44, 3, 250, 18, 99, 61, 120]
MAX_TOKENS = 12
SEED = 1234
# A config patch value that removes the key (patch_config).
DROP = object()


def perturb(model, seed):
    """Random weights at a scale where logits are O(1-10), and norms/biases off their init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("model.visual"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            elif "norm" in name:
                # Zero-centred (Qwen3.5) or one-centred norms alike: moved by ±0.3.
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
            elif name.endswith(".bias") or name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            elif name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2.0 - 1.0)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.ndim >= 2:
                fan_in = int(np.prod(p.shape[1:]))
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))


def greedy_torch(model, prompt, n):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):]


def greedy_mlx(path, prompt, n):
    import mlx.core as mx
    from mlx_lm.utils import load

    model, _ = load(path)
    model.set_dtype(mx.float32)
    ids = list(prompt)
    for _ in range(n):
        logits = model(mx.array([ids]))[0, -1]
        ids.append(int(mx.argmax(logits).item()))
    return ids[len(prompt):]


def write_tokenizer(path):
    """A byte-level tokenizer (mlx_lm.convert needs one; the runner test writes its own)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<{i}>": i for i in range(256)}
    vocab.update({"<|endoftext|>": EOT, "<|im_start|>": IM_START, "<|im_end|>": IM_END})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(path)


def common_config(**kw):
    c = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=EOT,
        eos_token_id=EOT,
    )
    c.update(kw)
    return c


def dense(cls_name, cfg_name, **kw):
    import transformers

    cfg = getattr(transformers, cfg_name)(**common_config(**kw))
    return getattr(transformers, cls_name)(cfg)


def qwen3_5():
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                         "mrope_interleaved": True},
        tie_word_embeddings=False,
        mtp_num_hidden_layers=1,
        eos_token_id=EOT,
        bos_token_id=EOT,
    )
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=32,
                  num_position_embeddings=16, in_channels=3)
    cfg = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
    return Qwen3_5ForConditionalGeneration(cfg)


def add_tensors(folder, extra):
    """Appends `extra` (name -> tensor) to the folder's safetensors (the last shard if sharded)."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        idx = json.load(open(index))
        shard = sorted(set(idx["weight_map"].values()))[-1]
        for k in extra:
            idx["weight_map"][k] = shard
        json.dump(idx, open(index, "w"), indent=2)
    else:
        shard = "model.safetensors"
    path = os.path.join(folder, shard)
    t = load_file(path)
    t.update(extra)
    save_file(t, path, metadata={"format": "pt"})


def mtp_qwen(sd, dtype, g):
    """A Qwen3.5 `mtp.*` head shaped like the trunk's full-attention layer."""
    full = "model.language_model.layers.1."
    h = sd["model.language_model.norm.weight"].shape[0]
    out = {"mtp.fc.weight": torch.randn(h, 2 * h, generator=g) / math.sqrt(2 * h)}
    for n in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"]:
        out[f"mtp.{n}.weight"] = torch.randn(h, generator=g) * 0.3
    for k, v in sd.items():
        if k.startswith(full):
            rest = k[len(full):]
            scale = 0.3 if "norm" in rest else 1.0 / math.sqrt(v.shape[-1])
            out[f"mtp.layers.0.{rest}"] = torch.randn(v.shape, generator=g) * scale
    return {k: v.to(dtype).contiguous() for k, v in out.items()}


def mtp_mimo(sd, dtype, g):
    """A MiMo `model.mtp_layers.0.*` head: a Qwen2 decoder layer plus its fusion tensors."""
    h = sd["model.norm.weight"].shape[0]
    p = "model.mtp_layers.0."
    out = {p + "input_proj.weight": torch.randn(h, 2 * h, generator=g) / math.sqrt(2 * h)}
    for n in ["token_layernorm", "hidden_layernorm", "final_layernorm"]:
        out[p + n + ".weight"] = 1.0 + torch.randn(h, generator=g) * 0.3
    for k, v in sd.items():
        if k.startswith("model.layers.0."):
            rest = k[len("model.layers.0."):]
            if "norm" in rest:
                val = 1.0 + torch.randn(v.shape, generator=g) * 0.3
            elif rest.endswith("bias"):
                val = torch.randn(v.shape, generator=g) * 0.3
            else:
                val = torch.randn(v.shape, generator=g) / math.sqrt(v.shape[-1])
            out[p + rest] = val
    return {k: v.to(dtype).contiguous() for k, v in out.items()}


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 8}

# name -> (builder, config patch written after saving, MTP adder)
FAMILIES = {
    "llama": (lambda: dense("LlamaForCausalLM", "LlamaConfig", attention_bias=True,
                            mlp_bias=True), {}, None),
    # mlx-lm's llama reads the window from `layer_types` only: say it for mlx-lm as well.
    # mlx-lm 0.32.2 applies no window to Mistral (its llama reads `layer_types`, which
    # MistralConfig does not write, and needs a full-attention layer): see `build`.
    "mistral": (lambda: dense("MistralForCausalLM", "MistralConfig", sliding_window=6), {}, None),
    # mlx-lm reads `rope_scaling` (transformers 4 style), transformers 5 `rope_parameters`.
    "qwen2-yarn": (lambda: dense("Qwen2ForCausalLM", "Qwen2Config", rope_parameters=YARN),
                   {"rope_scaling": YARN}, None),
    "qwen3": (lambda: dense("Qwen3ForCausalLM", "Qwen3Config"), {}, None),
    "mimo": (lambda: dense("Qwen2ForCausalLM", "Qwen2Config"),
             {"architectures": ["MiMoForCausalLM"], "model_type": "mimo",
              "num_nextn_predict_layers": 1}, mtp_mimo),
    # mlx-lm reads `full_attention_interval` (default 4), transformers `layer_types`: give both.
    "qwen3_5": (qwen3_5, {"text_config": {"full_attention_interval": 2}}, mtp_qwen),
}


def strip(folder):
    for f in os.listdir(folder):
        if f not in ("config.json", "expected.json") and not f.endswith(".safetensors") \
                and f != "model.safetensors.index.json":
            os.remove(os.path.join(folder, f))


def expected(folder, ids, reference, extra=None):
    e = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "ids": ids, "reference": reference}
    e.update(extra or {})
    json.dump(e, open(os.path.join(folder, "expected.json"), "w"), indent=1)


def patch_config(folder, patch):
    if not patch:
        return
    p = os.path.join(folder, "config.json")
    c = json.load(open(p))
    for k, v in patch.items():
        if v is DROP:
            c.pop(k, None)
        elif isinstance(v, dict) and isinstance(c.get(k), dict):
            c[k].update(v)
        else:
            c[k] = v
    json.dump(c, open(p, "w"), indent=2)


def build(name, out, work):
    import transformers
    from mlx_lm import convert

    # An optional fourth entry re-draws what perturb scales for a dense family (MoE experts).
    make, patch, mtp, *after = FAMILIES[name]
    torch.manual_seed(SEED)
    model = make().float().eval()
    perturb(model, SEED)
    for f in after:
        f(model)
    base = os.path.join(work, name)
    model.save_pretrained(base)
    write_tokenizer(base)
    ref = greedy_torch(model, PROMPT, MAX_TOKENS)
    print(f"{name}: transformers f32 {ref}")
    made = []
    for fmt, kw in [("hf-f32", {}), ("hf-bf16", {"bf16": True}),
                    ("hf-sharded", {"shard": True})]:
        d = os.path.join(out, f"{name}-{fmt}")
        shutil.rmtree(d, ignore_errors=True)
        m = model
        if kw.get("bf16"):
            m = make()
            m.load_state_dict(model.state_dict())
            m = m.to(torch.bfloat16)
        m.save_pretrained(d, max_shard_size="40KB" if kw.get("shard") else "50GB")
        ids = ref
        if kw.get("bf16"):
            # The stored bf16 weights, computed in f32 (what the runner does by default).
            back = type(model).from_pretrained(d, dtype=torch.float32).eval()
            ids = greedy_torch(back, PROMPT, MAX_TOKENS)
        if mtp is not None:
            g = torch.Generator().manual_seed(SEED + 1)
            dt = torch.bfloat16 if kw.get("bf16") else torch.float32
            add_tensors(d, mtp(model.state_dict(), dt, g))
        patch_config(d, patch)
        strip(d)
        expected(d, ids, f"transformers {transformers.__version__} f32", {"mtp": mtp is not None})
        made.append(d)
    # mlx-lm converts the hub layout (MiMo: the Qwen2 folder relabelled, as mlx-lm reads `mimo`).
    patch_config(base, patch)
    mlx_formats = [("mlx-f32", dict(dtype="float32")),
                   ("mlx-q4", dict(quantize=True, q_bits=4, q_group_size=32, dtype="float32")),
                   ("mlx-q8", dict(quantize=True, q_bits=8, q_group_size=32, dtype="float32"))]
    if name == "qwen2-yarn":
        # mlx-lm 0.32.2's YaRN differs from transformers' (logits part by ~0.1 here):
        # only the f32 conversion is kept, checked against transformers on the same weights.
        mlx_formats = mlx_formats[:1]
    if name == "qwen3_5":
        # mlx-lm adds its +1 to the norms in the stored dtype: bf16-rounded shifted norms.
        mlx_formats.append(("mlx-bf16", dict(dtype="bfloat16")))
    for fmt, kw in mlx_formats:
        d = os.path.join(out, f"{name}-{fmt}")
        shutil.rmtree(d, ignore_errors=True)
        convert(base, d, **kw)
        import mlx_lm
        prompt, n, reference = PROMPT, MAX_TOKENS, f"mlx-lm {mlx_lm.__version__} f32"
        if name in ("mistral", "qwen2-yarn") and fmt == "mlx-f32":
            # The same f32 weights: transformers is the reference that applies the window.
            ids, reference = ref, f"transformers {transformers.__version__} f32 (same weights)"
        else:
            if name == "mistral":
                # Short enough that no position leaves the window, where mlx-lm is right.
                prompt, n = PROMPT[:3], 3
            ids = greedy_mlx(d, prompt, n)
        strip(d)
        expected(d, ids, reference, {"mtp": False, "prompt": prompt, "max_tokens": n})
        print(f"{name}: {fmt} {ids}")
        made.append(d)
    return made


def moe_builders():
    """`BUILDERS` of ref_moe.py and, when that file exists, ref_moe_families.py."""
    sys.path.insert(0, HERE)
    out = {}
    for module in ["ref_moe", "ref_moe_families"]:
        if importlib.util.find_spec(module) is not None:
            out.update(importlib.import_module(module).BUILDERS)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "crates/runner/tests/fixtures/formats"))
    ap.add_argument("--only", action="append")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)
    moe = moe_builders()
    with tempfile.TemporaryDirectory() as work:
        for name in a.only or [*FAMILIES, *moe]:
            if name in moe:
                moe[name](a.out, work, sys.modules[__name__])
            else:
                build(name, a.out, work)
    total = sum(os.path.getsize(os.path.join(dp, f))
                for dp, _, fs in os.walk(a.out) for f in fs)
    print(f"wrote {a.out}: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    sys.exit(main())
