#!/usr/bin/env bash
# gpu-ab.sh with the CUDA-graph tracer preloaded into every process (docs/gpu.md, open check 18).
#
# Builds xtask/assets/graph-trace.c on the GPU machine (with the header stub it needs), then runs
#   gpu-ab.sh SHAPES ROUNDS VARIANT...
# adding to each variant RUST_LOG=runner::depth=trace, LD_PRELOAD of the tracer and
# GRAPH_TRACE_OUT=$OUT/graphs-LABEL; compresses the traces and ab.log with xz. Read the result here
# with `python3 xtask/assets/graph-rounds.py ab.log.xz 'graphs-LABEL.*'`. Run it inside the bundle's
# environment, from the repository root:
#   AB_ARGS="--dtype f32 --depths auto,2 --tokens 256 --ttft-tokens none --profile-depth none" \
#     bash .gpu/bundle/pN/gpu.sh exec bash xtask/assets/graph-ab.sh tiny 2 keep late:MTP_PLAIN_KEEP_UP=0
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: $0 SHAPES ROUNDS VARIANT..." >&2; exit 2; }
SHAPES=$1 ROUNDS=$2
shift 2
OUT=${OUT:-.gpu/out}
mkdir -p "$OUT" /tmp/stub/crt
NV=${MTP_NV:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia}
printf '%s\n' '#define __device_builtin__' '#define __device_builtin_texture_type__' \
  '#define __device_builtin_surface_type__' '#define __cudart_builtin__' '#define __host__' \
  '#define __device__' '#define __align__(n) __attribute__((aligned(n)))' '#define CUDARTAPI' \
  '#define __builtin_align__(a) __align__(a)' '#define __location__(a) __##a' \
  '#define __cuda_align__(n) __align__(n)' >/tmp/stub/crt/host_defines.h
G=RUST_LOG=runner::depth=trace
if gcc -shared -fPIC -O2 -I/tmp/stub -I"$NV/cu13/include" xtask/assets/graph-trace.c -o /tmp/libgraph.so \
  "$(ls "$NV"/cu13/lib/libcupti.so* | head -1)" -Wl,-rpath,"$NV/cu13/lib" -ldl; then
  G="$G,LD_PRELOAD=/tmp/libgraph.so"
else
  echo "graph-ab: the tracer did not build; running untraced" >&2
fi
variants=()
for v in "$@"; do
  label=${v%%:*}
  extra=""
  [ "$v" != "$label" ] && extra=",${v#*:}"
  variants+=("$label:$G,GRAPH_TRACE_OUT=$OUT/graphs-$label$extra")
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >"$OUT/nvidia-smi.txt" 2>&1
bash "$(dirname "$0")/gpu-ab.sh" "$SHAPES" "$ROUNDS" "${variants[@]}"
rc=$?
for f in "$OUT"/graphs-* "$OUT/ab.log"; do
  case $f in *.xz) ;; *) [ -f "$f" ] && xz -9 "$f" ;; esac
done
exit $rc
