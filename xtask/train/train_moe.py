#!/usr/bin/env python3
"""Train the project's tiny Qwen3.5-MoE model (PyTorch) and export it in the Hugging Face hub layout.

Model (--model moe, models/tiny-moe-mtp): the Qwen3.5 hybrid of train_hybrid.py (hidden 256, 6 layers,
Gated DeltaNet in 0,1,3,4 and gated full attention in 2,5, zero-centred norms, partial RoPE, vocab
8192, tied embeddings) with every MLP sparse, as `Qwen3_5MoeForConditionalGeneration` computes it:
  router   p = softmax(gate(x)) over 8 experts (fp32), top-2, weights renormalised (norm_topk_prob)
  experts  y = sum_top-k w_e * down_e(silu(gate_e(x)) * up_e(x)), moe_intermediate_size 64,
           stored fused as mlp.experts.gate_up_proj [E, 2I, H] (rows: gate then up) and
           mlp.experts.down_proj [E, H, I]
  shared   + sigmoid(shared_expert_gate(x)) * shared_expert(x), a SwiGLU of width 256
plus ONE MTP layer in the Qwen3.5 layout (mtp.fc, mtp.pre_fc_norm_{embedding,hidden}, mtp.norm,
mtp.layers.0 = a gated full-attention layer whose MLP is the same MoE block). Loss = CE(t+1) +
0.3 CE_mtp(t+2) + router_aux_loss_coef (0.01) x the load-balancing loss, averaged over the 7 MoE
blocks: E * sum_e f_e P_e with f_e the tokens sent to expert e per token (sums to top-k) and P_e the
mean router probability (transformers' load_balancing_loss_func; 2.0 when perfectly balanced).
About 7.5M parameters (active per token fewer: 2 of 8 experts). --smoke shrinks it to a toy.

Training computes every expert on every token and weights the unchosen ones by exactly 0 ("dense
dispatch"): two matmuls as wide as all experts together (8 x 64 = 512, the hybrid's dense MLP width),
the same function as a gather per expert, and static shapes for torch.compile.

Export (hub layout, what the Qwen3.5-MoE checkpoints on the hub hold): trunk tensors under
`model.language_model.*`, the MTP head under `mtp.*`, no lm_head (tied), no vision tower (config.json
carries a token vision_config so transformers' ConditionalGeneration class can be built; it reports
`model.visual.*` as missing and never uses them for text). bf16, except A_log/dt_bias in f32;
zero-centred norm weights rounded so that 1 + w is exact in bf16 (see train_hybrid.py).

metrics.json adds to the held-out figures: `expert_usage` (share of the top-k assignments per expert
and layer on held-out text) and `mtp_chain_acceptance` (greedy acceptance per draft position when the
MTP head drafts a chain from its own output, along greedy continuations of held-out prompts, as the
runner's MTP drafter does).

Data, steps (--steps N | auto with --time-budget), output files: as train.py (see its --help); the
training loop is common.run.

Examples:
  python3 xtask/train/train_moe.py --out /tmp/tiny-moe-mtp --steps auto --time-budget 300 --compile   # GPU
  python3 xtask/train/train_moe.py --out /tmp/smoke-moe --smoke --steps 20 --seq-len 128 --device cpu # CPU
  python3 xtask/train/train_moe.py --out models/tiny-moe-mtp --eval-only                              # re-measure
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import train_hybrid as th  # noqa: E402

MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
            "router_aux_loss_coef")
CONFIGS = {
    "moe": dict(hidden_size=256, num_hidden_layers=6, full_attention_interval=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
                linear_value_head_dim=64, linear_conv_kernel_dim=4,
                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                shared_expert_intermediate_size=256, router_aux_loss_coef=0.01,
                mtp_num_hidden_layers=1),
}
SMOKE = dict(th.SMOKE, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=64)
del SMOKE["intermediate_size"]
OPT = {"moe": (2e-3, 128)}
# Where the trunk lives in the hub layout; the training module calls it `model.`.
HUB_TRUNK = "model.language_model."
# A token vision tower: transformers builds one for *ForConditionalGeneration (the default would have
# ~400M parameters); the folder stores none of its weights.
VISION_CONFIG = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4,
                     temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=16,
                     num_position_embeddings=16, in_channels=3)


# ----------------------------------------------------------------------------- MoE block
class Experts(nn.Module):
    """E SwiGLU experts as the hub stores them: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I]."""

    def __init__(self, c):
        super().__init__()
        E, H, I = c["num_experts"], c["hidden_size"], c["moe_intermediate_size"]
        self.E, self.I = E, I
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, I))

    def forward(self, x, weights):
        """x [N, H], weights [N, E] (zero for unchosen experts) -> sum_e weights[:, e] * expert_e(x)."""
        N, H = x.shape
        gu = F.linear(x, self.gate_up_proj.reshape(self.E * 2 * self.I, H)).view(N, self.E, 2 * self.I)
        g, u = gu.chunk(2, dim=-1)
        a = F.silu(g) * u * weights.to(u.dtype)[..., None]  # [N, E, I]
        down = self.down_proj.permute(1, 0, 2).reshape(H, self.E * self.I)  # [H, E*I], expert-major columns
        return F.linear(a.reshape(N, self.E * self.I), down)


class SharedExpert(nn.Module):
    """The always-on SwiGLU expert (mlp.shared_expert.{gate,up,down}_proj)."""

    def __init__(self, H, I):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    """Qwen3.5-MoE sparse MLP: softmax top-k router (renormalised), routed experts, gated shared expert.

    forward returns (y, aux): aux = E * sum_e f_e P_e, the load-balancing loss of this block (unweighted).
    While `counts` is a tensor [E], forward adds the number of top-k assignments per expert to it."""

    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.E, self.k = c["num_experts"], c["num_experts_per_tok"]
        self.gate = nn.Linear(H, self.E, bias=False)
        self.experts = Experts(c)
        self.shared_expert = SharedExpert(H, c["shared_expert_intermediate_size"])
        self.shared_expert_gate = nn.Linear(H, 1, bias=False)
        self.counts = None

    def route(self, x):
        """x [N, H] -> (probs [N, E] fp32, chosen [N, k], weights [N, E]: renormalised top-k, 0 elsewhere)."""
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        top, chosen = probs.topk(self.k, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        return probs, chosen, torch.zeros_like(probs).scatter(1, chosen, top)

    def forward(self, x):
        B, T, H = x.shape
        xf = x.reshape(B * T, H)
        probs, chosen, weights = self.route(xf)
        y = self.experts(xf, weights)
        y = y + torch.sigmoid(self.shared_expert_gate(xf)) * self.shared_expert(xf)
        sent = F.one_hot(chosen, self.E).float().sum(1)  # [N, E]: 1 where chosen
        aux = self.E * (sent.mean(0) * probs.mean(0)).sum()
        if self.counts is not None:
            self.counts += sent.sum(0).to(self.counts.device)
        return y.view(B, T, H), aux


class MoeDecoderLayer(nn.Module):
    """A Qwen3.5 decoder layer (train_hybrid's mixers and norms) whose MLP is SparseMoe; returns (x, aux)."""

    def __init__(self, c, kind):
        super().__init__()
        self.kind = kind
        self.input_layernorm = th.ZCRMSNorm(c["hidden_size"], c["rms_norm_eps"])
        if kind == "linear_attention":
            self.linear_attn = th.GatedDeltaNet(c)
        else:
            self.self_attn = th.GatedAttention(c)
        self.post_attention_layernorm = th.ZCRMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = SparseMoe(c)

    def forward(self, x, rope):
        mixer = self.linear_attn if self.kind == "linear_attention" else self.self_attn
        x = x + mixer(self.input_layernorm(x), rope)
        y, aux = self.mlp(self.post_attention_layernorm(x))
        return x + y, aux


# ----------------------------------------------------------------------------- model
class TinyQwen35Moe(common.TiedMtpModel):
    """Trunk, tied LM head and MTP head as train_hybrid.py's model, with MoE MLPs and their aux loss."""

    has_aux_loss = True

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = common.Trunk(c, lambda: [MoeDecoderLayer(c, t) for t in th.layer_types(c)], th.ZCRMSNorm)
        self.mtp = (common.MTP(c, lambda: MoeDecoderLayer(c, "full_attention"), th.ZCRMSNorm)
                    if c.get("mtp_num_hidden_layers", 0) > 0 else None)
        self.rope = th.PartialRope(c["head_dim"], c["partial_rotary_factor"], c["rope_theta"],
                                   c["max_position_embeddings"])
        self.init_weights(("o_proj.weight", "down_proj.weight", "out_proj.weight", "experts.down_proj"))

    @staticmethod
    def _init(m):
        th.TinyQwen35._init(m)
        if isinstance(m, Experts):
            nn.init.normal_(m.gate_up_proj, std=0.02)
            nn.init.normal_(m.down_proj, std=0.02)  # rescaled with the other residual outputs

    def trunk(self, idx):
        """idx [B, T] -> (post-final-norm hidden [B, T, H], summed aux of the trunk's blocks)."""
        x = self.model.embed_tokens(idx)
        aux = 0.0
        for layer in self.model.layers:
            x, a = layer(x, self.rope)
            aux = aux + a
        return self.model.norm(x), aux

    def mtp_inputs(self, tokens, hidden):
        """The MTP layer's input rows: fc(cat[norm_e(embed(tokens)), norm_h(hidden)]) (embedding first)."""
        e = self.mtp.pre_fc_norm_embedding(self.model.embed_tokens(tokens))
        return self.mtp.fc(torch.cat([e, self.mtp.pre_fc_norm_hidden(hidden)], dim=-1))

    def mtp_block(self, u):
        """MTP rows [B, T, H] -> (mtp.norm of the layers' output, aux); causal over the rows, RoPE position = row."""
        aux = 0.0
        for layer in self.mtp.layers:
            u, a = layer(u, self.rope)
            aux = aux + a
        return self.mtp.norm(u), aux

    def forward(self, idx, mtp_next=None, with_aux=False):
        """As common.TiedMtpModel.forward; with_aux adds the weighted load-balancing loss (mean over blocks)."""
        h, aux = self.trunk(idx)
        logits = self.lm_head(h)
        mtp_logits = None
        blocks = len(self.model.layers)
        if self.mtp is not None and mtp_next is not None:
            n, a = self.mtp_block(self.mtp_inputs(mtp_next, h))
            mtp_logits = self.lm_head(n)
            aux, blocks = aux + a, blocks + len(self.mtp.layers)
        if not with_aux:
            return logits, mtp_logits
        return logits, mtp_logits, self.c["router_aux_loss_coef"] * aux / blocks


# ----------------------------------------------------------------------------- held-out extras
@torch.no_grad()
def expert_usage(model, tokens, T, device, max_tokens):
    """Share of the top-k assignments per expert, per MoE block, on held-out windows of T tokens."""
    blocks = [(f"layers.{i}", layer.mlp) for i, layer in enumerate(model.model.layers)]
    if model.mtp is not None:
        blocks += [(f"mtp.layers.{i}", layer.mlp) for i, layer in enumerate(model.mtp.layers)]
    for _, b in blocks:
        b.counts = torch.zeros(b.E, dtype=torch.float64)
    n = max(1, min((tokens.numel() - 1) // T, max_tokens // T))
    for s in range(0, n, 8):
        w = torch.stack([tokens[j * T:j * T + T + 1] for j in range(s, min(n, s + 8))]).to(device)
        model(w[:, :-1], mtp_next=w[:, 1:] if model.mtp is not None else None)
    per = {}
    for name, b in blocks:
        share = (b.counts / b.counts.sum()).tolist()
        b.counts = None
        per[name] = share
    E = len(next(iter(per.values())))
    flat = [x for v in per.values() for x in v]
    return {"tokens": n * T, "share_per_block": per,
            "min_share_x_experts": min(flat) * E, "max_share_x_experts": max(flat) * E,
            "note": "share of top-k assignments; 1/E each when balanced (min/max x E = 1)"}


@torch.no_grad()
def greedy_streams(model, prompts, n):
    """prompts [S, P] -> [S, P + n]: n greedy tokens appended by full recomputation (trunk only)."""
    seq = prompts
    for _ in range(n):
        logits = model(seq)[0][:, -1]
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq


def chain_starts(L, first, depth):
    """Chain starts i along a stream of L tokens whose tokens from `first` on are greedy: every compared
    token x_{i+2}..x_{i+1+depth} is greedy and inside the stream."""
    return range(max(0, first - 2), L - 1 - depth)


@torch.no_grad()
def chain_drafts(model, streams, first, depth, batch=256):
    """MTP draft chains along greedy streams [S, L]: ([(s, i)], drafts [chains, depth]).

    A chain starts after stream token x_{i+1} (i in chain_starts): the MTP head's rows 0..i hold
    (h_j, x_{j+1}) as prefill leaves them; draft 1 = argmax of row i; draft p sits at row i+p-1 with
    (mtp.norm output of draft p-1, draft p-1) as its input, attending rows 0..i+p-2 (the runner's MTP
    drafter, from its own cache). Every chain is drafted to full depth, accepted or not."""
    S, L = streams.shape
    h, _ = model.trunk(streams)
    u0 = model.mtp_inputs(streams[:, 1:], h[:, :-1])  # row j = (h_j, x_{j+1}), j = 0..L-2
    n0, _ = model.mtp_block(u0)
    pairs = [(s, i) for s in range(S) for i in chain_starts(L, first, depth)]
    drafts = []
    for c0 in range(0, len(pairs), batch):
        ps = pairs[c0:c0 + batch]
        b = torch.arange(len(ps), device=streams.device)
        si = torch.tensor([s for s, _ in ps], device=streams.device)
        ii = torch.tensor([i for _, i in ps], device=streams.device)
        U = u0[si].clone()  # [b, L-1, H]
        n_prev = n0[si, ii]  # [b, H]
        ds = []
        for p in range(1, depth + 1):
            ds.append(model.lm_head(n_prev).argmax(-1))
            if p == depth:
                break
            row = ii + p
            U[b, row] = model.mtp_inputs(ds[-1][:, None], n_prev[:, None])[:, 0]
            n_prev = model.mtp_block(U[:, :int(row.max()) + 1])[0][b, row]  # causal: later rows unseen
        drafts.append(torch.stack(ds, 1))
    return pairs, torch.cat(drafts).cpu()


def acceptance(pairs, drafts, streams):
    """Draft p of the chain at (s, i) is accepted iff it equals x_{i+1+p} and drafts 1..p-1 were.
    Returns chains, accepted-through counts, the conditional rate per position and the mean accepted."""
    streams = streams.cpu()
    depth = drafts.shape[1]
    want = torch.stack([streams[s, i + 2:i + 2 + depth] for s, i in pairs])
    ok = (drafts == want).long().cumprod(1)
    through = ok.sum(0).tolist()
    cond = [through[0] / len(pairs)] + [through[p] / through[p - 1] if through[p - 1] else None
                                         for p in range(1, depth)]
    return {"chains": len(pairs), "accepted_through": through, "conditional_per_position": cond,
            "mean_accepted_of_depth": sum(through) / len(pairs)}


def chain_acceptance(model, streams, first, depth):
    """Greedy acceptance per draft position of the MTP chains along greedy streams (chain_drafts)."""
    pairs, drafts = chain_drafts(model, streams, first, depth)
    return acceptance(pairs, drafts, streams)


def extra_eval(model, held, T, device, args):
    """expert_usage and mtp_chain_acceptance for metrics.json (fp32 on the exported weights)."""
    smoke = args.smoke or device == "cpu"
    out = {"expert_usage": expert_usage(model, held, T, device, (16 if smoke else 256) * T)}
    if model.mtp is not None:
        S, P, n, depth = (4, 32, 24, 3) if smoke else (64, 128, 128, 4)
        starts = torch.linspace(0, held.numel() - P - 1, S).long()
        prompts = torch.stack([held[s:s + P] for s in starts.tolist()]).to(device)
        streams = greedy_streams(model, prompts, n)
        r = chain_acceptance(model, streams, P, depth)
        r.update({"streams": S, "prompt_tokens": P, "greedy_tokens": n, "depth": depth})
        out["mtp_chain_acceptance"] = r
    print("extra " + json.dumps(out), flush=True)
    return out


# ----------------------------------------------------------------------------- export
def hf_config(c):
    """config.json of the hub form: Qwen3_5MoeForConditionalGeneration with a qwen3_5_moe_text text_config."""
    cfg = th.hf_config(dict(c, intermediate_size=None))
    text = cfg["text_config"]
    del text["intermediate_size"]  # Qwen3.5-MoE has none
    text["model_type"] = "qwen3_5_moe_text"
    text.update({k: c[k] for k in MOE_KEYS})
    text.update({"norm_topk_prob": True,  # mlx-lm reads it (default true); transformers always renormalises
                 "decoder_sparse_step": 1, "mlp_only_layers": [], "output_router_logits": False})
    cfg.update({"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
                "vision_config": dict(VISION_CONFIG, model_type="qwen3_5_moe_vision")})
    return cfg


def export_state(model):
    """train_hybrid's export (bf16, f32 A_log/dt_bias, bf16-exact zero-centred norms), trunk under the hub prefix."""
    return {(HUB_TRUNK + k[len("model."):] if k.startswith("model.") else k): v
            for k, v in th.export_state(model).items()}


def export(model, c, out, data, model_kind=None):
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    save_file(export_state(model), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config(c), f, indent=2)
    common.write_side_files(out, data, c["max_position_embeddings"])


CONFIG_KEYS = tuple(k for k in th.CONFIG_KEYS if k != "intermediate_size") + MOE_KEYS


def load_export(path, device):
    """The exported folder as a TinyQwen35Moe (f32) and its training config."""
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(path, "config.json")))["text_config"]
    c = {k: cfg[k] for k in CONFIG_KEYS}
    c["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    c["partial_rotary_factor"] = cfg["rope_parameters"]["partial_rotary_factor"]
    c["mtp_num_hidden_layers"] = cfg.get("mtp_num_hidden_layers", 0)
    assert th.layer_types(c) == cfg["layer_types"], (th.layer_types(c), cfg["layer_types"])
    model = TinyQwen35Moe(c)
    sd = {("model." + k[len(HUB_TRUNK):] if k.startswith(HUB_TRUNK) else k): v.float()
          for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.startswith("rope.")]
    assert not missing and not unexpected, (missing, unexpected)
    return model.to(device), c


# ----------------------------------------------------------------------------- train
FAMILY = common.make_family(th.COMMON, CONFIGS, SMOKE, build=lambda c: TinyQwen35Moe(c), opt=OPT, export=export,
                            load_export=load_export, extra_eval=extra_eval)


def main():
    common.main(__doc__, FAMILY, ["moe"], "moe")


if __name__ == "__main__":
    main()
