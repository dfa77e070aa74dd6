#!/usr/bin/env bash
# gpu.sh: runs mtp-runner's GPU checks and benchmarks on a Linux NVIDIA machine without Rust.
#
# Made by `cargo xtask gpu-bundle`, which puts a copy of this script, MANIFEST and SHA256SUMS in
# every part folder (p1, p2, ...) beside one chunk of bundle.tar.xz. The bundle carries its own
# repository root ($MTP_DEST/root: the models, the CPU reference, the mlx-lm scripts, from HEAD).
#   bash .gpu/bundle/pN/gpu.sh stage   copy this part's chunk into $MTP_STAGE (default /tmp/stage), checked
#   bash .gpu/bundle/pN/gpu.sh run     setup + check + bench (all chunks must be staged)
#   bash .gpu/bundle/pN/gpu.sh setup   join and unpack: binaries, libs, MLX CUDA + mlx + mlx-lm into $MTP_SP
#   bash .gpu/bundle/pN/gpu.sh exec CMD...  CMD with the run environment (after setup)
#   bash .gpu/bundle/pN/gpu.sh check   xtask gpu-check        -> $OUT/gpu-check.json
#   bash .gpu/bundle/pN/gpu.sh bench   xtask bench (all)      -> $OUT/results-gpu.json
#   bash .gpu/bundle/pN/gpu.sh spec-scale   setup + xtask bench spec-scale (builds the 1.7b/8b/0.6b
#                                      upscales in /tmp, runs the whole matrix within MTP_SCALE_BUDGET_S,
#                                      default 560 s) -> $OUT/results-spec-scale.json, spec-scale-rows.jsonl
#   bash .gpu/bundle/pN/gpu.sh check-scale  setup + check + the spec-scale matrix (bf16, depths 1-6 and auto,
#                                      mlx-lm plain, unless MTP_SCALE_ARGS says otherwise) in what is left of MTP_SCALE_BUDGET_S
# Environment: OUT (results folder; default .gpu/out), MTP_STAGE, MTP_DEST (default /tmp/mtp),
# MTP_NV (the torch venv's site-packages/nvidia), MLX_PTX_CACHE_DIR (default /tmp/ptxcache);
# for spec-scale: MTP_SCALE_BUDGET_S (whole step, setup included), MTP_SCALE_STAGE_CAP_S (most
# seconds one shape x dtype x engine may take, default 200), MTP_SCALE_WORK (default /tmp/mtp-scale),
# MTP_SCALE_ARGS (more `bench spec-scale` flags, e.g. "--tokens 128").
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$HERE/MANIFEST"
STAGE=${MTP_STAGE:-/tmp/stage}
DEST=${MTP_DEST:-/tmp/mtp}
SP=$DEST/sp
NV=${MTP_NV:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia}
OUT=${OUT:-$PWD/.gpu/out}
mkdir -p "$OUT"

say() { echo "gpu.sh: $*" >&2; }

stage() {
  mkdir -p "$STAGE"
  for f in "$HERE"/bundle.tar.xz.*; do
    cp "$f" "$STAGE/"
  done
  (cd "$STAGE" && sha256sum --quiet -c --ignore-missing "$HERE/SHA256SUMS")
  local have=0 missing=""
  for c in $CHUNKS; do
    if [ -f "$STAGE/$c" ]; then have=$((have + 1)); else missing="$missing $c"; fi
  done
  say "staged $(basename "$HERE") in $STAGE: $have of $NCHUNKS chunks present${missing:+; missing:$missing}"
}

setup() {
  for c in $CHUNKS; do
    [ -f "$STAGE/$c" ] || { say "chunk $c is not in $STAGE: run 'gpu.sh stage' for its part first (a machine that went cold lost /tmp)"; exit 4; }
  done
  (cd "$STAGE" && sha256sum --quiet -c "$HERE/SHA256SUMS")
  # shellcheck disable=SC2086
  (cd "$STAGE" && cat $CHUNKS) > "$STAGE/bundle.tar.xz"
  echo "$BUNDLE_SHA256  $STAGE/bundle.tar.xz" | sha256sum --quiet -c
  rm -rf "$DEST" && mkdir -p "$DEST"
  if command -v xz >/dev/null; then
    tar -C "$DEST" -xJf "$STAGE/bundle.tar.xz"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="fully_trusted")' \
      "$STAGE/bundle.tar.xz" "$DEST"
  fi
  rm -f "$STAGE/bundle.tar.xz"
  # libmlx.so's RPATH $ORIGIN/../../nvidia/{cu13,cudnn,nccl}/lib resolves through this link;
  # NVRTC finds the CUDA headers in nvidia/cu13/include and cccl in mlx/include/cccl.
  ln -sfn "$NV" "$SP/nvidia"
  [ -d "$SP/nvidia/cu13/include" ] || say "warning: $NV/cu13/include is missing: set CUDA_HOME to a CUDA toolkit (runtime JIT needs its headers)"
  chmod +x "$DEST"/bin/*
  say "unpacked commit $COMMIT into $DEST"
}

env_for_run() {
  export LD_LIBRARY_PATH="$SP/mlx/lib:$DEST/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONPATH="$SP${PYTHONPATH:+:$PYTHONPATH}"
  export MLX_PTX_CACHE_DIR=${MLX_PTX_CACHE_DIR:-/tmp/ptxcache}
  export MTP_ROOT=$DEST/root MTP_GIT_COMMIT=$COMMIT MTP_BIN_DIR=$DEST/bin MTP_PYTHON=python3
  export PYTHONUNBUFFERED=1
}

check() {
  env_for_run
  local rc=0
  "$DEST/bin/xtask" gpu-check --json "$OUT/gpu-check.json" >/dev/null || rc=$?
  case $rc in
    0) say "gpu-check: PASS" ;;
    3) say "gpu-check: NO GPU (exit 3): see $OUT/gpu-check.json" ;;
    *) say "gpu-check: FAIL (exit $rc): see $OUT/gpu-check.json" ;;
  esac
  return $rc
}

bench() {
  env_for_run
  "$DEST/bin/xtask" bench --out "$OUT/results-gpu.json" --no-report
}

# The spec-scale matrix within BUDGET seconds (the bundle already unpacked).
scale_matrix() {
  local budget=$1 rc=0
  env_for_run
  say "spec-scale: ${budget} s left for the matrix"
  # shellcheck disable=SC2086
  timeout --signal=TERM $((budget + 20)) "$DEST/bin/xtask" bench spec-scale \
    --out "$OUT/results-spec-scale.json" --no-report --rows "$OUT/spec-scale-rows.jsonl" \
    --budget-s "$budget" --stage-cap-s "${MTP_SCALE_STAGE_CAP_S:-200}" \
    --work "${MTP_SCALE_WORK:-/tmp/mtp-scale}" ${MTP_SCALE_ARGS:-} 2>&1 | tee "$OUT/spec-scale.log" || rc=${PIPESTATUS[0]}
  say "spec-scale: exit $rc; results in $OUT: results-spec-scale.json, spec-scale-rows.jsonl, spec-scale.log"
  return "$rc"
}

spec_scale() {
  local t0=$SECONDS
  setup
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
  scale_matrix $((${MTP_SCALE_BUDGET_S:-560} - (SECONDS - t0)))
}

# One call that checks and measures: setup, gpu-check, then the spec-scale matrix in what is left of
# MTP_SCALE_BUDGET_S (by default bf16 only with mlx-lm plain, and spec-scale's default depths 1-6 and auto:
# the must-show figures; session 32's H100 ran it in 475 s). The shapes run largest first: on a slow
# host (session 40: gpu-check 300 s) the time runs out on tiny rather than on the 8b headline. Exit
# status: gpu-check's when it failed, else the matrix's.
check_scale() {
  local t0=$SECONDS check_rc=0 scale_rc=0
  setup
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
  check 2>&1 | tee "$OUT/gpu-check.log" || check_rc=${PIPESTATUS[0]}
  MTP_SCALE_ARGS=${MTP_SCALE_ARGS:---shapes 8b,1.7b,tiny --dtypes bf16 --mlx-lm-plain} \
    scale_matrix $((${MTP_SCALE_BUDGET_S:-560} - (SECONDS - t0))) || scale_rc=$?
  if [ "$check_rc" -ne 0 ]; then return "$check_rc"; fi
  return "$scale_rc"
}

run() {
  setup
  nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
  local rc=0
  check 2>&1 | tee "$OUT/gpu-check.log" || rc=${PIPESTATUS[0]}
  bench 2>&1 | tee "$OUT/bench.log"
  say "results in $OUT: gpu-check.json, results-gpu.json, *.log (gpu-check exit $rc)"
  return $rc
}

case "${1:-}" in
  stage | setup | check | bench | run) "$1" ;;
  spec-scale) spec_scale ;;
  check-scale) check_scale ;;
  # exec CMD...: CMD with the run environment (after setup), for probes of one's own.
  exec) shift; env_for_run; "$@" ;;
  *) echo "usage: bash $0 stage|run|setup|check|bench|spec-scale|check-scale|exec CMD..." >&2; exit 2 ;;
esac
