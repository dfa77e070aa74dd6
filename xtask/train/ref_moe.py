"""Mixture-of-experts reference checkpoints for ref_formats.py: tiny random Qwen3.5-MoE folders.

Imported by ref_formats.py, which calls `BUILDERS[name](out, work, rf)` with itself as `rf` (its
helpers: perturb, greedy_torch, greedy_mlx, write_tokenizer, expected, strip, patch_config, VOCAB,
PROMPT, MAX_TOKENS, SEED, EOT). Folders written for `qwen3_5_moe`:

| folder | layout | reference |
| --- | --- | --- |
| `qwen3_5_moe-hub-f32` | the hub's fused experts (`mlp.experts.gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`), saved from the state dict | transformers f32 |
| `qwen3_5_moe-hf-f32` | transformers `save_pretrained` (per-expert `mlp.experts.{e}.{gate,up,down}_proj.weight`) | transformers f32 |
| `qwen3_5_moe-mlx-f32` | `mlx_lm.convert` of the hub folder (`switch_mlp.*`) | mlx-lm f32 |
| `qwen3_5_moe-mlx-q4` | the same at 4 bits, group 32 (mlx-lm's 8-bit group-64 `mlp.gate` / `shared_expert_gate`) | mlx-lm f32 |

The two transformers folders carry a random `mtp.*` head (its block a MoE layer, in the folder's
expert layout) after saving; mlx-lm drops it on conversion, as it does for real checkpoints.
"""
import json
import math
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

TEXT = dict(
    hidden_size=64,
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
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                     "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                     "mrope_interleaved": True},
    tie_word_embeddings=False,
    mtp_num_hidden_layers=1,
)


def qwen3_5_moe(rf):
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    text = dict(TEXT, vocab_size=rf.VOCAB, eos_token_id=rf.EOT, bos_token_id=rf.EOT)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
                  num_position_embeddings=16, in_channels=3)
    cfg = Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
    return Qwen3_5MoeForConditionalGeneration(cfg)


def experts_fan_in(model, seed):
    """Stacked expert weights `[E, out, in]` get the scale of one `[out, in]` matrix."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 3 and ".experts." in name + ".":
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def mtp_like_layer(tensors, layer, g):
    """A random `mtp.*` head whose block has the tensor names (and expert layout) of `layer`."""
    h = tensors["model.language_model.norm.weight"].shape[0]
    out = {"mtp.fc.weight": torch.randn(h, 2 * h, generator=g) / math.sqrt(2 * h)}
    for n in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"]:
        out[f"mtp.{n}.weight"] = torch.randn(h, generator=g) * 0.3
    prefix = f"model.language_model.layers.{layer}."
    for k, v in tensors.items():
        if k.startswith(prefix):
            rest = k[len(prefix):]
            scale = 0.3 if "norm" in rest else 1.0 / math.sqrt(v.shape[-1])
            out[f"mtp.layers.0.{rest}"] = torch.randn(v.shape, generator=g) * scale
    dtype = tensors["model.language_model.norm.weight"].dtype
    return {k: v.to(dtype).contiguous() for k, v in out.items()}


def with_mtp(folder, seed):
    """Adds an MTP head to the folder's single model.safetensors."""
    path = os.path.join(folder, "model.safetensors")
    t = load_file(path)
    t.update(mtp_like_layer(t, 1, torch.Generator().manual_seed(seed)))
    save_file(t, path, metadata={"format": "pt"})


def save_hub(model, folder):
    """The hub form: the in-memory state dict (fused experts) and the model's own config."""
    os.makedirs(folder, exist_ok=True)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)


def build_qwen3_5_moe(out, work, rf):
    import mlx_lm
    import transformers
    from mlx_lm import convert

    name = "qwen3_5_moe"
    torch.manual_seed(rf.SEED)
    model = qwen3_5_moe(rf).float().eval()
    rf.perturb(model, rf.SEED)
    experts_fan_in(model, rf.SEED + 2)
    ref = rf.greedy_torch(model, rf.PROMPT, rf.MAX_TOKENS)
    print(f"{name}: transformers f32 {ref}")
    tf = f"transformers {transformers.__version__} f32"
    made = []
    # mlx-lm reads `full_attention_interval` (default 4), transformers `layer_types`: give both.
    patch = {"text_config": {"full_attention_interval": 2}}

    hub = os.path.join(out, f"{name}-hub-f32")
    shutil.rmtree(hub, ignore_errors=True)
    save_hub(model, hub)
    names = load_file(os.path.join(hub, "model.safetensors")).keys()
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in names), "hub form is fused"
    base = os.path.join(work, name)
    shutil.rmtree(base, ignore_errors=True)
    shutil.copytree(hub, base)
    rf.write_tokenizer(base)
    rf.patch_config(base, patch)
    with_mtp(hub, rf.SEED + 1)
    rf.patch_config(hub, patch)
    rf.strip(hub)
    rf.expected(hub, ref, tf, {"mtp": True})
    made.append(hub)

    hf = os.path.join(out, f"{name}-hf-f32")
    shutil.rmtree(hf, ignore_errors=True)
    model.save_pretrained(hf)
    names = load_file(os.path.join(hf, "model.safetensors")).keys()
    assert any(".mlp.experts.0.gate_proj.weight" in k for k in names), \
        "transformers 5 save_pretrained writes per-expert tensors"
    back = type(model).from_pretrained(hf, dtype=torch.float32).eval()
    assert rf.greedy_torch(back, rf.PROMPT, rf.MAX_TOKENS) == ref, "per-expert round trip"
    with_mtp(hf, rf.SEED + 1)
    rf.patch_config(hf, patch)
    rf.strip(hf)
    rf.expected(hf, ref, tf, {"mtp": True})
    made.append(hf)

    for fmt, kw in [("mlx-f32", dict(dtype="float32")),
                    ("mlx-q4", dict(quantize=True, q_bits=4, q_group_size=32, dtype="float32"))]:
        d = os.path.join(out, f"{name}-{fmt}")
        shutil.rmtree(d, ignore_errors=True)
        convert(base, d, **kw)
        ids = rf.greedy_mlx(d, rf.PROMPT, rf.MAX_TOKENS)
        rf.strip(d)
        rf.expected(d, ids, f"mlx-lm {mlx_lm.__version__} f32", {"mtp": False})
        print(f"{name}: {fmt} {ids}")
        if fmt == "mlx-q4":
            q = json.load(open(os.path.join(d, "config.json")))["quantization"]
            assert any(k.endswith("mlp.gate") and v["bits"] == 8 for k, v in q.items()
                       if isinstance(v, dict)), f"8-bit router override: {q}"
        made.append(d)
    return made


BUILDERS = {"qwen3_5_moe": build_qwen3_5_moe}
