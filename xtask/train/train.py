#!/usr/bin/env python3
"""Train one of the project's tiny models (PyTorch) and export it as a Hugging Face folder.

Models (--model):
  target  models/tiny-mtp:   Qwen3 (hidden 512, 6 layers, 8 q / 4 kv heads, head_dim 64,
                             SwiGLU 1536, vocab 8192, tied embeddings) + ONE MTP layer in the
                             Qwen3.5 / Qwen3-Next layout (mtp.*). Loss = CE(t+1) + 0.3 * CE_mtp(t+2).
  draft   models/tiny-draft: Qwen3 (hidden 256, 2 layers, 4 q / 2 kv heads, SwiGLU 768), no MTP.
  --smoke shrinks either to a toy size for a CPU smoke test (a few steps).

Data (--data, default xtask/train/data, made by build_corpus.py): train.bin / heldout.bin
(uint16 token streams) and tokenizer.json. If the .bin files are missing but train.txt.xz,
heldout.txt.xz and tokenizer.json are there (what is sent to the GPU machine), they are
tokenized first and checked against manifest.json's sha256.

Steps: --steps N trains exactly N optimizer steps (cosine schedule over N). --steps auto
times a few forward/backward passes first (no weight update) and picks N so that training
takes about --time-budget seconds; the N used is printed and written to metrics.json, so
`--steps N` reproduces the run.

Output (--out DIR): config.json, model.safetensors (bf16, HF names, no lm_head since the
embedding is tied), tokenizer.json, tokenizer_config.json, generation_config.json,
metrics.json, train_log.jsonl. MODEL_CARD.md is written by write_model_card.py.

Examples:
  python3 xtask/train/train.py --model target --out /tmp/tiny-mtp  --steps auto --time-budget 330 --compile
  python3 xtask/train/train.py --model draft  --out /tmp/tiny-draft --steps auto --time-budget 240 --compile
  python3 xtask/train/train.py --model target --out /tmp/smoke --smoke --steps 20     # CPU smoke test
  python3 xtask/train/train.py --model target --out models/tiny-mtp --eval-only       # re-measure a checkpoint
"""
import argparse
import hashlib
import json
import lzma
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
EOT_ID, IM_START_ID, IM_END_ID = 0, 1, 2

CONFIGS = {
    "target": dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
                   head_dim=64, intermediate_size=1536, mtp_num_hidden_layers=1),
    "draft": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=64, intermediate_size=768, mtp_num_hidden_layers=0),
}
SMOKE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, intermediate_size=128)
COMMON = dict(vocab_size=8192, rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=2048)
# optimisation defaults per model: (peak lr, batch size in sequences)
OPT = {"target": (2e-3, 128), "draft": (3e-3, 128)}

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# ----------------------------------------------------------------------------- model
class RMSNorm(nn.Module):
    """Qwen3RMSNorm: w * (x / sqrt(mean(x^2) + eps)), computed in fp32, plain weight (not zero-centred)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dt)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rope(nn.Module):
    def __init__(self, head_dim, theta, max_pos):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        t = torch.arange(max_pos, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, q, k, T):  # q,k: [B, heads, T, hd]; positions 0..T-1
        cos = self.cos[:T].to(q.dtype)
        sin = self.sin[:T].to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, c["rms_norm_eps"])

    def forward(self, x, rope):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = rope(q, k, T)
        v = v.to(q.dtype)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, rope):
        x = x + self.self_attn(self.input_layernorm(x), rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class Trunk(nn.Module):  # HF prefix "model."
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class MTP(nn.Module):  # HF prefix "mtp." (Qwen3.5 / Qwen3-Next layout)
    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.pre_fc_norm_embedding = RMSNorm(H, c["rms_norm_eps"])
        self.pre_fc_norm_hidden = RMSNorm(H, c["rms_norm_eps"])
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c["mtp_num_hidden_layers"])])
        self.norm = RMSNorm(H, c["rms_norm_eps"])


class TinyQwen3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Trunk(c)
        self.mtp = MTP(c) if c.get("mtp_num_hidden_layers", 0) > 0 else None
        self.rope = Rope(c["head_dim"], c["rope_theta"], c["max_position_embeddings"])
        self.apply(self._init)
        scale = 0.02 / math.sqrt(2 * (c["num_hidden_layers"] + c.get("mtp_num_hidden_layers", 0)))
        for n, p in self.named_parameters():
            if n.endswith("o_proj.weight") or n.endswith("down_proj.weight"):
                nn.init.normal_(p, std=scale)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def lm_head(self, h):
        return F.linear(h, self.model.embed_tokens.weight)

    def forward(self, idx, mtp_next=None):
        """idx [B,T] -> (trunk logits [B,T,V], MTP logits [B,T,V] or None).

        mtp_next [B,T]: token t_{i+1} for each position i (the next input token)."""
        T = idx.shape[1]
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, self.rope)
        h = self.model.norm(x)  # post-final-norm hidden: what the MTP head consumes
        logits = self.lm_head(h)
        mtp_logits = None
        if self.mtp is not None and mtp_next is not None:
            e = self.mtp.pre_fc_norm_embedding(self.model.embed_tokens(mtp_next))
            g = self.mtp.pre_fc_norm_hidden(h)
            u = self.mtp.fc(torch.cat([e, g], dim=-1))  # embedding first
            for layer in self.mtp.layers:
                u = layer(u, self.rope)  # causal over MTP positions, RoPE position i
            mtp_logits = self.lm_head(self.mtp.norm(u))
        return logits, mtp_logits


# ----------------------------------------------------------------------------- data
def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_bins(data):
    if os.path.exists(os.path.join(data, "train.bin")) and os.path.exists(os.path.join(data, "heldout.bin")):
        return
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(data, "tokenizer.json"))
    manifest = json.load(open(os.path.join(data, "manifest.json")))
    for split in ("train", "heldout"):
        t0 = time.time()
        with lzma.open(os.path.join(data, f"{split}.txt.xz"), "rb") as f:
            docs = f.read().decode("utf-8").split("<|endoftext|>")
        ids = []
        for i in range(0, len(docs), 2048):
            for enc in tok.encode_batch(docs[i:i + 2048], add_special_tokens=False):
                ids.extend(enc.ids)
                ids.append(EOT_ID)
        path = os.path.join(data, f"{split}.bin")
        np.asarray(ids, dtype="<u2").tofile(path)
        want = manifest["outputs"][f"{split}.bin"]["sha256"]
        got = sha256_file(path)
        print(f"tokenized {split}: {len(ids)} tokens in {time.time()-t0:.1f}s; sha256 "
              f"{'matches manifest' if got == want else 'MISMATCH ' + got}", flush=True)
        if got != want:
            sys.exit("token stream differs from the one built locally")


def load_bin(path):
    return torch.from_numpy(np.fromfile(path, dtype="<u2").astype(np.int64))


# ----------------------------------------------------------------------------- export
def hf_config(c, model_kind):
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": c["vocab_size"],
        "hidden_size": c["hidden_size"],
        "intermediate_size": c["intermediate_size"],
        "num_hidden_layers": c["num_hidden_layers"],
        "num_attention_heads": c["num_attention_heads"],
        "num_key_value_heads": c["num_key_value_heads"],
        "head_dim": c["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": c["max_position_embeddings"],
        "rms_norm_eps": c["rms_norm_eps"],
        "rope_theta": c["rope_theta"],
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": c["num_hidden_layers"],
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": EOT_ID,
        "eos_token_id": EOT_ID,
        "pad_token_id": EOT_ID,
        "torch_dtype": "bfloat16",
    }
    if c.get("mtp_num_hidden_layers", 0) > 0:
        cfg["mtp_num_hidden_layers"] = c["mtp_num_hidden_layers"]
        cfg["mtp_use_dedicated_embeddings"] = False
        cfg["mtp_norm_zero_centered"] = False
        cfg["mtp_hidden_input"] = "post_final_norm"
    return cfg


def export(model, c, out, data, model_kind):
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    sd = {k: v.detach().to("cpu", torch.bfloat16).contiguous() for k, v in model.state_dict().items()
          if not k.startswith("rope.")}
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(hf_config(c, model_kind), f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": EOT_ID, "eos_token_id": EOT_ID, "pad_token_id": EOT_ID,
                   "do_sample": False, "max_new_tokens": 256}, f, indent=2)
    shutil.copy(os.path.join(data, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
            "unk_token": None,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "add_bos_token": False, "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": c["max_position_embeddings"],
            "chat_template": CHAT_TEMPLATE,
            "added_tokens_decoder": {
                str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": True}
                for i, s in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])},
        }, f, indent=2)


def load_export(path, device):
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(path, "config.json")))
    c = {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                             "num_attention_heads", "num_key_value_heads", "head_dim",
                             "max_position_embeddings", "rms_norm_eps", "rope_theta")}
    c["mtp_num_hidden_layers"] = cfg.get("mtp_num_hidden_layers", 0)
    m = TinyQwen3(c)
    sd = load_file(os.path.join(path, "model.safetensors"))
    missing, unexpected = m.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if not k.startswith("rope.")]
    assert not missing and not unexpected, (missing, unexpected)
    return m.to(device), c


# ----------------------------------------------------------------------------- eval
@torch.no_grad()
def evaluate(model, tokens, T, device, amp, max_tokens=None, batch=16):
    """Non-overlapping windows of T+1 tokens over the held-out stream (each window starts fresh).

    Returns next-token loss/ppl and, with MTP: MTP CE vs t+2, MTP top-1 accuracy vs the true t+2,
    and the MTP/greedy agreement: argmax MTP logits at i == argmax trunk logits at i+1."""
    model.eval()
    n = (tokens.numel() - 1) // T
    if max_tokens:
        n = min(n, max(1, max_tokens // T))
    tot = dict(nll=0.0, cnt=0, mtp_nll=0.0, mtp_acc=0, agree=0, mcnt=0, acc=0)
    for s in range(0, n, batch):
        rows = [tokens[(s + j) * T:(s + j) * T + T + 1] for j in range(min(batch, n - s))]
        w = torch.stack(rows).to(device)
        x, y = w[:, :-1], w[:, 1:]
        with amp():
            logits, mlog = model(x, mtp_next=y if model.mtp is not None else None)
        logits = logits.float()
        tot["nll"] += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum").item()
        tot["cnt"] += y.numel()
        greedy = logits.argmax(-1)
        tot["acc"] += (greedy == y).sum().item()
        if mlog is not None:
            mlog = mlog[:, :-1].float()  # position i predicts t_{i+2} = y[:, i+1]
            y2 = y[:, 1:]
            tot["mtp_nll"] += F.cross_entropy(mlog.reshape(-1, mlog.size(-1)), y2.reshape(-1), reduction="sum").item()
            mp = mlog.argmax(-1)
            tot["mtp_acc"] += (mp == y2).sum().item()
            tot["agree"] += (mp == greedy[:, 1:]).sum().item()
            tot["mcnt"] += y2.numel()
    model.train()
    r = {"heldout_tokens": tot["cnt"], "heldout_loss": tot["nll"] / tot["cnt"],
         "heldout_top1_acc": tot["acc"] / tot["cnt"]}
    r["heldout_ppl"] = math.exp(r["heldout_loss"])
    if tot["mcnt"]:
        r["mtp_heldout_loss"] = tot["mtp_nll"] / tot["mcnt"]
        r["mtp_top1_acc_vs_true_t2"] = tot["mtp_acc"] / tot["mcnt"]
        r["mtp_agreement_vs_greedy_t2"] = tot["agree"] / tot["mcnt"]
    return r


# ----------------------------------------------------------------------------- train
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["target", "draft"], default="target")
    ap.add_argument("--data", default=os.path.join(HERE, "data"))
    ap.add_argument("--out", default=None, help="output Hugging Face folder (required unless --prepare-only)")
    ap.add_argument("--steps", default="auto", help="number of optimizer steps, or 'auto' (see --time-budget)")
    ap.add_argument("--time-budget", type=float, default=300.0, help="seconds of training for --steps auto")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default per model)")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (default per model)")
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 5%% of steps, min 10)")
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (falls back to eager on error)")
    ap.add_argument("--smoke", action="store_true", help="toy-size model for a CPU smoke test")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--eval-tokens", type=int, default=None, help="cap held-out tokens in the final eval")
    ap.add_argument("--deadline", type=float, default=None,
                    help="hard wall-clock limit (s from start) for the training loop; stops early and exports")
    ap.add_argument("--eval-only", action="store_true", help="load --out and evaluate it on held-out data")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prepare-only", action="store_true",
                    help="only make train.bin/heldout.bin from the .txt.xz files (checked against manifest.json)")
    args = ap.parse_args()
    t_start = time.time()

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

        def amp():
            return torch.autocast("cuda", dtype=torch.bfloat16)
    else:
        import contextlib

        def amp():
            return contextlib.nullcontext()

    ensure_bins(args.data)
    if args.prepare_only:
        return
    held = load_bin(os.path.join(args.data, "heldout.bin"))
    T = args.seq_len

    if args.eval_only:
        model, c = load_export(args.out, device)
        r = evaluate(model, held, T, device, amp, args.eval_tokens)
        print(json.dumps(r, indent=1))
        return

    c = dict(COMMON, **CONFIGS[args.model])
    if args.smoke:
        c.update(SMOKE)
    lr, batch = OPT[args.model]
    lr = args.lr or lr
    batch = args.batch or (4 if args.smoke else batch)
    model = TinyQwen3(c).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    n_mtp = sum(p.numel() for n, p in model.named_parameters() if n.startswith("mtp."))
    print(f"[{args.model}] device={device} params={n_params:,} (mtp {n_mtp:,}) config={c}", flush=True)

    train = load_bin(os.path.join(args.data, "train.bin")).to(device)
    N = train.numel()
    print(f"train tokens {N:,}, heldout tokens {held.numel():,}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=(device == "cuda"))

    fwd = model
    if args.compile:
        fwd = torch.compile(model)

    def loss_fn(m, w):
        x, y = w[:, :-1], w[:, 1:]
        with amp():
            logits, mlog = m(x, mtp_next=y if model.mtp is not None else None)
            l1 = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
            if mlog is None:
                return l1, l1, None
            l2 = F.cross_entropy(mlog[:, :-1].float().reshape(-1, mlog.size(-1)), y[:, 1:].reshape(-1))
            return l1 + args.mtp_weight * l2, l1, l2

    gen = torch.Generator(device=device)
    offs = torch.arange(T + 1, device=device)

    def get_batch(g):
        starts = torch.randint(0, N - T - 1, (batch,), device=device, generator=g)
        return train[starts[:, None] + offs[None, :]]

    # ---- calibration / compile warm-up (no weight update; separate RNG stream)
    calib_gen = torch.Generator(device=device)
    calib_gen.manual_seed(args.seed + 1)

    def timed_passes(k):
        for _ in range(k):
            loss, _, _ = loss_fn(fwd, get_batch(calib_gen))
            loss.backward()
        model.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    t0 = time.time()
    try:
        timed_passes(2)
    except Exception as e:  # torch.compile trouble: fall back to eager
        if fwd is model:
            raise
        print(f"torch.compile failed ({type(e).__name__}: {str(e)[:300]}); falling back to eager", flush=True)
        fwd = model
        timed_passes(2)
    warm_s = time.time() - t0
    k = 3 if args.smoke else 8
    t0 = time.time()
    timed_passes(k)
    per_pass = (time.time() - t0) / k
    if args.steps == "auto":
        steps = int(args.time_budget / (per_pass * 1.04))  # ~4% for optimizer step + evals
        steps = max(10, (steps // 50) * 50 if steps >= 100 else steps)
    else:
        steps = int(args.steps)
    warmup = args.warmup if args.warmup is not None else max(10, steps // 20)
    print(f"warm-up/compile {warm_s:.1f}s, {per_pass*1000:.1f} ms per fwd+bwd "
          f"({batch*T/per_pass/1e3:.0f}k tok/s) -> steps={steps} warmup={warmup} "
          f"batch={batch}x{T} lr={lr}", flush=True)

    def lr_at(s):
        if s < warmup:
            return lr * (s + 1) / warmup
        p = (s - warmup) / max(1, steps - warmup)
        return lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))

    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "train_log.jsonl"), "w")
    gen.manual_seed(args.seed)
    t_train = time.time()
    ema = None
    last = {}
    done = 0
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(s)
        loss, l1, l2 = loss_fn(fwd, get_batch(gen))
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = s + 1
        if s % 25 == 0 or s == steps - 1:
            rec = {"step": s, "lr": lr_at(s), "loss": loss.item(), "ce": l1.item(),
                   "mtp_ce": (l2.item() if l2 is not None else None), "gnorm": gnorm.item(),
                   "elapsed": time.time() - t_train}
            last = rec
            ema = rec["ce"] if ema is None else 0.9 * ema + 0.1 * rec["ce"]
            if s % 100 == 0 or s == steps - 1:
                print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
        if args.eval_every and s > 0 and s % args.eval_every == 0:
            r = evaluate(model, held, T, device, amp, max_tokens=64 * T)
            r["step"] = s
            print("eval " + json.dumps(r), flush=True)
            log.write(json.dumps({"eval": r}) + "\n")
        if args.deadline and time.time() - t_start > args.deadline:
            print(f"deadline reached at step {done}/{steps}; stopping early", flush=True)
            break
    if device == "cuda":
        torch.cuda.synchronize()
    train_s = time.time() - t_train
    print(f"trained {done} steps in {train_s:.1f}s", flush=True)
    export(model, c, args.out, args.data, args.model)

    # Final evaluation on the exported (bf16-rounded) weights, in fp32 math.
    ev, _ = load_export(args.out, device)
    t0 = time.time()
    import contextlib
    r = evaluate(ev, held, T, device, contextlib.nullcontext, args.eval_tokens)
    print("final " + json.dumps(r), flush=True)
    metrics = {
        "model": args.model, "config": c, "params": n_params, "mtp_params": n_mtp,
        "steps": done, "planned_steps": steps, "batch": batch, "seq_len": T,
        "tokens_seen": done * batch * T, "train_tokens": int(N), "lr": lr, "min_lr_frac": args.min_lr_frac,
        "warmup": warmup, "weight_decay": args.weight_decay, "mtp_weight": args.mtp_weight,
        "optimizer": "AdamW(betas=(0.9,0.95), eps=1e-8), grad clip 1.0, cosine to min_lr_frac",
        "seed": args.seed, "compile": fwd is not model, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "precision": "bf16 autocast" if device == "cuda" else "fp32",
        "compile_warmup_s": warm_s, "train_wall_s": train_s, "eval_s": time.time() - t0,
        "final_train": last, "heldout": r,
        "command": " ".join(sys.argv),
    }
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print(f"total wall {time.time()-t_start:.1f}s", flush=True)


if __name__ == "__main__":
    main()
