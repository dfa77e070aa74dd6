#!/usr/bin/env bash
# A/B of environment switches on the GPU machine, in alternating `scale-bench` processes.
#
# Host-bound steps make one process differ from the next by up to ~15 % (docs/gpu.md), so one
# process per variant shows nothing: this runs ROUNDS rounds, each over every shape and every
# variant, the variants' order rotated by one each round, and tags every result line with its
# process (`"process": "<shape>-r<round>-<label>"`, `"variant": "<label>"`).
#
# Run it inside the bundle's environment, from the repository root (the device call's cwd):
#   bash .gpu/bundle/pN/gpu.sh exec bash xtask/assets/gpu-ab.sh SHAPES ROUNDS VARIANT...
# SHAPES: comma list of tiny, 1.7b, 8b (the upscales are built once, in $AB_WORK);
# VARIANT: LABEL or LABEL:VAR=VALUE[,VAR=VALUE...] (a label alone runs the defaults).
# Environment: AB_ARGS (scale-bench flags; default below), AB_WORK (default /tmp/mtp-ab), AB_PROMPTS
# (default xtask/assets/spec-scale-prompts.json under the working directory),
# OUT (results folder: ab-rows.jsonl, ab.log), AB_DEADLINE_S (stop starting processes after
# this many seconds; default 540).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 SHAPES ROUNDS VARIANT..." >&2; exit 2; }
SHAPES=$1 ROUNDS=$2
shift 2
B=${MTP_BIN_DIR:?run through gpu.sh exec}
W=${AB_WORK:-/tmp/mtp-ab}
OUT=${OUT:-.gpu/out}
ARGS=${AB_ARGS:---dtype bf16 --depths auto,4 --tokens 160 --ttft-tokens 1000,600 --profile-depth none}
DEADLINE=${AB_DEADLINE_S:-540}
mkdir -p "$W" "$OUT"
say() { echo "gpu-ab: $*" | tee -a "$OUT/ab.log" >&2; }

model_of() {
  case $1 in
    tiny) echo "$MTP_ROOT/models/tiny-mtp" ;;
    *)
      [ -d "$W/$1" ] || "$B/xtask" upscale --model "$MTP_ROOT/models/tiny-mtp" --shape "$1" \
        --out "$W/$1" --dtype bf16 >>"$OUT/ab.log" 2>&1
      echo "$W/$1" ;;
  esac
}

variants=("$@")
n=${#variants[@]}
for r in $(seq 1 "$ROUNDS"); do
  for shape in ${SHAPES//,/ }; do
    model=$(model_of "$shape")
    for i in $(seq 0 $((n - 1))); do
      if [ "$SECONDS" -ge "$DEADLINE" ]; then say "deadline ${DEADLINE} s: stopped before round $r, $shape"; exit 0; fi
      v=${variants[$(((i + r - 1) % n))]}
      label=${v%%:*}
      vars=()
      [ "$v" != "$label" ] && IFS=, read -r -a vars <<<"${v#*:}"
      say "round $r $shape $label ${vars[*]:-} (t=${SECONDS}s)"
      # shellcheck disable=SC2086
      env "${vars[@]}" "$B/scale-bench" --model "$model" --shape "$shape" \
        --prompts "${AB_PROMPTS:-$PWD/xtask/assets/spec-scale-prompts.json}" $ARGS 2>>"$OUT/ab.log" |
        python3 -c 'import json, sys
for line in sys.stdin:
    try:
        row = json.loads(line)
    except ValueError:
        continue
    row["process"], row["variant"] = sys.argv[1], sys.argv[2]
    print(json.dumps(row), flush=True)' "$shape-r$r-$label" "$label" >>"$OUT/ab-rows.jsonl" ||
        say "process $shape-r$r-$label failed"
    done
  done
done
say "done in ${SECONDS}s: $OUT/ab-rows.jsonl"
