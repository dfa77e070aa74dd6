#!/usr/bin/env python3
"""Reference check for the hybrid (Qwen3.5) model: the exported folder computes the same function in
implementations no one here wrote, and the training code's chunked Gated DeltaNet equals the
per-token recurrence.

Checks, all in float32 math on the stored weights:
  1. gdn_chunked (training form, chunk 64) vs gdn_recurrent (per-token, as mlx-lm/transformers decode)
     on random inputs (T = 1..200, T not a multiple of 64, grouped heads, non-zero initial state,
     strong and weak decay): max |d output| and max |d final state| <= --gdn-tol (1e-4).
     And the whole trunk of the exported model with either core: max |d logits| <= --gdn-tol.
  2. Last-position logits of each prompt: train_hybrid.py's model (chunked GDN, full recompute) vs
     transformers (Qwen3_5ForCausalLM, its torch chunked rule) vs mlx-lm (qwen3_5, its per-token ops
     recurrence): max |d logit| <= --logit-tol (2e-3).
  3. Greedy continuations of --max-tokens (32) tokens identical across the three: train_hybrid.py
     recomputes the whole sequence each step; transformers `generate` and mlx-lm `generate_step`
     decode one token at a time from their caches (conv state + recurrent state + KV cache).
  4. transformers' PreTrainedTokenizerFast encodes the prompts exactly like `tokenizers`, and
     AutoModelForCausalLM resolves the folder to Qwen3_5ForCausalLM. Reported, not checked: transformers'
     AutoTokenizer (and so mlx-lm's load) picks Qwen3_5Tokenizer for model_type qwen3_5, which replaces
     tokenizer.json's pre-tokenizer with Qwen3.5's regex and encodes text differently.
It also reports the MTP head's t+2 agreement with the greedy stream along the continuations
(no reference implements the head: mlx-lm drops mtp.*, transformers ignores it).

mlx-lm runs in a subprocess (xtask/train/ref_mlx.py) with --mlx-python (default /work/venvs/mlx/bin/python
when it exists, else this interpreter). Exit status 0 when every check passes, 1 otherwise.
  python3 xtask/train/ref_check_hybrid.py [--model models/tiny-hybrid-mtp] [--json-out FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import train_hybrid as th  # noqa: E402


def gdn_random_cases(tol):
    """(description, max |d o|, max |d S|) for gdn_chunked vs gdn_recurrent on random inputs."""
    g = torch.Generator().manual_seed(7)
    rows = []
    for B, T, Hk, Hv, Dk, Dv, decay_scale, with_state in [
        (2, 200, 2, 4, 64, 64, 1.0, True), (1, 64, 2, 2, 32, 32, 1.0, False), (2, 1, 1, 2, 16, 8, 1.0, True),
        (1, 130, 1, 3, 16, 24, 4.0, True), (3, 65, 2, 2, 64, 32, 0.1, False)]:
        q = th.l2norm(torch.randn(B, T, Hk, Dk, generator=g)) * Dk ** -0.5
        k = th.l2norm(torch.randn(B, T, Hk, Dk, generator=g))
        q, k = (x.repeat_interleave(Hv // Hk, dim=2) for x in (q, k))
        v = torch.randn(B, T, Hv, Dv, generator=g)
        logg = -torch.rand(Hv, generator=g) * 8 * torch.nn.functional.softplus(
            decay_scale * torch.randn(B, T, Hv, generator=g))
        beta = torch.sigmoid(torch.randn(B, T, Hv, generator=g))
        s0 = torch.randn(B, Hv, Dk, Dv, generator=g) if with_state else None
        o1, s1 = th.gdn_recurrent(q, k, v, logg, beta, s0)
        o2, s2 = th.gdn_chunked(q, k, v, logg, beta, s0)
        rows.append({"case": f"B{B} T{T} Hk{Hk} Hv{Hv} Dk{Dk} Dv{Dv} decay*{decay_scale} state={with_state}",
                     "max_abs_d_out": (o1 - o2).abs().max().item(), "max_abs_d_state": (s1 - s2).abs().max().item()})
    ok = all(r["max_abs_d_out"] <= tol and r["max_abs_d_state"] <= tol for r in rows)
    return rows, ok


def set_core(model, core):
    for layer in model.model.layers:
        if layer.kind == "linear_attention":
            layer.linear_attn.core = core


@torch.no_grad()
def run_own(model, prompts, n):
    outs, lasts, mtp_hits, mtp_total = [], [], 0, 0
    for ids in prompts:
        seq = list(ids)
        for i in range(n):
            logits, _ = model(torch.tensor([seq]))
            if i == 0:
                lasts.append(logits[0, -1])
            seq.append(int(logits[0, -1].argmax()))
        outs.append(seq[len(ids):])
        if model.mtp is not None:  # teacher-forced MTP drafts along the greedy stream
            logits, mlog = model(torch.tensor([seq[:-1]]), mtp_next=torch.tensor([seq[1:]]))
            gr, m = logits[0].argmax(-1), mlog[0].argmax(-1)
            s = len(ids) - 1
            mtp_hits += int((m[s:-1] == gr[s + 1:]).sum())
            mtp_total += int(m[s:-1].numel())
    return outs, lasts, (mtp_hits, mtp_total)


@torch.no_grad()
def run_hf(path, prompts, n):
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3_5ForCausalLM
    model = Qwen3_5ForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    auto_cls = AutoModelForCausalLM._model_mapping[type(AutoConfig.from_pretrained(path))].__name__
    outs, lasts = [], []
    for ids in prompts:
        x = torch.tensor([ids])
        lasts.append(model(x).logits[0, -1])
        y = model.generate(x, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                           attention_mask=torch.ones_like(x))
        outs.append(y[0, len(ids):].tolist())
    return outs, lasts, type(model).__name__, auto_cls


def run_mlx(path, prompts, n, python):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"prompts": prompts}, f)
    try:
        p = subprocess.run([python, os.path.join(HERE, "ref_mlx.py"), path, f.name, str(n)],
                           capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        sys.exit(f"mlx-lm subprocess failed ({python}):\n{p.stderr[-3000:]}")
    r = json.loads(p.stdout)
    return ([x["tokens"] for x in r["results"]], [torch.tensor(x["last_logits"]) for x in r["results"]],
            r["mlx_lm"], r["model_class"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-hybrid-mtp"))
    ap.add_argument("--prompts", default=os.path.join(HERE, "refcheck_prompts.json"))
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--logit-tol", type=float, default=2e-3)
    ap.add_argument("--gdn-tol", type=float, default=1e-4)
    default_mlx = "/work/venvs/mlx/bin/python"
    ap.add_argument("--mlx-python", default=default_mlx if os.path.exists(default_mlx) else sys.executable)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(0)
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = os.path.abspath(args.model)
    name = os.path.basename(os.path.normpath(path))
    res = {"model": name, "torch": torch.__version__, "transformers": transformers.__version__,
           "logit_tol": args.logit_tol, "gdn_tol": args.gdn_tol, "max_tokens": args.max_tokens}

    # 1. chunked vs per-token GDN
    rows, gdn_ok = gdn_random_cases(args.gdn_tol)
    model, _ = th.load_export(path, "cpu")
    model.eval()
    raw = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    hf_tok = PreTrainedTokenizerFast.from_pretrained(path)
    auto_tok = AutoTokenizer.from_pretrained(path)
    texts = json.load(open(args.prompts))["prompts"]
    prompts, tok_ok, auto_tok_ok = [], True, True
    for p in texts:
        a = raw.encode(p, add_special_tokens=False).ids
        tok_ok &= a == hf_tok(p, add_special_tokens=True)["input_ids"]
        auto_tok_ok &= a == auto_tok(p, add_special_tokens=True)["input_ids"]
        prompts.append([0] + a)  # documents start after <|endoftext|>, as in training
    res["auto_tokenizer_class"] = type(auto_tok).__name__
    res["auto_tokenizer_matches_tokenizers"] = auto_tok_ok
    if not auto_tok_ok:
        print(f"NOTE: AutoTokenizer gives {type(auto_tok).__name__} for model_type qwen3_5, which rebuilds the "
              f"pre-tokenizer with Qwen3.5's own regex (+NFC) and so encodes text differently from tokenizer.json; "
              f"mlx-lm's load() uses AutoTokenizer too. Feed token ids, or load PreTrainedTokenizerFast explicitly.")
    with torch.no_grad():
        x = torch.tensor([prompts[0]])
        set_core(model, th.gdn_recurrent)
        lr = model(x)[0]
        set_core(model, th.gdn_chunked)
        lc = model(x)[0]
    d_trunk = (lr - lc).abs().max().item()
    gdn_ok &= d_trunk <= args.gdn_tol
    res["gdn_random_cases"] = rows
    res["gdn_trunk_max_abs_d_logits"] = d_trunk
    print(f"GDN chunked vs per-token recurrence: random cases max|d out| "
          f"{max(r['max_abs_d_out'] for r in rows):.2e}, max|d state| {max(r['max_abs_d_state'] for r in rows):.2e}; "
          f"exported trunk on prompt 0 ({len(prompts[0])} tokens) max|d logits| {d_trunk:.2e} "
          f"(tol {args.gdn_tol:g}) -> {'OK' if gdn_ok else 'FAIL'}")

    # 2./3. logits and greedy continuations
    own_out, own_last, (mh, mt) = run_own(model, prompts, args.max_tokens)
    hf_out, hf_last, hf_cls, auto_cls = run_hf(path, prompts, args.max_tokens)
    mlx_out, mlx_last, mlx_ver, mlx_cls = run_mlx(path, prompts, args.max_tokens, args.mlx_python)
    res.update({"hf_class": hf_cls, "auto_class": auto_cls, "mlx_lm": mlx_ver, "mlx_class": mlx_cls,
                "tokenizer_fast_matches_tokenizers": tok_ok})
    per, ok_all = [], gdn_ok and tok_ok and auto_cls == "Qwen3_5ForCausalLM"
    for i, p in enumerate(texts):
        d_hf = (hf_last[i] - own_last[i]).abs().max().item()
        d_mlx = (mlx_last[i] - own_last[i]).abs().max().item()
        d_hm = (mlx_last[i] - hf_last[i]).abs().max().item()
        same = own_out[i] == hf_out[i] == mlx_out[i]
        first = next((j for j in range(args.max_tokens) if not (own_out[i][j] == hf_out[i][j] == mlx_out[i][j])), None)
        ok = same and max(d_hf, d_mlx, d_hm) <= args.logit_tol
        ok_all &= ok
        per.append({"prompt_tail": p[-60:], "prompt_tokens": len(prompts[i]), "agree": same, "first_diff": first,
                    "max_abs_d_logits_hf_own": d_hf, "max_abs_d_logits_mlx_own": d_mlx,
                    "max_abs_d_logits_mlx_hf": d_hm, "max_abs_logit": own_last[i].abs().max().item(),
                    "own": own_out[i], "hf": hf_out[i], "mlx": mlx_out[i], "text": hf_tok.decode(own_out[i])})
        print(f"  [{'OK ' if ok else 'FAIL'}] prompt {i} ({len(prompts[i])} tok): greedy {args.max_tokens} "
              f"{'identical' if same else 'DIFF@' + str(first)}; max|d logit| hf-own {d_hf:.1e} mlx-own {d_mlx:.1e} "
              f"mlx-hf {d_hm:.1e} -> {per[-1]['text'][:50]!r}")
    n_ok = sum(r["agree"] for r in per)
    res.update({"prompts_agreeing": f"{n_ok}/{len(per)}",
                "max_abs_d_logits": max(max(r["max_abs_d_logits_hf_own"], r["max_abs_d_logits_mlx_own"],
                                            r["max_abs_d_logits_mlx_hf"]) for r in per),
                "mtp_draft_agreement_on_continuations": (mh / mt if mt else None), "per_prompt": per,
                "passed": bool(ok_all)})
    print(f"\n== {name}: {n_ok}/{len(per)} greedy continuations identical across train_hybrid.py / transformers "
          f"({hf_cls}; Auto -> {auto_cls}) / mlx-lm {mlx_ver} ({mlx_cls}); max|d logit| {res['max_abs_d_logits']:.2e} "
          f"(tol {args.logit_tol:g}); tokenizer match {tok_ok}"
          + (f"; MTP t+2 agreement on these continuations {mh}/{mt} = {mh/mt:.3f}" if mt else ""))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({name: res}, f, indent=1)
    print("\nREF-CHECK " + ("PASSED" if ok_all else "FAILED"))
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
