#!/usr/bin/env bash
# One GPU call for the hybrid model (docs/training.md, "Hybrid model"): tokenize the carried corpus
# (sha256-checked against manifest.json), train models/tiny-hybrid-mtp with train_hybrid.py, and copy
# the exported folder's 7 files flat into $OUT beside train.log (8 files; the device tool returns at
# most 8, 16 MiB each). Extra arguments go to train_hybrid.py after the defaults, so they win:
#   bash xtask/train/gpu_hybrid.sh                                   # on the H200 (python3 there)
#   OUT=/tmp/out_smoke PYTHON=/work/venvs/train/bin/python bash xtask/train/gpu_hybrid.sh \
#       --smoke --steps 20 --seq-len 128 --eval-tokens 8192 --device cpu   # CPU smoke test of the same path
# Env: OUT (required), PYTHON (default python3), WORK (default /tmp/o/tiny-hybrid-mtp), DATA (optional --data).
set -o pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to an empty folder}"
PY=${PYTHON:-python3}
W=${WORK:-/tmp/o/tiny-hybrid-mtp}
LOG=$OUT/train.log
D=()
[ -n "${DATA:-}" ] && D=(--data "$DATA")
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi") | tee "$LOG"
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$LOG"
$PY xtask/train/train_hybrid.py --prepare-only "${D[@]}" 2>&1 | tee -a "$LOG" || exit 1
$PY xtask/train/train_hybrid.py "${D[@]}" --out "$W" --steps auto --time-budget 300 --compile --deadline 480 "$@" 2>&1 | tee -a "$LOG"
rc=$?
for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json metrics.json train_log.jsonl; do
    cp "$W/$f" "$OUT/" || rc=1
done
ls -l "$OUT" | tee -a "$LOG"
exit $rc
