#!/usr/bin/env bash
# Experiment d: ZEN, SparDL and TopkA at P = 4, 6, 8 on a 1 Gbit/s shaped link, each measured
# by the benchmark and predicted by the simulator.
#
#   scripts/experiments/zen_scaling.sh OUT
#
# First the per-message cost: mpiexec -n 2 python -m syncbench.latency on the same shaped link, in
# a run of its own, into OUT/scaling/latency.json (its median is the simulator's --message-cost:
# measured apart from the runs it predicts). Then for every P of WORKERS (default 4 6 8):
# scripts/run_bench.sh -n P --methods BENCH_METHODS
# (zen,spardl,topk) --numel NUMEL (14728266, VGG-16's gradient) --density 0.01 --iters ITERS (5)
# --warmup 1 inside scripts/shaped_network.sh --rate RATE (1gbit), under the measurement lock,
# into OUT/scaling/bench_pP.json; then scripts/simulate.py --compare on those files
# (--local-work replay at the benchmark's n, --local-numel NUMEL, and --host-cores 2; also locked:
# it times this machine) into
# OUT/scaling/sim.json, and prints the table (also OUT/scaling.md). TINY=1: a smoke test.
set -euo pipefail
source "$(dirname "$0")/common.sh"
usage_out "$0" "$@"
out=$1
if [ "${TINY:-0}" = 1 ]; then
  : "${WORKERS:=2}" "${NUMEL:=4096}" "${ITERS:=1}" "${LOCAL_WORK:=select}" "${LATENCY_ROUNDS:=50}"
else
  : "${WORKERS:=4 6 8}" "${NUMEL:=14728266}" "${ITERS:=5}" "${LOCAL_WORK:=replay}"
fi
: "${RATE:=1gbit}" "${BENCH_METHODS:=zen,spardl,topk}"
mkdir -p "$out/scaling"
# The simulator's per-message cost, measured in a run of its own before and apart from the runs it
# predicts (2 ranks on the 2 cores: see syncbench/latency.py), so the table is out of sample.
latency="$out/scaling/latency.json"
if [ ! -f "$latency" ]; then
  mapfile -d '' prefix < <(network_prefix "$RATE")
  echo "latency: mpiexec -n 2 python -m syncbench.latency (network $RATE)" >&2
  (cd "$root" && locked timeout -k 30 300 "${prefix[@]}" "$mpiexec" -n 2 "$python" -m syncbench.latency \
    --rounds "${LATENCY_ROUNDS:-2000}" --warmup 20 --json "$latency") >"$out/scaling/latency.log" 2>&1 \
    || echo "  latency: exit status $? (see $out/scaling/latency.log)" >&2
fi
message_cost=()
if [ -f "$latency" ]; then
  message_cost=(--message-cost "$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["median_s"])' "$latency")")
fi
local_numel=()
[ "$LOCAL_WORK" = replay ] && local_numel=(--local-numel "$NUMEL")
files=()
for workers in $WORKERS; do
  file="$out/scaling/bench_p$workers.json"
  if [ -f "$file" ]; then
    echo "kept $file (run before)" >&2
    files+=("$file")
    continue
  fi
  mapfile -d '' prefix < <(network_prefix "$RATE")
  command=("$root/scripts/run_bench.sh" -n "$workers" --methods "$BENCH_METHODS"
    --numel "$NUMEL" --density 0.01 --iters "$ITERS" --warmup 1 --json "$file")
  echo "bench P=$workers: ${command[*]} (network $RATE)" >&2
  locked timeout -k 30 450 "${prefix[@]}" "${command[@]}" >"$out/scaling/bench_p$workers.log" 2>&1 \
    || echo "  bench P=$workers: exit status $? (see $out/scaling/bench_p$workers.log)" >&2
  [ -f "$file" ] && files+=("$file")
done
if [ ! -f "$out/scaling/sim.json" ] && [ "${#files[@]}" -gt 0 ]; then
  echo "simulate: --compare ${files[*]} --local-work $LOCAL_WORK --host-cores 2" >&2
  locked timeout -k 30 450 "$python" "$root/scripts/simulate.py" --compare "${files[@]}" --local-work "$LOCAL_WORK" \
    "${local_numel[@]}" --host-cores 2 "${message_cost[@]}" --json "$out/scaling/sim.json" >"$out/scaling/sim.log" 2>&1 \
    || echo "  simulate: exit status $? (see $out/scaling/sim.log)" >&2
fi
"$python" -m trainreport.experiments scaling "$out" --out "$out/scaling.md"
