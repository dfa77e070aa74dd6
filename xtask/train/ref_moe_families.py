"""Tiny random Qwen3-Next, GLM-4.5, DeepSeek-V3 and GLM-4.7-Flash (MoE MTP families) for
ref_formats.py.

ref_formats.py calls `BUILDERS[name](out, work, rf)` with itself as `rf`; each builder runs
ref_formats' own `build` (hub f32 / bf16 / sharded with the MTP tensors, mlx-lm f32 / q4 / q8) on
a (model builder, config patch written after saving, MTP adder, expert re-draw) entry of
`families(rf)`. The configs are written transformers-4 style
(top-level `rope_theta` / `partial_rotary_factor`, Qwen3-Next's `full_attention_interval`
instead of `layer_types`), as the hub checkpoints were made and as mlx-lm 0.32.2 needs them.

MTP heads: transformers drops `mtp.*` (Qwen3-Next) and `model.layers.{N}.*` (GLM-4.5) on load,
so random tensors under the real names are appended after saving, in the per-expert form that
`save_pretrained` writes for the trunk's experts.
"""
import math

import torch

VOCAB = 272
EOT = 256
ROPE_THETA = 10000.0

# hidden_size 64: mlx-lm quantizes Qwen3-Next's `mlp.gate` / `shared_expert_gate` with
# group size 64, and every other input width is a multiple of the fixtures' group size 32.
QWEN3_NEXT = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
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
    decoder_sparse_step=1,
    mlp_only_layers=[],
    norm_topk_prob=True,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=EOT,
    eos_token_id=EOT,
)

GLM4_MOE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    attention_bias=True,
    use_qk_norm=True,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    first_k_dense_replace=1,
    num_nextn_predict_layers=1,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=EOT,
    eos_token_id=EOT,
)


# Multi-head latent attention, shared by the two MLA families below. Every quantized input
# width (q_lora, kv_lora, qk_nope, heads * v) is a multiple of the fixtures' group size 32,
# which mlx-lm's split `embed_q [heads, kv_lora, qk_nope]` / `unembed_out [heads, v, kv_lora]`
# needs to be quantized at all.
MLA = dict(
    num_attention_heads=2,
    num_key_value_heads=2,
    kv_lora_rank=32,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
)

# DeepSeek-V3: a query low-rank pair, values narrower than keys (16 against 48), and YaRN
# with mscale != mscale_all_dim, so the rotary tables' attention factor and the softmax
# scale's mscale_all_dim both move the logits.
DEEPSEEK_YARN = {"rope_type": "yarn", "rope_theta": ROPE_THETA, "factor": 4.0,
                 "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
                 "mscale": 1.0, "mscale_all_dim": 0.8}
DEEPSEEK_V3 = dict(
    MLA,
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    q_lora_rank=32,
    v_head_dim=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    n_shared_experts=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    first_k_dense_replace=1,
    num_nextn_predict_layers=1,
    rope_interleave=True,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=EOT,
    eos_token_id=EOT,
)

# GLM-4.7-Flash: a single `q_proj` (q_lora_rank null), values as wide as keys, plain RoPE,
# dense/sparse layers by `mlp_layer_types` (mlx-lm reads `first_k_dense_replace`: both given).
GLM4_MOE_LITE = dict(
    MLA,
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    q_lora_rank=None,
    v_head_dim=48,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    n_shared_experts=1,
    routed_scaling_factor=1.8,
    norm_topk_prob=True,
    mlp_layer_types=["dense", "sparse"],
    rope_interleave=True,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=EOT,
    eos_token_id=EOT,
)


def moved_correction_bias(model, seed=77):
    """The router's correction bias is a buffer, which ref_formats' perturb leaves at zero:
    moved so it changes the routing."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)
    return model


def deepseek_v3():
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(**DEEPSEEK_V3, rope_parameters=dict(DEEPSEEK_YARN))
    return moved_correction_bias(DeepseekV3ForCausalLM(cfg))


def glm4_moe_lite():
    from transformers import Glm4MoeLiteConfig, Glm4MoeLiteForCausalLM

    cfg = Glm4MoeLiteConfig(
        **GLM4_MOE_LITE,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
    )
    return moved_correction_bias(Glm4MoeLiteForCausalLM(cfg))


def qwen3_next():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(
        **QWEN3_NEXT,
        full_attention_interval=2,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA,
                         "partial_rotary_factor": 0.25},
    )
    return Qwen3NextForCausalLM(cfg)


def glm4_moe():
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    cfg = Glm4MoeConfig(
        **GLM4_MOE,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA,
                         "partial_rotary_factor": 0.5},
    )
    return moved_correction_bias(Glm4MoeForCausalLM(cfg))


def experts_fan_in(model):
    """Stacked experts `[E, out, in]` re-drawn at `1/sqrt(in)` (perturb scales a 3-d tensor by
    `out * in`, which would leave the experts' outputs negligible)."""
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 3 and ".experts." in name:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def per_expert(sd, prefix):
    """The trunk layer's tensors at `prefix` as save_pretrained writes them: fused
    `experts.gate_up_proj [E, 2I, H]` / `experts.down_proj [E, H, I]` become
    `experts.{e}.{gate,up,down}_proj.weight`; shapes only matter here."""
    out = {}
    for k, v in sd.items():
        if not k.startswith(prefix):
            continue
        rest = k[len(prefix):]
        if rest.endswith("experts.gate_up_proj"):
            base = rest[: -len("gate_up_proj")]
            e, two_i, h = v.shape
            for i in range(e):
                out[f"{base}{i}.gate_proj.weight"] = (two_i // 2, h)
                out[f"{base}{i}.up_proj.weight"] = (two_i // 2, h)
        elif rest.endswith("experts.down_proj"):
            base = rest[: -len("down_proj")]
            e, h, inter = v.shape
            for i in range(e):
                out[f"{base}{i}.down_proj.weight"] = (h, inter)
        else:
            out[rest] = tuple(v.shape)
    return out


def random_like(shapes, g, zero_centred):
    out = {}
    for rest, shape in shapes.items():
        if "norm" in rest:
            base = 0.0 if zero_centred else 1.0
            val = base + torch.randn(shape, generator=g) * 0.3
        elif rest.endswith("bias"):
            val = torch.randn(shape, generator=g) * 0.3
        else:
            val = torch.randn(shape, generator=g) / math.sqrt(shape[-1])
        out[rest] = val
    return out


def mtp_qwen3_next(sd, dtype, g):
    """A Qwen3-Next `mtp.*` head: fusion tensors and a full-attention MoE layer."""
    h = sd["model.norm.weight"].shape[0]
    out = {"mtp.fc.weight": torch.randn(h, 2 * h, generator=g) / math.sqrt(2 * h)}
    for n in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"]:
        out[f"mtp.{n}.weight"] = torch.randn(h, generator=g) * 0.3
    layer = random_like(per_expert(sd, "model.layers.1."), g, zero_centred=True)
    out.update({f"mtp.layers.0.{k}": v for k, v in layer.items()})
    return {k: v.to(dtype).contiguous() for k, v in out.items()}


def mtp_glm4_moe(sd, dtype, g):
    """A GLM-4.5 MTP layer at `model.layers.{N}` in the DeepSeek layout: enorm, hnorm,
    eh_proj, shared_head.{norm,head}, an embed_tokens copy and a full MoE decoder block."""
    n = sum(1 for k in sd if k.endswith(".input_layernorm.weight"))
    h = sd["model.norm.weight"].shape[0]
    p = f"model.layers.{n}."
    out = {
        p + "eh_proj.weight": torch.randn(h, 2 * h, generator=g) / math.sqrt(2 * h),
        p + "embed_tokens.weight": sd["model.embed_tokens.weight"].clone(),
        p + "shared_head.head.weight": sd["lm_head.weight"].clone(),
    }
    for name in ["enorm", "hnorm", "shared_head.norm"]:
        out[p + name + ".weight"] = 1.0 + torch.randn(h, generator=g) * 0.3
    layer = random_like(per_expert(sd, f"model.layers.{n - 1}."), g, zero_centred=False)
    out.update({p + k: v for k, v in layer.items()})
    # The router's correction bias stays f32 in every checkpoint (transformers keeps it so).
    return {k: (v if k.endswith("e_score_correction_bias") else v.to(dtype)).contiguous()
            for k, v in out.items()}


def families(rf):
    """The entries, with transformers-4 style keys (mlx-lm 0.32.2 reads only these) written
    after saving; `rf.DROP` removes a key."""
    return {
        "qwen3_next": (qwen3_next, {
            "rope_theta": ROPE_THETA, "partial_rotary_factor": 0.25,
            "full_attention_interval": 2, "layer_types": rf.DROP, "rope_parameters": rf.DROP,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
            "mtp_num_hidden_layers": 1,
        }, mtp_qwen3_next, experts_fan_in),
        "glm4_moe": (glm4_moe, {
            "rope_theta": ROPE_THETA, "partial_rotary_factor": 0.5, "rope_scaling": None,
            "rope_parameters": rf.DROP,
        }, mtp_glm4_moe, experts_fan_in),
        # The DeepSeek MTP layout, its block an MLA + MoE layer.
        "deepseek_v3": (deepseek_v3, {
            "rope_theta": ROPE_THETA, "rope_scaling": dict(DEEPSEEK_YARN),
            "rope_parameters": rf.DROP,
        }, mtp_glm4_moe, experts_fan_in),
        "glm4_moe_lite": (glm4_moe_lite, {
            "rope_theta": ROPE_THETA, "rope_scaling": None, "rope_parameters": rf.DROP,
            "first_k_dense_replace": 1, "num_nextn_predict_layers": 1,
        }, mtp_glm4_moe, experts_fan_in),
    }


def builder(name):
    def run(out, work, rf):
        rf.FAMILIES[name] = families(rf)[name]
        return rf.build(name, out, work)
    return run


BUILDERS = {name: builder(name)
            for name in ["qwen3_next", "glm4_moe", "deepseek_v3", "glm4_moe_lite"]}
