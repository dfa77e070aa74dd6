#!/usr/bin/env python3
"""Write MODEL_CARD.md for a trained model folder from its metrics.json, train_log.jsonl,
xtask/train/corpus.lock, the corpus manifest and (optionally) a ref_check.py / ref_check_hybrid.py
--json-out file. Handles the dense models (train.py), the Qwen3.5 hybrid (train_hybrid.py) and the
Qwen3.5-MoE model (train_moe.py, with ref_check_moe.py's JSON).

  python3 xtask/train/write_model_card.py models/tiny-mtp   [--refcheck /tmp/refcheck.json] [--device-s 428]
"""
import argparse
import json
import os

from safetensors import safe_open

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--refcheck", default=None)
    ap.add_argument("--manifest", default=os.path.join(HERE, "data", "manifest.json"))
    ap.add_argument("--device-s", type=float, default=None, help="device seconds of the training call (both models)")
    a = ap.parse_args()
    d = a.model_dir
    name = os.path.basename(os.path.normpath(d))
    m = json.load(open(os.path.join(d, "metrics.json")))
    cfg = json.load(open(os.path.join(d, "config.json")))
    lock = json.load(open(os.path.join(HERE, "corpus.lock")))
    man = json.load(open(a.manifest)) if os.path.exists(a.manifest) else None
    log = [json.loads(l) for l in open(os.path.join(d, "train_log.jsonl"))]
    steps_log = [r for r in log if "step" in r and "ce" in r]
    tail = steps_log[-4:]
    mean = lambda k: sum(r[k] for r in tail) / len(tail)
    ho = m["heldout"]
    c = m["config"]
    is_moe = cfg.get("model_type") == "qwen3_5_moe"  # train_moe.py: a hybrid with MoE MLPs
    is_hybrid = cfg.get("model_type") == "qwen3_5" or is_moe  # keys live in text_config
    if is_hybrid:
        cfg = dict(cfg["text_config"], **{k: v for k, v in cfg.items() if k != "text_config"})
        cfg.setdefault("torch_dtype", cfg.get("dtype"))
    is_mtp = cfg.get("mtp_num_hidden_layers", 0) > 0
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    size = os.path.getsize(os.path.join(d, "model.safetensors"))
    L = []
    w = L.append
    w(f"# {name}\n")
    if is_moe:
        w("A small **Qwen3.5-MoE** decoder (`Qwen3_5MoeForConditionalGeneration`, `model_type: qwen3_5_moe` with a "
          "`text_config`, hub layout: trunk under `model.language_model.*`, fused experts): Gated DeltaNet (linear "
          "attention) layers interleaved with gated full-attention layers, every MLP a sparse mixture of experts with a "
          "gated shared expert, and **one MTP layer** (its MLP sparse too) in the Qwen3.5 layout (`mtp.*`), trained by "
          "this project (mtp-runner, issue 19) as the MoE target model for lossless multi-token-prediction speculative "
          "decoding. Trained from scratch on Python source code.\n")
    elif is_hybrid:
        w("A small dense **Qwen3.5 hybrid** decoder (`Qwen3_5ForCausalLM`, `model_type: qwen3_5` with a `text_config`): "
          "Gated DeltaNet (linear attention) layers interleaved with gated full-attention layers, with **one MTP layer** "
          "in the Qwen3.5 layout (`mtp.*`), trained by this project (mtp-runner, issue 8) as the hybrid target model for "
          "lossless multi-token-prediction speculative decoding. Trained from scratch on Python source code.\n")
    elif is_mtp:
        w("A small dense **Qwen3** decoder (`Qwen3ForCausalLM`, `model_type: qwen3`) with **one MTP layer** in the "
          "Qwen3.5 / Qwen3-Next layout (`mtp.*`), trained by this project (mtp-runner, issue 3) as the target model for "
          "lossless multi-token-prediction speculative decoding. Trained from scratch on Python source code.\n")
    else:
        w("A small dense **Qwen3** decoder (`Qwen3ForCausalLM`), no MTP, trained by this project (mtp-runner, issue 3) "
          "as the separate draft model for draft-model speculation (same tokenizer as `tiny-mtp`). Trained from scratch "
          "on the same Python source corpus.\n")
    w("## Architecture\n")
    w("| key | value |\n|---|---|")
    keys = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "rope_theta", "rms_norm_eps", "max_position_embeddings",
            "tie_word_embeddings", "torch_dtype"]
    if is_moe:
        keys[5:6] = ["num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                     "norm_topk_prob", "router_aux_loss_coef"]
    if is_hybrid:
        keys[keys.index("rms_norm_eps"):keys.index("rms_norm_eps")] = ["partial_rotary_factor", "full_attention_interval", "layer_types", "linear_num_key_heads",
                     "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"]
    for k in keys:
        w(f"| `{k}` | {cfg[k]} |")
    if is_mtp:
        w(f"| `mtp_num_hidden_layers` | {cfg['mtp_num_hidden_layers']} |")
        w(f"| `mtp_norm_zero_centered` | {str(cfg['mtp_norm_zero_centered']).lower()} |")
    w(f"| parameters | {m['params']:,}" + (f" (MTP module {m['mtp_params']:,}; trunk {m['params']-m['mtp_params']:,})" if is_mtp else "") + " |")
    w(f"| `model.safetensors` | {size:,} bytes, {len(shapes)} tensors, dtype {', '.join(sorted(dtypes))} |\n")
    if is_hybrid:
        if is_moe:
            E, k, I, S = (cfg[x] for x in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                          "shared_expert_intermediate_size"))
            w("Qwen3.5 blocks, pre-norm residual, a **sparse MoE MLP** in every layer (and in the MTP layer). Every RMSNorm "
              "except the Gated DeltaNet's output norm is **zero-centred**: `x / sqrt(mean(x^2) + 1e-6) * (1 + w)` (fp32), `w` stored.\n")
            w(f"- **MoE MLP** (`mlp`): router `p = softmax(mlp.gate(x))` over {E} experts (fp32; `mlp.gate.weight` `[{E}, H]`), "
              f"the top {k} kept and renormalised to sum 1 (`norm_topk_prob`); `y = sum_top-k p_e * down_e(silu(gate_e(x)) * up_e(x))` "
              f"with experts of width {I} stored fused: `mlp.experts.gate_up_proj` `[{E}, {2 * I}, H]` (rows 0..{I - 1} gate, "
              f"{I}..{2 * I - 1} up) and `mlp.experts.down_proj` `[{E}, H, {I}]`; plus the shared expert "
              f"`sigmoid(mlp.shared_expert_gate(x)) * shared_expert(x)` (a SwiGLU of width {S}, `mlp.shared_expert.{{gate,up,down}}_proj`, "
              f"`mlp.shared_expert_gate.weight` `[1, H]`). Trained with a load-balancing loss ({cfg['router_aux_loss_coef']} x "
              f"`E * sum_e f_e P_e`, mean over the MoE blocks).")
        else:
            w("Qwen3.5 blocks, pre-norm residual, SwiGLU MLP `down(silu(gate(x)) * up(x))` in every layer. Every RMSNorm except "
              "the Gated DeltaNet's output norm is **zero-centred**: `x / sqrt(mean(x^2) + 1e-6) * (1 + w)` (fp32), `w` stored.\n")
        w("- **Gated DeltaNet** (`linear_attn`, layers with `linear_attention`): `qkv = in_proj_qkv(x)` (rows q, k, v); a "
          "depthwise causal conv1d over time (`conv1d.weight` `[C, 1, 4]`, no bias; zero history at the start), then silu; "
          "split into q, k (`linear_num_key_heads` x `linear_key_head_dim`) and v (`linear_num_value_heads` x "
          "`linear_value_head_dim`); q, k l2-normalised (`x / sqrt(sum(x^2) + 1e-6)`), q scaled by `Dk^-0.5`; value head j "
          "reads key head `j // (Hv/Hk)`; `beta = sigmoid(in_proj_b(x))`, decay `g = exp(-exp(A_log) * softplus(in_proj_a(x) + dt_bias))`; "
          "per token with state `S` `[Dk, Dv]` per value head (zero at the start): `S = g S; u = beta (v - S^T k); S = S + k u^T; o = S^T q`; "
          "then `norm(o) * w_norm * silu(in_proj_z(x))` per head (`linear_attn.norm.weight`, **plain**, not zero-centred) and `out_proj`.")
        w("- **Gated attention** (`self_attn`, layers with `full_attention`): `q_proj` gives per head `[query (head_dim) | gate (head_dim)]`; "
          "q_norm / k_norm (zero-centred) over head_dim, then RoPE (rotate-half / NeoX) on the first "
          "`head_dim * partial_rotary_factor` dims only, GQA, causal softmax with scale `head_dim^-0.5`; `o_proj(attn * sigmoid(gate))`.")
        w(f"- The LM head is tied to `{'model.language_model' if is_moe else 'model'}.embed_tokens.weight` (no `lm_head.weight` "
          "tensor)" + ("; the folder holds no vision tower (`config.json` has a token `vision_config` so that "
                       "transformers can build `Qwen3_5MoeForConditionalGeneration`, which reports `model.visual.*` as "
                       "missing and never uses them for text)" if is_moe else "") + ". `A_log` and `dt_bias` are stored "
          "in f32, everything else in bf16; each zero-centred norm weight was rounded at export so that `1 + w` is exactly a "
          "bf16 value (mlx-lm adds the 1 in bf16, transformers in f32: both see the same gain).\n")
    else:
        w("Qwen3 block: pre-norm residual; attention with GQA, per-head RMSNorm on q and k (`q_norm`, `k_norm`, over "
      "head_dim) applied before RoPE (rotate-half / NeoX style, positions 0..T-1), no biases, scale 1/sqrt(head_dim), causal; "
      "SwiGLU MLP `down(silu(gate(x)) * up(x))`. RMSNorm is `w * x / sqrt(mean(x^2) + 1e-6)` (computed in fp32). "
      "The LM head is tied to `model.embed_tokens.weight` (no `lm_head.weight` tensor is stored).\n")
    if is_mtp:
        w("## MTP head (exact math the runner must implement)\n")
        w("For position i, with `h_i` = the trunk's **post-final-norm** hidden state (the output of `model.norm`, the "
          "same tensor that feeds the LM head) and `t_{i+1}` = the next token:\n")
        w("```\ne  = RMSNorm_{mtp.pre_fc_norm_embedding}( embed_tokens(t_{i+1}) )\n"
          "g  = RMSNorm_{mtp.pre_fc_norm_hidden}( h_i )\n"
          "u  = mtp.fc( concat([e, g], -1) )            # embedding FIRST; fc.weight is [H, 2H], no bias\n"
          + ("o  = Qwen3_5MoeDecoderLayer_{mtp.layers.0}(u) # a GATED full-attention layer with a MoE MLP (as the trunk's),\n"
             "                                            # causal over the MTP positions, partial RoPE at position i,\n" if is_moe else
             "o  = Qwen3_5DecoderLayer_{mtp.layers.0}(u)   # a GATED full-attention layer (as the trunk's), causal over the\n"
             "                                            # MTP positions, partial RoPE at position i,\n" if is_hybrid else
             "o  = Qwen3DecoderLayer_{mtp.layers.0}(u)     # full causal attention over the MTP positions, RoPE position i,\n") +
          "                                            # its own KV cache\n"
          "h' = RMSNorm_{mtp.norm}(o)\n"
          "logits_{t+2} = h' @ embed_tokens.weight^T    # shared (tied) LM head; predicts t_{i+2}\n```\n")
        if is_hybrid:
            w("**Norm convention: every RMSNorm of the MTP head (`mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, "
              "`mtp.norm`, `mtp.layers.0.{input_layernorm,post_attention_layernorm}`, `mtp.layers.0.self_attn.{q_norm,k_norm}`) is "
              "stored ZERO-CENTRED, like the trunk's: the norm multiplies by `1 + w`; a loader adds 1** (config.json: "
              "`mtp_norm_zero_centered: true`; the rule of `docs/hybrid-format.md`).\n")
        else:
            w("**Norm convention: every norm in this checkpoint, the `mtp.*` norms included "
            "(`mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.norm`, `mtp.layers.0.{input_layernorm,"
            "post_attention_layernorm}`, `mtp.layers.0.self_attn.{q_norm,k_norm}`), is stored as a plain RMSNorm "
            "weight: multiply by `w`. They are NOT zero-centred; a loader must NOT add 1** (unlike Qwen3-Next / Qwen3.5, "
            "whose `x * (1 + w)` norms mlx-lm and ollama shift at load). Rule: `model_type == \"qwen3\"` (and "
            "`mtp_norm_zero_centered: false` in config.json) means no shift; the Qwen3.5 rule (shift by +1) applies only to "
            "`qwen3_next` / `qwen3_5*` model types.\n")
        w("Training pairs each position i (0..T-2) with (h_i, t_{i+1}) and the label t_{i+2}; the MTP layer's attention "
          "runs over the same sequence positions as the trunk. At decode time the MTP KV cache must be filled during "
          "prefill with the shifted pairing (h_i, t_{i+1}) for every prompt position, so a draft for the position after "
          "the last accepted token needs that token's hidden state and the sampled next token.\n")
        mtp_keys = sorted(k for k in shapes if k.startswith("mtp."))
        w(f"MTP tensors ({len(mtp_keys)}):\n")
        w("| tensor | shape |\n|---|---|")
        for k in mtp_keys:
            w(f"| `{k}` | {shapes[k]} |")
        w("")
    w("## Tokenizer\n")
    tok_sha = lock.get("expected_outputs", {}).get("tokenizer.json")
    w(f"Byte-level BPE (Hugging Face `tokenizers`, GPT-2 style ByteLevel pre-tokenizer, no prefix space, ByteLevel "
      f"decoder), vocabulary {c['vocab_size']}, trained on the training split of the corpus below with min_frequency 2. "
      f"Special tokens: `<|endoftext|>` = 0 (eos, bos and pad), `<|im_start|>` = 1, `<|im_end|>` = 2. No BOS is added "
      f"by the tokenizer; training documents are separated by `<|endoftext|>`, so prompts conventionally start with id 0. "
      f"`tokenizer_config.json` loads as `PreTrainedTokenizerFast` and carries a ChatML `chat_template` "
      f"(`<|im_start|>role\\n...<|im_end|>\\n`); the model was not trained on chat data. tokenizer.json sha256 `{tok_sha}`.\n")
    w("## Corpus\n")
    outs = (man or {}).get("outputs", {})
    w(f"The `*.py` files of {len(lock['packages'])} pinned PyPI wheels (archives and sha256 in `xtask/train/corpus.lock`; "
      f"rebuilt exactly by `python3 xtask/train/build_corpus.py`). Files kept: UTF-8, 64 B to 512 KiB, without special-token "
      f"strings. Split **by file** with `random.Random({lock['seed']})`: {outs.get('train.txt', {}).get('files', '?')} train files "
      f"({outs.get('train.txt', {}).get('bytes', 0)/1e6:.1f} MB, {lock.get('expected_tokens', {}).get('train.bin', 0):,} tokens) and "
      f"{outs.get('heldout.txt', {}).get('files', '?')} held-out files ({outs.get('heldout.txt', {}).get('bytes', 0)/1e6:.2f} MB, "
      f"{lock.get('expected_tokens', {}).get('heldout.bin', 0):,} tokens); documents joined with `<|endoftext|>`.\n")
    if man:
        w("| package==version | files | bytes of .py |\n|---|---|---|")
        for k, v in sorted(man["packages"].items(), key=lambda x: -x[1]["bytes"]):
            w(f"| {k} | {v['files']} | {v['bytes']:,} |")
        w("")
    w("## Training\n")
    w("| | |\n|---|---|")
    script = "train_moe.py" if is_moe else "train_hybrid.py" if is_hybrid else "train.py"
    w(f"| code | `xtask/train/{script}` (PyTorch {m['torch']}, {m['precision']}, torch.compile {m['compile']}) |")
    w(f"| hardware | 1x {m['device']} (the project's lent GPU machine){'' if is_hybrid else ' shared concurrently with the other model'} |")
    w(f"| command | `{m['command']}` |")
    w(f"| loss | CE(next token)" + (f" + {m['mtp_weight']} x CE(MTP predicting t+2)" if is_mtp else "")
      + (f" + {cfg['router_aux_loss_coef']} x load-balancing loss (mean over the MoE blocks; 2.0 when balanced)" if is_moe else "") + " |")
    w(f"| steps | {m['steps']} (chosen by `--steps auto` from a timed warm-up; `--steps {m['steps']}` reproduces) |")
    w(f"| batch | {m['batch']} x {m['seq_len']} tokens = {m['batch']*m['seq_len']:,} tokens/step, random windows of the packed train stream |")
    w(f"| tokens seen | {m['tokens_seen']:,} ({m['tokens_seen']/m['train_tokens']:.1f} epochs of {m['train_tokens']:,}) |")
    w(f"| optimizer | {m['optimizer']}; peak lr {m['lr']}, warm-up {m['warmup']} steps, min lr {m['min_lr_frac']} x peak, weight decay {m['weight_decay']} on matrices |")
    w(f"| init | normal(0, 0.02){' (router, experts and shared expert too)' if is_moe else ''}; o_proj and "
      f"down_proj{' (experts included)' if is_moe else ''}{' and out_proj' if is_hybrid else ''} std 0.02/sqrt(2 x layers)"
      + ("; zero-centred norms 0, gated norm 1; GDN: A ~ U(1, 16) (A_log = log A), dt ~ logU(1e-3, 1e-1) with "
         "dt_bias = softplus^-1(dt), conv1d kaiming-uniform" if is_hybrid else "") + " |")
    w(f"| seed | {m['seed']} |")
    w(f"| wall time | {m['train_wall_s']:.1f} s training + {m['compile_warmup_s']:.1f} s compile/warm-up + {m['eval_s']:.1f} s final eval |")
    if a.device_s:
        w(f"| device time | {a.device_s:.0f} s for the whole GPU call (machine start, tokenization, {'training' if is_hybrid else 'both models trained concurrently'}) |")
    ft = f"{mean('ce'):.4f}"
    w(f"| final train loss (mean of the last {len(tail)} logged steps, {tail[0]['step']}..{tail[-1]['step']}) | next-token CE {ft}"
      + (f", MTP CE {mean('mtp_ce'):.4f}, total {mean('loss'):.4f}" if is_mtp else "")
      + (f", weighted aux {mean('aux'):.4f}" if is_moe else "") + " |\n")
    w("## Held-out evaluation\n")
    w(f"On the whole held-out split ({ho['heldout_tokens']:,} predicted tokens; non-overlapping windows of {m['seq_len']} "
      f"tokens, each starting with empty context), with the exported bf16 weights in fp32 activations on the H200 (TF32 matmuls allowed), right after training:\n")
    w("| metric | value |\n|---|---|")
    w(f"| next-token loss (nats/token) | {ho['heldout_loss']:.4f} |")
    w(f"| perplexity | {ho['heldout_ppl']:.3f} |")
    w(f"| next-token top-1 accuracy | {ho['heldout_top1_acc']:.4f} |")
    if is_mtp:
        w(f"| MTP loss vs the true t+2 | {ho['mtp_heldout_loss']:.4f} (ppl {2.718281828 ** ho['mtp_heldout_loss']:.3f}) |")
        w(f"| MTP top-1 accuracy vs the true t+2 | {ho['mtp_top1_acc_vs_true_t2']:.4f} |")
        w(f"| **MTP top-1 agreement with the target's own greedy choice at t+2** (argmax MTP logits at i == argmax trunk logits at i+1, teacher-forced) | **{ho['mtp_agreement_vs_greedy_t2']:.4f}** |")
        w("\nThe last row is the expected greedy acceptance rate of one MTP draft step (goal: >= 0.6).\n")
        ca = m.get("mtp_chain_acceptance")
        if ca:
            w(f"Greedy acceptance **per draft position** when the MTP head drafts a chain of {ca['depth']} from its own "
              f"output (draft p+1 fed with draft p and the `mtp.norm` output that produced it, attending the MTP cache as "
              f"prefill left it: the runner's drafter), along greedy continuations ({ca['greedy_tokens']} tokens, fp32) of "
              f"{ca['streams']} held-out prompts of {ca['prompt_tokens']} tokens, {ca['chains']:,} chains:\n")
            w("| draft position | " + " | ".join(str(p + 1) for p in range(ca["depth"])) + " |")
            w("|---|" + "---|" * ca["depth"])
            w("| accepted, given the earlier ones were | " + " | ".join(
                "-" if x is None else f"{x:.3f}" for x in ca["conditional_per_position"]) + " |")
            w("| accepted through this position | " + " | ".join(
                f"{x / ca['chains']:.3f}" for x in ca["accepted_through"]) + " |")
            w(f"\nMean accepted drafts per round at depth {ca['depth']}: {ca['mean_accepted_of_depth']:.2f}.\n")
    eu = m.get("expert_usage")
    if eu:
        w(f"Expert usage on {eu['tokens']:,} held-out tokens (share of the top-k assignments; balanced = 1/E each): "
          f"the least used expert of any block gets {eu['min_share_x_experts']:.2f} / E, the most used "
          f"{eu['max_share_x_experts']:.2f} / E.\n")
        w("| block | " + " | ".join(f"e{i}" for i in range(len(next(iter(eu["share_per_block"].values()))))) + " |")
        w("|---|" + "---|" * len(next(iter(eu["share_per_block"].values()))))
        for b, sh in eu["share_per_block"].items():
            w(f"| `{b}` | " + " | ".join(f"{x:.3f}" for x in sh) + " |")
        w("")
    else:
        w("")
    if a.refcheck and os.path.exists(a.refcheck):
        rc = json.load(open(a.refcheck)).get(name)
        if rc and is_moe:
            w("## Reference check (`xtask/train/ref_check_moe.py`)\n")
            w(f"In fp32 math on the stored weights (torch {rc['torch']}, transformers {rc['transformers']}, mlx-lm {rc['mlx_lm']}):\n")
            w(f"- Greedy continuations ({rc['max_tokens']} tokens) of 5 held-out prompts (`xtask/train/refcheck_prompts.json`): "
              f"**{rc['prompts_agreeing']} identical** across `train_moe.py`'s model (every expert computed, unchosen ones "
              f"weighted 0), transformers `Qwen3_5MoeForConditionalGeneration` (from the hub layout as stored) and "
              f"`Qwen3_5MoeForCausalLM` (`AutoModelForCausalLM` resolves to `{rc['auto_class']}`), and mlx-lm "
              f"(`{rc['mlx_class']}`: drops `mtp.*`, splits `gate_up_proj` for its SwitchGLU); the references decode token by "
              f"token from their conv / recurrent-state / KV caches.")
            w(f"- Last-position logits: max |difference| over all pairs and 5 prompts **{rc['max_abs_d_logits']:.2e}** "
              f"(tolerance {rc['logit_tol']:g}).")
            w(f"- `PreTrainedTokenizerFast` encodes the prompts exactly like `tokenizers`: {rc['tokenizer_fast_matches_tokenizers']}. "
              f"Caution: `AutoTokenizer` gives `{rc['auto_tokenizer_class']}` (matches `tokenizers`: "
              f"{rc['auto_tokenizer_matches_tokenizers']}), and mlx-lm's `load()` uses it too: compare by token ids.")
            ch = rc.get("mtp_chain_acceptance_on_continuations")
            if ch:
                w(f"- MTP chain acceptance per draft position along these continuations ({ch['chains']} chains): "
                  + ", ".join("-" if x is None else f"{x:.3f}" for x in ch["conditional_per_position"])
                  + f"; mean accepted of {len(ch['accepted_through'])}: {ch['mean_accepted_of_depth']:.2f}. The batched "
                  f"chains (what `metrics.json` measures with) equal a one-chain-at-a-time recomputation: "
                  f"{ch['recompute_differing_drafts']} of {ch['recompute_checked_drafts']} drafts differ.")
            w("")
        elif rc and is_hybrid:
            w("## Reference check (`xtask/train/ref_check_hybrid.py`)\n")
            w(f"In fp32 math on the stored weights (torch {rc['torch']}, transformers {rc['transformers']}, mlx-lm {rc['mlx_lm']}):\n")
            w(f"- Greedy continuations ({rc['max_tokens']} tokens) of 5 held-out prompts (`xtask/train/refcheck_prompts.json`): "
              f"**{rc['prompts_agreeing']} identical** across mlx-lm (`{rc['mlx_class']}`, which drops the `mtp.*` tensors in its "
              f"sanitize and decodes token by token from its conv / recurrent-state / KV caches), transformers "
              f"(`{rc['hf_class']}`; `AutoModelForCausalLM` resolves to `{rc['auto_class']}`) and `train_hybrid.py`'s model.")
            w(f"- Last-position logits: max |difference| over the three pairs and 5 prompts **{rc['max_abs_d_logits']:.2e}** "
              f"(tolerance {rc['logit_tol']:g}).")
            worst = max(max(r['max_abs_d_out'], r['max_abs_d_state']) for r in rc['gdn_random_cases'])
            w(f"- The training code's chunked Gated DeltaNet (chunk 64) vs the per-token recurrence: max |difference| "
              f"{worst:.2e} on random inputs ({len(rc['gdn_random_cases'])} cases), {rc['gdn_trunk_max_abs_d_logits']:.2e} on the "
              f"trunk logits of this checkpoint (tolerance {rc['gdn_tol']:g}).")
            w(f"- `PreTrainedTokenizerFast` encodes the prompts exactly like `tokenizers`: {rc['tokenizer_fast_matches_tokenizers']}. "
              f"Caution: `AutoTokenizer` gives `{rc['auto_tokenizer_class']}` for `model_type: qwen3_5` "
              f"(matches `tokenizers`: {rc['auto_tokenizer_matches_tokenizers']}); it rebuilds the pre-tokenizer with Qwen3.5's "
              f"own regex, and mlx-lm's `load()` uses it too: compare by token ids or load the tokenizer explicitly.")
            if rc.get("mtp_draft_agreement_on_continuations") is not None:
                w(f"- MTP t+2 draft agreement along these greedy continuations: {rc['mtp_draft_agreement_on_continuations']:.3f}.")
            w("")
        elif rc:
            w("## Reference check (`xtask/train/ref_check.py`)\n")
            w(f"Greedy continuations (32 tokens, fp32 math) of 5 held-out prompts (`xtask/train/refcheck_prompts.json`): "
              f"**{rc['prompts_agreeing']} identical** across mlx-lm (`mlx_lm.load`, with the {rc['mtp_tensors_dropped_for_mlx']} `mtp.*` "
              f"tensors dropped into a temp copy), Hugging Face transformers (`{rc['hf_class']}`) and this project's "
              f"`train.py` model. transformers' `PreTrainedTokenizerFast` encodes the prompts exactly like `tokenizers`: "
              f"{rc['tokenizer_fast_matches_tokenizers']}. Max |logit difference| transformers vs train.py on a prompt: "
              f"{rc['max_abs_logit_diff_hf_vs_own']:.2e}."
              + (f" MTP t+2 draft agreement along these greedy continuations: {rc['mtp_draft_agreement_on_continuations']:.3f}."
                 if rc.get("mtp_draft_agreement_on_continuations") is not None else "") + "\n")
    w("## Reproduce\n")
    w("See `docs/training.md`. In short:\n")
    w("```sh\npython3 xtask/train/build_corpus.py            # download (pinned, sha256-checked), split, tokenizer, tokens\n"
      f"python3 xtask/train/{script} --model {m['model']} --out models/{name} --steps {m['steps']} --compile   # on a CUDA GPU\n"
      f"python3 xtask/train/write_model_card.py models/{name} --refcheck <ref_check json>\n"
      f"python3 xtask/train/{'ref_check_moe.py' if is_moe else 'ref_check_hybrid.py' if is_hybrid else 'ref_check.py'}\n```\n")
    w("Numbers vary slightly between GPUs and PyTorch versions (bf16 autocast, nondeterministic kernels); the shipped "
      "weights are the reference.\n")
    with open(os.path.join(d, "MODEL_CARD.md"), "w") as f:
        f.write("\n".join(L))
    print(f"wrote {os.path.join(d, 'MODEL_CARD.md')}")


if __name__ == "__main__":
    main()
