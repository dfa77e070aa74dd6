#!/usr/bin/env python3
"""Reference check: the shipped checkpoints load and generate in implementations no one here wrote.

For each model folder (default models/tiny-mtp and models/tiny-draft) and each held-out prompt in
xtask/train/refcheck_prompts.json, generate 32 greedy tokens with
  * mlx-lm        (mlx_lm.load + generate_step, argmax; `mtp.*` tensors are stripped into a temp
                   copy first because mlx-lm's qwen3 loader loads strictly),
  * transformers  (AutoModelForCausalLM / Qwen3ForCausalLM + AutoTokenizer, model.generate greedy),
  * train.py      (this project's own PyTorch model, full recompute, no KV cache),
all in float32 math on the stored bf16 weights, and check that the token streams agree.
It also checks that transformers' tokenizer (PreTrainedTokenizerFast from tokenizer_config.json)
encodes the prompts exactly like `tokenizers`, and prints the max |logit| difference between
transformers and train.py on the prompt. For tiny-mtp it reports how often the MTP head's t+2
draft matches the greedy stream on these continuations.

Exit status 0 when every model/prompt agrees across all three, 1 otherwise.
Needs (one venv): torch, transformers, safetensors, tokenizers, "mlx-lm[cpu]" (or mlx-lm on macOS).
  python3 xtask/train/ref_check.py [--models models/tiny-mtp models/tiny-draft] [--max-tokens 32]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def strip_mtp_copy(src):
    import mlx.core as mx
    dst = tempfile.mkdtemp(prefix="refcheck_mlx_")
    for fn in os.listdir(src):
        if fn != "model.safetensors" and os.path.isfile(os.path.join(src, fn)):
            shutil.copy(os.path.join(src, fn), dst)
    w = mx.load(os.path.join(src, "model.safetensors"))
    kept = {k: v for k, v in w.items() if not k.startswith("mtp.")}
    mx.save_safetensors(os.path.join(dst, "model.safetensors"), kept, metadata={"format": "mlx"})
    return dst, len(w) - len(kept)


def gen_mlx(path, prompts, n):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    tmp, dropped = strip_mtp_copy(path)
    model, _ = load(tmp)
    model.set_dtype(mx.float32)
    outs = []
    for ids in prompts:
        toks = []
        for tok, _ in generate_step(mx.array(ids), model, max_tokens=n):
            toks.append(int(tok))
        outs.append(toks)
    shutil.rmtree(tmp)
    return outs, dropped


def gen_hf(path, prompts, n):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(x, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                               attention_mask=torch.ones_like(x))
            outs.append(y[0, len(ids):].tolist())
    return outs, model, type(model).__name__


def gen_own(path, prompts, n):
    import torch
    sys.path.insert(0, HERE)
    from train import load_export
    model, c = load_export(path, "cpu")
    model.eval()
    outs, mtp_hits, mtp_total = [], 0, 0
    with torch.no_grad():
        for ids in prompts:
            seq = list(ids)
            for _ in range(n):
                logits, _ = model(torch.tensor([seq]))
                seq.append(int(logits[0, -1].argmax()))
            cont = seq[len(ids):]
            outs.append(cont)
            if model.mtp is not None:  # teacher-forced MTP drafts along the greedy stream
                x = torch.tensor([seq[:-1]])
                logits, mlog = model(x, mtp_next=torch.tensor([seq[1:]]))
                g = logits[0].argmax(-1)
                m = mlog[0].argmax(-1)
                s = len(ids) - 1  # from the last prompt position on
                mtp_hits += int((m[s:-1] == g[s + 1:]).sum())
                mtp_total += int(m[s:-1].numel())
    return outs, model, (mtp_hits, mtp_total)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=[os.path.join(ROOT, "models", "tiny-mtp"),
                                                    os.path.join(ROOT, "models", "tiny-draft")])
    ap.add_argument("--prompts", default=os.path.join(HERE, "refcheck_prompts.json"))
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json-out", default=None, help="also write the results here")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch
    import mlx_lm
    import transformers
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    prompts_text = json.load(open(args.prompts))["prompts"]
    print(f"mlx-lm {mlx_lm.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
    results, ok_all = {}, True
    for path in args.models:
        name = os.path.basename(os.path.normpath(path))
        raw = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        hf_tok = AutoTokenizer.from_pretrained(path)
        prompts = []
        tok_ok = True
        for p in prompts_text:
            a = raw.encode(p, add_special_tokens=False).ids
            b = hf_tok(p, add_special_tokens=True)["input_ids"]
            tok_ok &= (a == b)
            prompts.append([0] + a)  # documents start after <|endoftext|>, as in training
        mlx_out, dropped = gen_mlx(path, prompts, args.max_tokens)
        hf_out, hf_model, hf_cls = gen_hf(path, prompts, args.max_tokens)
        own_out, own_model, (mh, mt) = gen_own(path, prompts, args.max_tokens)
        with torch.no_grad():
            x = torch.tensor([prompts[0]])
            d = (hf_model(x).logits[0] - own_model(x)[0][0]).abs().max().item()
        per = []
        for i, p in enumerate(prompts_text):
            agree = mlx_out[i] == hf_out[i] == own_out[i]
            first_diff = next((j for j in range(args.max_tokens)
                               if not (mlx_out[i][j] == hf_out[i][j] == own_out[i][j])), None)
            per.append({"prompt_tail": p[-60:], "agree": agree, "first_diff": first_diff,
                        "mlx": mlx_out[i], "hf": hf_out[i], "own": own_out[i],
                        "text": hf_tok.decode(hf_out[i])})
        n_ok = sum(r["agree"] for r in per)
        ok = n_ok == len(per) and tok_ok
        ok_all &= ok
        results[name] = {"hf_class": hf_cls, "mtp_tensors_dropped_for_mlx": dropped,
                         "tokenizer_fast_matches_tokenizers": tok_ok,
                         "max_abs_logit_diff_hf_vs_own": d, "prompts_agreeing": f"{n_ok}/{len(per)}",
                         "mtp_draft_agreement_on_continuations": (mh / mt if mt else None), "per_prompt": per}
        print(f"\n== {name}: {n_ok}/{len(per)} prompts identical across mlx-lm / transformers ({hf_cls}) / train.py; "
              f"tokenizer match {tok_ok}; max|dlogit| hf-own {d:.2e}; mtp.* dropped for mlx: {dropped}"
              + (f"; MTP t+2 agreement on these continuations {mh}/{mt} = {mh/mt:.3f}" if mt else ""))
        for r in per:
            print(f"  [{'OK ' if r['agree'] else 'DIFF@' + str(r['first_diff'])}] ...{r['prompt_tail'][-40:]!r} -> {r['text'][:70]!r}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)
    print("\nREF-CHECK " + ("PASSED" if ok_all else "FAILED"))
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
