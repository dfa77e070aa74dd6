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
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import (EOT_ID, IM_END_ID, IM_START_ID, CHAT_TEMPLATE, ensure_bins, evaluate,  # noqa: E402,F401
                    load_bin, rotate_half, sha256_file)

HERE = os.path.dirname(os.path.abspath(__file__))

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



# ----------------------------------------------------------------------------- model
class RMSNorm(common.NormWeight):
    """Qwen3RMSNorm: w * (x / sqrt(mean(x^2) + eps)), computed in fp32, plain weight (not zero-centred)."""

    def __init__(self, dim, eps):
        super().__init__(dim, eps)

    def forward(self, x):
        return self.weight * common.rms_normalise(x, self.eps).to(x.dtype)


class Rope(common.RotaryTables):
    def __init__(self, head_dim, theta, max_pos):
        super().__init__(head_dim, theta, max_pos)

    def forward(self, q, k, T):  # q,k: [B, heads, T, hd]; positions 0..T-1
        return self.rotate(q, T), self.rotate(k, T)


class Attention(common.AttentionProjections):
    def __init__(self, c):
        super().__init__(c, RMSNorm)

    def forward(self, x, rope):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = rope(q, k, T)
        return self.o_proj(self.attend(q, k, v))


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


class TinyQwen3(common.TiedMtpModel):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = common.Trunk(c, lambda: [DecoderLayer(c) for _ in range(c["num_hidden_layers"])], RMSNorm)
        self.mtp = common.MTP(c, lambda: DecoderLayer(c), RMSNorm) if c.get("mtp_num_hidden_layers", 0) > 0 else None
        self.rope = Rope(c["head_dim"], c["rope_theta"], c["max_position_embeddings"])
        self.init_weights(("o_proj.weight", "down_proj.weight"))


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
    common.write_side_files(out, data, c["max_position_embeddings"])


def load_export(path, device):
    cfg = json.load(open(os.path.join(path, "config.json")))
    c = {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                             "num_attention_heads", "num_key_value_heads", "head_dim",
                             "max_position_embeddings", "rms_norm_eps", "rope_theta")}
    c["mtp_num_hidden_layers"] = cfg.get("mtp_num_hidden_layers", 0)
    return common.load_weights(TinyQwen3(c), path, device), c


# ----------------------------------------------------------------------------- train
FAMILY = common.make_family(COMMON, CONFIGS, SMOKE, build=lambda c: TinyQwen3(c), opt=OPT, export=export,
                            load_export=load_export)


def main():
    common.main(__doc__, FAMILY, ["target", "draft"], "target")


if __name__ == "__main__":
    main()
