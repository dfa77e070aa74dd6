#!/usr/bin/env python3
"""Reference check for the Qwen3.5-MoE model (train_moe.py): the exported hub-layout folder computes
the same function in implementations no one here wrote.

Checks, all in float32 math on the stored weights:
  1. Last-position logits of each prompt of refcheck_prompts.json: train_moe.py's model (dense
     dispatch: every expert computed, unchosen ones weighted 0; chunked GDN; full recompute) vs
     transformers Qwen3_5MoeForConditionalGeneration (per-expert gather, from the hub layout as stored)
     vs transformers Qwen3_5MoeForCausalLM (the text-only class: its loader renames
     model.language_model.* to model.*) vs mlx-lm qwen3_5_moe (SwitchGLU gather_mm experts, split from
     the fused gate_up_proj by its sanitize): max |d logit| <= --logit-tol (2e-3).
  2. Greedy continuations of --max-tokens (32) tokens identical across the four: ours recomputes the
     sequence each step; transformers `generate` and mlx-lm `generate_step` decode token by token from
     their caches (conv + recurrent state on the GDN layers, KV cache on the attention layers).
  3. transformers' PreTrainedTokenizerFast encodes the prompts exactly like `tokenizers`;
     AutoModelForCausalLM resolves the folder to Qwen3_5MoeForCausalLM. Reported, not checked:
     AutoTokenizer (and so mlx-lm's load) picks Qwen3_5Tokenizer, which encodes text differently.
  4. train_moe.chain_drafts (the batched MTP draft chains behind metrics.json's mtp_chain_acceptance)
     equals a one-chain-at-a-time recomputation on prompt 0's continuation, every draft of every chain.
It also reports what no reference implements (mlx-lm drops mtp.*, transformers ignores it): the MTP
head's greedy acceptance per draft position along the greedy continuations, drafting a chain from its
own output as the runner does (train_moe.chain_acceptance), and the routers' expert shares on the prompts.

mlx-lm runs in a subprocess (xtask/train/ref_mlx.py) with --mlx-python (default /work/venvs/mlx/bin/python
when it exists, else this interpreter). Exit status 0 when every check passes, 1 otherwise.
  python3 xtask/train/ref_check_moe.py [--model models/tiny-moe-mtp] [--json-out FILE]
"""
import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import ref_check_hybrid as rch  # noqa: E402
import train_moe as tm  # noqa: E402


@torch.no_grad()
def run_hf(cls, path, prompts, n):
    """Last-position logits and n greedy tokens per prompt from transformers class `cls`."""
    model = cls.from_pretrained(path, dtype=torch.float32)
    model.eval()
    outs, lasts = [], []
    for ids in prompts:
        x = torch.tensor([ids])
        lasts.append(model(x).logits[0, -1])
        y = model.generate(x, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                           attention_mask=torch.ones_like(x))
        outs.append(y[0, len(ids):].tolist())
    return outs, lasts


@torch.no_grad()
def chain_on_continuations(model, prompts, continuations, depth):
    """train_moe's MTP chains along the prompts' greedy streams: the acceptance summed over the
    prompts, and how many drafts of prompt 0's chains differ from a one-chain-at-a-time recomputation
    (the MTP layer run on the explicit row sequence of each chain: teacher rows 0..i, then its drafts)."""
    pairs, drafts, streams = [], [], []
    for k, (ids, cont) in enumerate(zip(prompts, continuations)):
        st = torch.tensor([ids + cont])
        ps, ds = tm.chain_drafts(model, st, len(ids), depth)
        pairs += [(k, i) for _, i in ps]
        drafts.append(ds)
        streams.append(st[0])
    L = max(len(x) for x in streams)
    padded = torch.stack([torch.cat([x, x.new_zeros(L - len(x))]) for x in streams])
    r = tm.acceptance(pairs, torch.cat(drafts), padded)
    st = streams[0][None]
    h, _ = model.trunk(st)
    u0 = model.mtp_inputs(st[:, 1:], h[:, :-1])
    diff = 0
    for n, i in enumerate(tm.chain_starts(st.shape[1], len(prompts[0]), depth)):
        rows, d, n_prev = u0[:, :i + 1], None, model.mtp_block(u0[:, :i + 1])[0][:, -1]
        for p in range(depth):
            d = model.lm_head(n_prev).argmax(-1)
            diff += int(d.item() != int(drafts[0][n, p]))
            rows = torch.cat([rows, model.mtp_inputs(d[:, None], n_prev[:, None])], 1)
            n_prev = model.mtp_block(rows)[0][:, -1]
    r["recompute_checked_drafts"] = len(tm.chain_starts(st.shape[1], len(prompts[0]), depth)) * depth
    r["recompute_differing_drafts"] = diff
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny-moe-mtp"))
    ap.add_argument("--prompts", default=os.path.join(HERE, "refcheck_prompts.json"))
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--logit-tol", type=float, default=2e-3)
    ap.add_argument("--depth", type=int, default=4, help="draft positions for the MTP chain acceptance")
    default_mlx = "/work/venvs/mlx/bin/python"
    ap.add_argument("--mlx-python", default=default_mlx if os.path.exists(default_mlx) else sys.executable)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(0)
    import transformers
    from tokenizers import Tokenizer
    from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast,
                              Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration)

    path = os.path.abspath(args.model)
    name = os.path.basename(os.path.normpath(path))
    res = {"model": name, "torch": torch.__version__, "transformers": transformers.__version__,
           "logit_tol": args.logit_tol, "max_tokens": args.max_tokens}
    model, c = tm.load_export(path, "cpu")
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
    auto_cls = AutoModelForCausalLM._model_mapping[type(AutoConfig.from_pretrained(path))].__name__
    res.update({"auto_tokenizer_class": type(auto_tok).__name__, "auto_tokenizer_matches_tokenizers": auto_tok_ok,
                "tokenizer_fast_matches_tokenizers": tok_ok, "auto_class": auto_cls})

    impls = {"own": rch.run_own(model, prompts, args.max_tokens)[:2]}
    impls["hf_cg"] = run_hf(Qwen3_5MoeForConditionalGeneration, path, prompts, args.max_tokens)
    impls["hf_lm"] = run_hf(Qwen3_5MoeForCausalLM, path, prompts, args.max_tokens)
    mlx_out, mlx_last, mlx_ver, mlx_cls = rch.run_mlx(path, prompts, args.max_tokens, args.mlx_python)
    impls["mlx"] = (mlx_out, mlx_last)
    res.update({"hf_classes": ["Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"],
                "mlx_lm": mlx_ver, "mlx_class": mlx_cls})
    names = list(impls)
    per, ok_all = [], tok_ok and auto_cls == "Qwen3_5MoeForCausalLM"
    for i, p in enumerate(texts):
        outs = {k: impls[k][0][i] for k in names}
        lasts = {k: impls[k][1][i] for k in names}
        d = {f"{a}-{b}": (lasts[a] - lasts[b]).abs().max().item()
             for j, a in enumerate(names) for b in names[j + 1:]}
        same = all(outs[k] == outs["own"] for k in names)
        first = next((j for j in range(args.max_tokens) if len({outs[k][j] for k in names}) > 1), None)
        ok = same and max(d.values()) <= args.logit_tol
        ok_all &= ok
        per.append({"prompt_tail": p[-60:], "prompt_tokens": len(prompts[i]), "agree": same, "first_diff": first,
                    "max_abs_d_logits": d, "max_abs_logit": lasts["own"].abs().max().item(), **outs,
                    "text": hf_tok.decode(outs["own"])})
        print(f"  [{'OK ' if ok else 'FAIL'}] prompt {i} ({len(prompts[i])} tok): greedy {args.max_tokens} "
              f"{'identical' if same else 'DIFF@' + str(first)}; max|d logit| {max(d.values()):.1e} "
              f"-> {per[-1]['text'][:50]!r}")
    n_ok = sum(r["agree"] for r in per)
    chain = chain_on_continuations(model, prompts, impls["own"][0], args.depth)
    ok_all &= chain["recompute_differing_drafts"] == 0
    usage = tm.expert_usage(model, torch.tensor(sum(prompts, [])), 64, "cpu", 64 * 64)
    res.update({"prompts_agreeing": f"{n_ok}/{len(per)}",
                "max_abs_d_logits": max(max(r["max_abs_d_logits"].values()) for r in per),
                "mtp_chain_acceptance_on_continuations": chain,
                "expert_usage_on_prompts": {k: usage[k] for k in ("min_share_x_experts", "max_share_x_experts")},
                "per_prompt": per, "passed": bool(ok_all)})
    print(f"\n== {name}: {n_ok}/{len(per)} greedy continuations identical across train_moe.py / transformers "
          f"(ConditionalGeneration, CausalLM; Auto -> {auto_cls}) / mlx-lm {mlx_ver} ({mlx_cls}); "
          f"max|d logit| {res['max_abs_d_logits']:.2e} (tol {args.logit_tol:g}); tokenizer match {tok_ok}")
    print(f"MTP chain acceptance per draft position on these continuations ({chain['chains']} chains): "
          + ", ".join("-" if x is None else f"{x:.3f}" for x in chain["conditional_per_position"])
          + f"; mean accepted of {args.depth}: {chain['mean_accepted_of_depth']:.2f}; drafts differing from a "
          f"one-chain-at-a-time recomputation: {chain['recompute_differing_drafts']}/{chain['recompute_checked_drafts']}")
    if not auto_tok_ok:
        print(f"NOTE: AutoTokenizer gives {type(auto_tok).__name__}, which encodes text differently from "
              f"tokenizer.json (mlx-lm's load() uses it too): feed token ids or load PreTrainedTokenizerFast.")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({name: res}, f, indent=1)
    print("\nREF-CHECK " + ("PASSED" if ok_all else "FAILED"))
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
