#!/usr/bin/env bash
# The README's headline table and docs/PERFORMANCE.md's "A bandwidth-limited network": every
# method at P = 4, 6, 8 on one loopback shaped to 1 Gbit/s and to 10 Gbit/s, one interleaved
# benchmark run per P and rate.
#
#   scripts/experiments/headline.sh OUT
#
# For every RATE of RATES (default 1gbit 10gbit) and P of WORKERS (default 4 6 8):
# scripts/run_bench.sh -n P --numel NUMEL (14728266, VGG-16's gradient) --density 0.01
# --iters ITERS (8 at P = 4, 5 above) --warmup 2, every method, inside
# scripts/shaped_network.sh --rate RATE, under the measurement lock, into
# OUT/bench_RATE_pP.json (kept: a file already there is not measured again). Then prints the
# tables (python -m trainreport.docs show headline-1gbit, after the rows are in
# runs/headline/). TINY=1: a smoke test (2 ranks, 4096 entries, one call, no shaped link).
set -euo pipefail
source "$(dirname "$0")/common.sh"
usage_out "$0" "$@"
out=$1
if [ "${TINY:-0}" = 1 ]; then
  : "${WORKERS:=2}" "${NUMEL:=4096}" "${RATES:=1gbit}" "${ITERS:=1}"
else
  : "${WORKERS:=4 6 8}" "${NUMEL:=14728266}" "${RATES:=1gbit 10gbit}"
fi
mkdir -p "$out"
for rate in $RATES; do
  for workers in $WORKERS; do
    file="$out/bench_${rate}_p$workers.json"
    if [ -f "$file" ]; then
      echo "kept $file (run before)" >&2
      continue
    fi
    iters=${ITERS:-$([ "$workers" -le 4 ] && echo 8 || echo 5)}
    mapfile -d '' prefix < <(network_prefix "$rate")
    command=("$root/scripts/run_bench.sh" -n "$workers" --numel "$NUMEL" --density 0.01
      --iters "$iters" --warmup 2 --json "$file")
    echo "bench P=$workers: ${command[*]} (network $rate)" >&2
    locked timeout -k 30 900 "${prefix[@]}" "${command[@]}" >"$out/bench_${rate}_p$workers.log" 2>&1 \
      || echo "  bench P=$workers at $rate: exit status $? (see $out/bench_${rate}_p$workers.log)" >&2
  done
done
