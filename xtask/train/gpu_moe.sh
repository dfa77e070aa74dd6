#!/usr/bin/env bash
# One GPU call for the Qwen3.5-MoE model (docs/training.md, "MoE model"): tokenize the carried corpus
# (sha256-checked against manifest.json), train models/tiny-moe-mtp with train_moe.py (about 300 s of
# training; the schedule is fitted into --deadline 450 s after a slow compile, and `timeout` kills the
# trainer at 535 s whatever happens, so the call stays under 9 minutes), and copy the exported folder's
# 7 files flat into $OUT beside train.log (8 files; the device tool returns at most 8, 16 MiB each).
# Extra arguments go to train_moe.py after the defaults, so they win:
#   bash xtask/train/gpu_moe.sh                                      # on the H200 (python3 there)
#   OUT=/tmp/out_smoke PYTHON=/work/venvs/ref/bin/python DATA=/tmp/smokedata bash xtask/train/gpu_moe.sh \
#       --smoke --steps 20 --seq-len 128 --eval-tokens 8192 --device cpu   # CPU smoke test of the same path
# Env: OUT (required), PYTHON (default python3), WORK (default /tmp/o/tiny-moe-mtp), DATA (optional --data),
#      DEADLINE (default 450, seconds of the trainer's own clock), KILL_AFTER (default 535).
set -o pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to an empty folder}"
PY=${PYTHON:-python3}
W=${WORK:-/tmp/o/tiny-moe-mtp}
LOG=$OUT/train.log
D=()
[ -n "${DATA:-}" ] && D=(--data "$DATA")
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi") | tee "$LOG"
$PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$LOG"
$PY xtask/train/train_moe.py --prepare-only "${D[@]}" 2>&1 | tee -a "$LOG" || exit 1
left=$(( ${KILL_AFTER:-535} - SECONDS ))
echo "prepared in ${SECONDS}s; the trainer gets at most ${left}s" | tee -a "$LOG"
timeout -k 5 "$left" $PY xtask/train/train_moe.py "${D[@]}" --out "$W" --steps auto --time-budget 300 --compile \
    --deadline "${DEADLINE:-450}" "$@" 2>&1 | tee -a "$LOG"
rc=$?
for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json metrics.json train_log.jsonl; do
    cp "$W/$f" "$OUT/" || rc=1
done
ls -l "$OUT" | tee -a "$LOG"
echo "call took ${SECONDS}s, exit $rc" | tee -a "$LOG"
exit $rc
