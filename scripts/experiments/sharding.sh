#!/usr/bin/env bash
# Experiment e: sharded data parallelism on 2 emulated hosts, native FSDP2 against the sparse
# reduce-scatter (--fsdp) and native HSDP against the sparse replica hook (--hsdp).
#
#   scripts/experiments/sharding.sh OUT
#
# Trains MODEL (widemlp) on Fashion-MNIST on NWORKERS (4) ranks on HOSTS (2) hosts emulated by
# scripts/cluster_network.sh at each rate of RATES (default 100mbit 1gbit), ITERS (default 20)
# iterations per run, once per mode of MODES (default: fsdp hsdp) and method of METHODS
# (default: native, and spardl at DENSITY 0.01), each run stopped after CAP (default 600) s.
# MODES may also hold dp: plain data parallelism with the method's overlapped buckets (the
# pipeline the DDP hook runs), the unsharded reference; it has no native run. SPARSE_FLAGS
# (e.g. "--method-option momentum=0.9") go to every run of a method other than native.
# Runs go to OUT/RATE/MODE_METHOD; the table (ms, sync ms and MB per iteration, final test
# accuracy) is printed and written to OUT/sharding.md. TINY=1: a smoke test (no hosts).
set -euo pipefail
[ "${TINY:-0}" = 1 ] || : "${CAP:=600}" "${HOSTS:=2}"
source "$(dirname "$0")/common.sh"
usage_out "$0" "$@"
out=$1
if [ "${TINY:-0}" = 1 ]; then
  : "${RATES:=1gbit}" "${ITERS:=2}"
  export SPARDL_CLUSTER='{"hosts": 2, "ranks_per_host": 1}'  # --hsdp: 2 "hosts" of 1 rank
else
  : "${RATES:=100mbit 1gbit}" "${ITERS:=20}"
fi
: "${MODES:=fsdp hsdp}" "${DENSITY:=0.01}" "${METHODS:=native spardl}"
for rate in $RATES; do
  for mode in $MODES; do
    for method in $METHODS; do
      flags=()
      [ "$mode" = dp ] || flags=("--$mode")
      if [ "$method" = native ]; then
        [ "$mode" != dp ] || continue
      else
        read -ra extra <<<"${SPARSE_FLAGS:-}"
        flags+=(--method "$method" --density "$DENSITY" "${extra[@]}")
      fi
      train "$out/$rate/${mode}_$method" "$rate" "$ITERS" 1 "${flags[@]}"
    done
  done
done
"$python" -m trainreport.experiments tta "$out" --target 0.7 --no-plot --out "$out/sharding.md"
