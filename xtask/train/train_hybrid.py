#!/usr/bin/env python3
"""Train the project's tiny HYBRID model (PyTorch) and export it as a Hugging Face folder.

Model (--model hybrid, models/tiny-hybrid-mtp): a dense Qwen3.5 text model (`Qwen3_5ForCausalLM`,
model_type qwen3_5 with a text_config), hidden 256, 6 layers: Gated DeltaNet (linear attention) in
layers 0,1,3,4 and gated full attention in layers 2,5 (full_attention_interval 3); GDN with 2 key
heads / 4 value heads of dim 64, causal depthwise conv1d kernel 4; attention 4 q / 2 kv heads,
head_dim 64, output gate (q_proj doubled), q/k norms, partial RoPE (factor 0.25 = 16 of 64 dims);
SwiGLU 512; zero-centred RMSNorms (`x * (1 + w)`; the GDN's gated norm is plain `w`); vocab 8192;
tied embeddings; plus ONE MTP layer in the Qwen3.5 layout (mtp.pre_fc_norm_embedding,
mtp.pre_fc_norm_hidden, mtp.fc, mtp.layers.0 = a gated full-attention decoder layer, mtp.norm; all
its norms zero-centred too). Loss = CE(t+1) + 0.3 * CE_mtp(t+2). About 6.9M parameters.
--smoke shrinks it to a toy (hidden 64, 3 layers) for a CPU smoke test.

The GDN trains with a chunked parallel form (chunk 64, `gdn_chunked`); `gdn_recurrent` is the
per-token recurrence mlx-lm and transformers run at decode time, and ref_check_hybrid.py checks they
agree. On export each zero-centred norm weight is rounded so that 1 + w is exact in bf16: mlx-lm adds
the 1 in bf16 at load, transformers in fp32, and both then see exactly the same gain.

Data, steps (--steps N | auto with --time-budget), output files: as train.py (see its --help);
the training loop is common.run. The exported folder holds config.json, model.safetensors (bf16; A_log, dt_bias f32),
tokenizer.json, tokenizer_config.json, generation_config.json, metrics.json, train_log.jsonl.

Examples:
  python3 xtask/train/train_hybrid.py --out /tmp/tiny-hybrid-mtp --steps auto --time-budget 300 --compile   # GPU
  python3 xtask/train/train_hybrid.py --out /tmp/smoke-hybrid --smoke --steps 20 --seq-len 128             # CPU
  python3 xtask/train/train_hybrid.py --out models/tiny-hybrid-mtp --eval-only                             # re-measure
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import EOT_ID  # noqa: E402
from train import MLP  # noqa: E402

CONFIGS = {
    "hybrid": dict(hidden_size=256, num_hidden_layers=6, full_attention_interval=3,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
                   linear_value_head_dim=64, linear_conv_kernel_dim=4, intermediate_size=512,
                   mtp_num_hidden_layers=1),
}
SMOKE = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
             linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=32,
             intermediate_size=128)
COMMON = dict(vocab_size=8192, rope_theta=10000.0, partial_rotary_factor=0.25, rms_norm_eps=1e-6,
              max_position_embeddings=2048)
OPT = {"hybrid": (2e-3, 128)}
CHUNK = 64


def layer_types(c):
    """Qwen3.5's rule (mlx-lm and transformers agree): layer i is full attention iff (i+1) % interval == 0."""
    k = c["full_attention_interval"]
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(c["num_hidden_layers"])]


# ----------------------------------------------------------------------------- gated delta rule
def gdn_recurrent(q, k, v, logg, beta, state=None):
    """Per-token gated delta rule, the form mlx-lm (gated_delta_ops) and transformers decode with.

    q, k: [B,T,H,Dk] (q already l2-normalised and scaled by Dk^-0.5, k l2-normalised; heads already
    expanded to the value heads); v: [B,T,H,Dv]; logg (log decay, <= 0), beta: [B,T,H].
    state: [B,H,Dk,Dv] or None. Per step: S = g S; u = beta (v - S^T k); S = S + k u^T; o = S^T q.
    Returns o [B,T,H,Dv] and the final state, fp32."""
    q, k, v, logg, beta = (x.float() for x in (q, k, v, logg, beta))
    B, T, H, Dk = k.shape
    S = torch.zeros(B, H, Dk, v.shape[-1], dtype=torch.float32, device=q.device) if state is None else state.float()
    outs = []
    for t in range(T):
        S = S * logg[:, t].exp()[..., None, None]
        kv = torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        u = beta[:, t, :, None] * (v[:, t] - kv)
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(outs, 1), S


def gdn_chunked(q, k, v, logg, beta, state=None, chunk=CHUNK):
    """The same function as gdn_recurrent, computed chunk-parallel (the WY / UT-transform form).

    Inside a chunk with cumulative log decay G_t (G_t - G_s = log of the decay from s to t) and
    incoming state S0, the written values u_t satisfy (I + A) U = beta V - diag(beta e^G) K S0 with
    A[t,s] = beta_t e^(G_t-G_s) k_t.k_s for s < t, so U = X_v - X_k S0 where (I + A) [X_v X_k] =
    [beta V, beta e^G K] (one triangular solve per chunk, all chunks at once). Then
      o_t = e^(G_t) q_t^T S0 + sum_{s<=t} e^(G_t-G_s) (q_t.k_s) u_s
      S_C = e^(G_C) S0 + sum_s e^(G_C-G_s) k_s u_s^T
    and only the last two (three small matmuls per chunk) run sequentially over the chunks.
    Decays enter only as exp of non-positive differences (masked before exp), so nothing overflows.
    Runs in fp32 (autocast off). Shapes as gdn_recurrent; T need not be a multiple of chunk."""
    with torch.autocast(q.device.type, enabled=False):
        q, k, v, logg, beta = (x.float() for x in (q, k, v, logg, beta))
        B, T, H, Dk = k.shape
        Dv = v.shape[-1]
        pad = (-T) % chunk
        if pad:  # zero keys/values, beta 0 and no decay: padded steps leave the state untouched
            q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
            logg, beta = (F.pad(x, (0, 0, 0, pad)) for x in (logg, beta))
        N = (T + pad) // chunk
        # -> [B,H,N,C,D]
        q, k, v = (x.transpose(1, 2).reshape(B, H, N, chunk, x.shape[-1]) for x in (q, k, v))
        logg, beta = (x.transpose(1, 2).reshape(B, H, N, chunk) for x in (logg, beta))
        G = logg.cumsum(-1)  # [B,H,N,C]
        diff = G[..., :, None] - G[..., None, :]  # [.., t, s] = G_t - G_s
        causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
        decay = diff.masked_fill(~causal, float("-inf")).exp()  # e^(G_t-G_s) for s <= t, else 0
        kb = k * beta[..., None]
        eye = torch.eye(chunk, dtype=torch.float32, device=q.device)
        A = (kb @ k.transpose(-1, -2)) * decay * (1.0 - eye)  # strictly lower
        rhs = torch.cat([v * beta[..., None], kb * G.exp()[..., None]], -1)
        X = torch.linalg.solve_triangular(A + eye, rhs, upper=False, unitriangular=True)
        Xv, Xk = X[..., :Dv], X[..., Dv:]
        P = (q @ k.transpose(-1, -2)) * decay  # intra-chunk read, s <= t
        q_dec = q * G.exp()[..., None]
        k_tail = k * (G[..., -1:] - G).exp()[..., None]
        g_chunk = G[..., -1].exp()[..., None, None]  # [B,H,N,1,1]
        S = (torch.zeros(B, H, Dk, Dv, dtype=torch.float32, device=q.device) if state is None
             else state.float())
        outs = []
        for n in range(N):
            U = Xv[:, :, n] - Xk[:, :, n] @ S
            outs.append(q_dec[:, :, n] @ S + P[:, :, n] @ U)
            S = S * g_chunk[:, :, n] + k_tail[:, :, n].transpose(-1, -2) @ U
        o = torch.stack(outs, 2).reshape(B, H, N * chunk, Dv)[:, :, :T].transpose(1, 2)
        return o, S


def l2norm(x, eps=1e-6):
    """x / sqrt(sum(x^2) + eps), as transformers' l2norm and mlx-lm's normalize_qk."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


# ----------------------------------------------------------------------------- model
class ZCRMSNorm(common.NormWeight):
    """Qwen3_5RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w), fp32; w stored zero-centred (init 0)."""

    def __init__(self, dim, eps):
        super().__init__(dim, eps, zero_centred=True)

    def forward(self, x):
        return (common.rms_normalise(x, self.eps) * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(common.NormWeight):
    """Qwen3_5RMSNormGated: w * norm(x) * silu(z), plain weight (init 1)."""

    def __init__(self, dim, eps):
        super().__init__(dim, eps)

    def forward(self, x, z):
        dt = x.dtype
        return (self.weight * common.rms_normalise(x, self.eps).to(dt) * F.silu(z.float())).to(dt)


class PartialRope(common.RotaryTables):
    """NeoX-style rotary embedding on the first rot = head_dim * partial_rotary_factor dims; the rest pass."""

    def __init__(self, head_dim, factor, theta, max_pos):
        rot = int(head_dim * factor)
        super().__init__(rot, theta, max_pos)
        self.rot = rot

    def forward(self, x, T):  # x: [B, heads, T, hd]
        r, p = x[..., :self.rot], x[..., self.rot:]
        return torch.cat([self.rotate(r, T), p], dim=-1)


class GatedAttention(common.AttentionProjections):
    """Qwen3.5 full attention: q_proj gives [query | gate] per head, q/k norms, partial RoPE, GQA,
    output * sigmoid(gate) before o_proj."""

    def __init__(self, c):
        super().__init__(c, ZCRMSNorm, q_mult=2)

    def forward(self, x, rope):
        B, T, _ = x.shape
        q, gate = self.q_proj(x).view(B, T, self.nh, 2 * self.hd).chunk(2, dim=-1)
        gate = gate.reshape(B, T, self.nh * self.hd)
        q = rope(self.q_norm(q).transpose(1, 2), T)
        k = rope(self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2), T)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        return self.o_proj(self.attend(q, k, v) * torch.sigmoid(gate))


class GatedDeltaNet(nn.Module):
    """Qwen3.5 linear attention (names as in transformers' Qwen3_5GatedDeltaNet)."""

    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.nk, self.nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        self.dk, self.dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        self.key_dim, self.value_dim = self.nk * self.dk, self.nv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.K = c["linear_conv_kernel_dim"]
        self.in_proj_qkv = nn.Linear(H, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(H, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(H, self.nv, bias=False)
        self.in_proj_a = nn.Linear(H, self.nv, bias=False)
        # depthwise causal conv over time, weight [conv_dim, 1, K] as nn.Conv1d stores it
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.K, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.nv))
        self.A_log = nn.Parameter(torch.zeros(self.nv))
        self.norm = GatedRMSNorm(self.dv, c["rms_norm_eps"])
        self.out_proj = nn.Linear(self.value_dim, H, bias=False)
        self.core = gdn_chunked

    def forward(self, x, rope=None):
        B, T, _ = x.shape
        qkv = self.in_proj_qkv(x)  # [B,T,C]
        w = self.conv1d.weight[:, 0, :]  # [C,K]; out_t = sum_j w[:, j] * x_{t-K+1+j}
        xp = F.pad(qkv, (0, 0, self.K - 1, 0))
        conv = sum(xp[:, j:j + T] * w[:, j] for j in range(self.K))
        conv = F.silu(conv)
        q, k, v = conv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(B, T, self.nk, self.dk).float()
        k = k.reshape(B, T, self.nk, self.dk).float()
        v = v.reshape(B, T, self.nv, self.dv)
        q = l2norm(q) * self.dk ** -0.5
        k = l2norm(k)
        if self.nv != self.nk:  # value head j reads key head j // (nv/nk)
            q = q.repeat_interleave(self.nv // self.nk, dim=2)
            k = k.repeat_interleave(self.nv // self.nk, dim=2)
        beta = torch.sigmoid(self.in_proj_b(x).float())
        logg = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())
        o, _ = self.core(q, k, v, logg, beta)
        z = self.in_proj_z(x).reshape(B, T, self.nv, self.dv)
        o = self.norm(o.to(z.dtype), z)
        return self.out_proj(o.reshape(B, T, self.value_dim))


class DecoderLayer(nn.Module):
    def __init__(self, c, kind):
        super().__init__()
        self.kind = kind
        self.input_layernorm = ZCRMSNorm(c["hidden_size"], c["rms_norm_eps"])
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(c)
        else:
            self.self_attn = GatedAttention(c)
        self.post_attention_layernorm = ZCRMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, rope):
        mixer = self.linear_attn if self.kind == "linear_attention" else self.self_attn
        x = x + mixer(self.input_layernorm(x), rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyQwen35(common.TiedMtpModel):
    """Trunk, tied LM head, MTP head and forward as train.py's dense model (common.TiedMtpModel)."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = common.Trunk(c, lambda: [DecoderLayer(c, t) for t in layer_types(c)], ZCRMSNorm)
        self.mtp = (common.MTP(c, lambda: DecoderLayer(c, "full_attention"), ZCRMSNorm)
                    if c.get("mtp_num_hidden_layers", 0) > 0 else None)
        self.rope = PartialRope(c["head_dim"], c["partial_rotary_factor"], c["rope_theta"],
                                c["max_position_embeddings"])
        self.init_weights(("o_proj.weight", "down_proj.weight", "out_proj.weight"))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        elif isinstance(m, GatedDeltaNet):
            # as flash-linear-attention / Mamba2: A ~ U(1, 16); dt ~ logU(1e-3, 1e-1), dt_bias = softplus^-1(dt),
            # so the initial per-step decay exp(-A dt) lies in about [0.2, 1): the state remembers.
            nn.init.kaiming_uniform_(m.conv1d.weight, a=math.sqrt(5))
            with torch.no_grad():
                m.A_log.copy_(torch.empty(m.nv).uniform_(1, 16).log())
                dt = torch.exp(torch.empty(m.nv).uniform_(math.log(1e-3), math.log(1e-1)))
                m.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))


# ----------------------------------------------------------------------------- export
def hf_config(c):
    text = {
        "model_type": "qwen3_5_text",
        "vocab_size": c["vocab_size"],
        "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "head_dim": c["head_dim"],
        "linear_num_key_heads": c["linear_num_key_heads"],
        "linear_num_value_heads": c["linear_num_value_heads"],
        "linear_key_head_dim": c["linear_key_head_dim"],
        "linear_value_head_dim": c["linear_value_head_dim"],
        "linear_conv_kernel_dim": c["linear_conv_kernel_dim"],
        "full_attention_interval": c["full_attention_interval"],  # mlx-lm reads this
        "layer_types": layer_types(c),  # transformers reads this
        "hidden_act": "silu",
        "max_position_embeddings": c["max_position_embeddings"],
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_parameters": {"rope_type": "default", "rope_theta": c["rope_theta"],
                            "partial_rotary_factor": c["partial_rotary_factor"]},
        "partial_rotary_factor": c["partial_rotary_factor"],
        "rope_theta": c["rope_theta"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": EOT_ID,
        "eos_token_id": EOT_ID,
        "pad_token_id": EOT_ID,
        "dtype": "bfloat16",
        "mtp_num_hidden_layers": c.get("mtp_num_hidden_layers", 0),
        "mtp_use_dedicated_embeddings": False,
        "mtp_norm_zero_centered": True,
        "mtp_hidden_input": "post_final_norm",
    }
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": True,
        "bos_token_id": EOT_ID,
        "eos_token_id": EOT_ID,
        "pad_token_id": EOT_ID,
        "torch_dtype": "bfloat16",
        "text_config": text,
    }


def is_zero_centred_norm(name):
    """Every RMSNorm weight except the GDN's gated norm (linear_attn.norm.weight, plain)."""
    return name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight", "model.norm.weight",
                          "mtp.norm.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight"))


def export_state(model):
    """State dict in HF names: bf16, except A_log and dt_bias in f32 (as docs/hybrid-format.md asks;
    8 floats per layer). Zero-centred norm weights are rounded so that 1 + w is a bf16 value."""
    sd = {}
    for k, v in model.state_dict().items():
        if k.startswith("rope."):
            continue
        v = v.detach().float().cpu()
        if k.endswith(("A_log", "dt_bias")):
            sd[k] = v.contiguous()
            continue
        if is_zero_centred_norm(k):
            v = (1.0 + v).to(torch.bfloat16).float() - 1.0  # exact in bf16 (fewer significant bits)
        sd[k] = v.to(torch.bfloat16).contiguous()
    return sd


def export(model, c, out, data, model_kind=None):
    import json
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    save_file(export_state(model), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config(c), f, indent=2)
    common.write_side_files(out, data, c["max_position_embeddings"])


CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
               "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
               "full_attention_interval", "max_position_embeddings", "rms_norm_eps")


def load_export(path, device):
    import json
    cfg = json.load(open(os.path.join(path, "config.json")))["text_config"]
    c = {k: cfg[k] for k in CONFIG_KEYS}
    c["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    c["partial_rotary_factor"] = cfg["rope_parameters"]["partial_rotary_factor"]
    c["mtp_num_hidden_layers"] = cfg.get("mtp_num_hidden_layers", 0)
    assert layer_types(c) == cfg["layer_types"], (layer_types(c), cfg["layer_types"])
    return common.load_weights(TinyQwen35(c), path, device), c


# ----------------------------------------------------------------------------- train
FAMILY = common.make_family(COMMON, CONFIGS, SMOKE, build=lambda c: TinyQwen35(c), opt=OPT, export=export,
                            load_export=load_export)


def main():
    common.main(__doc__, FAMILY, ["hybrid"], "hybrid")


if __name__ == "__main__":
    main()
