"""Shared by train.py (dense Qwen3 models) and train_hybrid.py (Qwen3.5 hybrid): token data, the
tokenizer/generation files of an exported folder, the model pieces both families build on (RMS
normalisation, rotary tables, grouped-query attention, trunk and MTP containers, the tied-head model
with its init and forward), held-out evaluation, the command-line flags of the training loop, and the
training loop itself.

A model family plugs in through a `Family`: its config for a --model name, a constructor, its export
and its loader. Models must implement `forward(idx, mtp_next=None) -> (logits, mtp_logits | None)` and
have an `mtp` attribute (None without an MTP head). A model with `has_aux_loss = True` (the MoE's
load-balancing loss) is called as `forward(idx, mtp_next, with_aux=True) -> (logits, mtp_logits, aux)`
while training, and `aux` (already weighted) is added to the loss.
"""
import contextlib
import json
import lzma
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from build_corpus import sha256_file  # stdlib only: build_corpus.py runs without torch

HERE = os.path.dirname(os.path.abspath(__file__))
EOT_ID, IM_START_ID, IM_END_ID = 0, 1, 2

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# ----------------------------------------------------------------------------- data
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


# ----------------------------------------------------------------------------- model pieces
def rms_normalise(x, eps):
    """x / sqrt(mean(x^2) + eps) over the last axis, in fp32 (the caller applies its weight)."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


class NormWeight(nn.Module):
    """An RMSNorm's state: `weight` [dim] (ones, or zeros when stored zero-centred) and `eps`."""

    def __init__(self, dim, eps, zero_centred=False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if zero_centred else torch.ones(dim))
        self.eps = eps


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryTables(nn.Module):
    """NeoX-style rotary cos/sin tables over `dim` dims for positions 0..max_pos-1 (not saved)."""

    def __init__(self, dim, theta, max_pos):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def rotate(self, x, T):  # x: [B, heads, T, dim]; positions 0..T-1
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        return x * cos + rotate_half(x) * sin


class AttentionProjections(nn.Module):
    """q/k/v/o projections (q_proj `q_mult` times wider: 2 carries an output gate per head) and
    per-head q/k norms made by `norm(dim, eps)`."""

    def __init__(self, c, norm, q_mult=1):
        super().__init__()
        H, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(H, nh * hd * q_mult, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = norm(hd, c["rms_norm_eps"])
        self.k_norm = norm(hd, c["rms_norm_eps"])

    def attend(self, q, k, v):
        """Causal grouped-query attention of q [B, nh, T, hd] over k, v [B, nkv, T, hd] -> [B, T, nh*hd]."""
        B, _, T, _ = q.shape
        v = v.to(q.dtype)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(B, T, self.nh * self.hd)


class Trunk(nn.Module):  # HF prefix "model."
    """Embedding, the decoder layers `layers()` returns (made after the embedding, so the RNG draws
    keep their order) and the final norm."""

    def __init__(self, c, layers, norm):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(layers())
        self.norm = norm(c["hidden_size"], c["rms_norm_eps"])


class MTP(nn.Module):  # HF prefix "mtp." (Qwen3.5 / Qwen3-Next layout)
    def __init__(self, c, layer, norm):
        super().__init__()
        H = c["hidden_size"]
        self.pre_fc_norm_embedding = norm(H, c["rms_norm_eps"])
        self.pre_fc_norm_hidden = norm(H, c["rms_norm_eps"])
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([layer() for _ in range(c["mtp_num_hidden_layers"])])
        self.norm = norm(H, c["rms_norm_eps"])


class TiedMtpModel(nn.Module):
    """A trunk with a tied LM head and an optional MTP head on (embed(t_{i+1}), h_i).

    Subclasses build `model` (a Trunk), `mtp` (an MTP or None) and `rope`, then call `init_weights`."""

    def init_weights(self, scaled_suffixes):
        """N(0, 0.02) through `_init`, then the residual outputs (names ending in `scaled_suffixes`) at
        0.02 / sqrt(2 * layers)."""
        c = self.c
        self.apply(self._init)
        scale = 0.02 / math.sqrt(2 * (c["num_hidden_layers"] + c.get("mtp_num_hidden_layers", 0)))
        for n, p in self.named_parameters():
            if n.endswith(scaled_suffixes):
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


# ----------------------------------------------------------------------------- export
def write_side_files(out, data, max_position_embeddings):
    """generation_config.json, tokenizer.json (copied from data) and tokenizer_config.json."""
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
            "model_max_length": max_position_embeddings,
            "chat_template": CHAT_TEMPLATE,
            "added_tokens_decoder": {
                str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": True}
                for i, s in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])},
        }, f, indent=2)


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
@dataclass
class Family:
    """What the training loop needs from a model family."""
    config: Callable  # (model_name, smoke: bool) -> config dict
    build: Callable  # (config) -> nn.Module
    opt: dict  # model_name -> (peak lr, batch in sequences)
    export: Callable  # (model, config, out, data, model_name) -> None
    load_export: Callable  # (path, device) -> (model, config)
    # (exported model, held-out tokens, seq_len, device, args) -> dict merged into metrics.json, or None
    extra_eval: Callable | None = None


def make_family(base, configs, smoke, build, opt, export, load_export, extra_eval=None):
    """A Family whose config for --model NAME is base + configs[NAME] (+ smoke with --smoke)."""
    def config(model_name, is_smoke):
        c = dict(base, **configs[model_name])
        if is_smoke:
            c.update(smoke)
        return c
    return Family(config=config, build=build, opt=opt, export=export, load_export=load_export,
                  extra_eval=extra_eval)


def load_weights(model, path, device):
    """Loads path/model.safetensors (upcast to f32) into model strictly (rope buffers aside); moves it to device."""
    from safetensors.torch import load_file
    sd = load_file(os.path.join(path, "model.safetensors"))
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if not k.startswith("rope.")]
    assert not missing and not unexpected, (missing, unexpected)
    return model.to(device)


def main(doc, fam: Family, models, default):
    """The command line shared by train.py and train_hybrid.py: --model (one of models) and add_train_args."""
    import argparse
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=models, default=default)
    add_train_args(ap)
    run(ap.parse_args(), fam)


def add_train_args(ap):
    """Every flag of the training loop except --model (whose choices depend on the family)."""
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
                    help="hard wall-clock limit (s from start) for the training loop; stops early and exports. "
                         "With --steps auto the schedule is also fitted into it after the warm-up")
    ap.add_argument("--eval-only", action="store_true", help="load --out and evaluate it on held-out data")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prepare-only", action="store_true",
                    help="only make train.bin/heldout.bin from the .txt.xz files (checked against manifest.json)")


def run(args, fam: Family):
    """Prepare data, then evaluate (--eval-only) or train, export to --out and evaluate the export."""
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
        def amp():
            return contextlib.nullcontext()

    ensure_bins(args.data)
    if args.prepare_only:
        return
    held = load_bin(os.path.join(args.data, "heldout.bin"))
    T = args.seq_len

    if args.eval_only:
        model, c = fam.load_export(args.out, device)
        r = evaluate(model, held, T, device, amp, args.eval_tokens)
        print(json.dumps(r, indent=1))
        return

    c = fam.config(args.model, args.smoke)
    lr, batch = fam.opt[args.model]
    lr = args.lr or lr
    batch = args.batch or (4 if args.smoke else batch)
    model = fam.build(c).to(device)
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

    aux_kw = {"with_aux": True} if getattr(model, "has_aux_loss", False) else {}

    def loss_fn(m, w):
        """(total loss, next-token CE, MTP CE or None, auxiliary loss or None)."""
        x, y = w[:, :-1], w[:, 1:]
        with amp():
            out = m(x, mtp_next=y if model.mtp is not None else None, **aux_kw)
            logits, mlog = out[0], out[1]
            aux = out[2] if aux_kw else None
            l1 = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
            loss = l1 if aux is None else l1 + aux
            if mlog is None:
                return loss, l1, None, aux
            l2 = F.cross_entropy(mlog[:, :-1].float().reshape(-1, mlog.size(-1)), y[:, 1:].reshape(-1))
            return loss + args.mtp_weight * l2, l1, l2, aux

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
            loss = loss_fn(fwd, get_batch(calib_gen))[0]
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
        budget = args.time_budget
        if args.deadline:  # a slow compile shortens the schedule instead of cutting its cosine tail
            budget = min(budget, args.deadline - (time.time() - t_start) - 5.0)
        steps = int(budget / (per_pass * 1.04))  # ~4% for optimizer step + evals
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
        loss, l1, l2, aux = loss_fn(fwd, get_batch(gen))
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        done = s + 1
        if s % 25 == 0 or s == steps - 1:
            rec = {"step": s, "lr": lr_at(s), "loss": loss.item(), "ce": l1.item(),
                   "mtp_ce": (l2.item() if l2 is not None else None), "gnorm": gnorm.item(),
                   **({"aux": aux.item()} if aux is not None else {}),
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
    fam.export(model, c, args.out, args.data, args.model)

    # Final evaluation on the exported (bf16-rounded) weights, in fp32 math.
    ev, _ = fam.load_export(args.out, device)
    t0 = time.time()
    r = evaluate(ev, held, T, device, contextlib.nullcontext, args.eval_tokens)
    print("final " + json.dumps(r), flush=True)
    extra = fam.extra_eval(ev, held, T, device, args) if fam.extra_eval else {}
    metrics = {
        "model": args.model, "config": c, "params": n_params, "mtp_params": n_mtp,
        "steps": done, "planned_steps": steps, "batch": batch, "seq_len": T,
        "tokens_seen": done * batch * T, "train_tokens": int(N), "lr": lr, "min_lr_frac": args.min_lr_frac,
        "warmup": warmup, "weight_decay": args.weight_decay, "mtp_weight": args.mtp_weight,
        "optimizer": "AdamW(betas=(0.9,0.95), eps=1e-8), grad clip 1.0, cosine to min_lr_frac",
        "seed": args.seed, "compile": fwd is not model, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "precision": "bf16 autocast" if device == "cuda" else "fp32",
        "compile_warmup_s": warm_s, "train_wall_s": train_s, "eval_s": time.time() - t0,
        "final_train": last, "heldout": r, **extra,
        "command": " ".join(sys.argv),
    }
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print(f"total wall {time.time()-t_start:.1f}s", flush=True)
