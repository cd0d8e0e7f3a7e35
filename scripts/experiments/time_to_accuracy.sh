#!/usr/bin/env bash
# Experiment a: time to accuracy of every method, over seeds, on a network where communication
# matters.
#
#   scripts/experiments/time_to_accuracy.sh OUT
#
# Trains MODEL (default widemlp, 10,020,874 parameters) on Fashion-MNIST on NWORKERS (4) ranks,
# once per method of METHODS, rate of RATES (default 1gbit 100mbit) and seed of SEEDS (default
# 0 1 2), each run inside scripts/shaped_network.sh and under the measurement lock: one epoch
# (ITERS iterations of it; default all, 469 at batch 32), evaluated every EVAL_EVERY (20)
# iterations with --eval-every, which does not change what a run trains on, so every method
# trains on the same batches and is evaluated on the same schedule. Every run stops after CAP
# seconds (default 900; a run still going is stopped after its current iteration). Runs go to
# OUT/RATE/LABEL/seedS; then the table (per target of TARGET, default 0.8,0.85: the seeds that
# reached it and the mean (min-max) of their training seconds and iterations; the final accuracy
# and the bytes per iteration) is printed and written to OUT/seeds.md. A method entry is
# LABEL=trainer flags, see METHODS below. TINY=1: a smoke test.
set -euo pipefail
[ "${TINY:-0}" = 1 ] || : "${CAP:=900}"
source "$(dirname "$0")/common.sh"
usage_out "$0" "$@"
out=$1

if [ "${TINY:-0}" = 1 ]; then
  : "${RATES:=1gbit}" "${ITERS:=2}" "${EVAL_EVERY:=1}" "${SEEDS:=0}"
  default_methods=("dense=--method dense" "spardl_mc=--method spardl --density 0.01 --method-option momentum=0.9")
else
  : "${RATES:=1gbit 100mbit}" "${ITERS:=}" "${EVAL_EVERY:=20}" "${SEEDS:=0 1 2}"
  mc="--method-option momentum=0.9"
  default_methods=(
    "ddp=--method ddp"
    "ddp_fp16=--method ddp_fp16"
    "powersgd=--method powersgd"
    "topk=--method topk --density 0.01"
    "oktopk=--method oktopk --density 0.01"
    "zen=--method zen --density 0.01"
    "spardl=--method spardl --density 0.01"
    "spardl_mc=--method spardl --density 0.01 $mc"
    "spardl_fp16_mc=--method spardl --density 0.01 --wire fp16 $mc"
  )
fi
: "${TARGET:=0.8,0.85}"
if [ -n "${METHODS:-}" ]; then
  mapfile -t methods < <(tr ';' '\n' <<<"$METHODS")
else
  methods=("${default_methods[@]}")
fi

for seed in $SEEDS; do
  for rate in $RATES; do
    for entry in "${methods[@]}"; do
      label=${entry%%=*}
      read -ra flags <<<"${entry#*=}"
      iters=()
      [ -n "$ITERS" ] && iters=(--max-iters "$ITERS")
      train "$out/$rate/$label/seed$seed" "$rate" "" 1 --eval-every "$EVAL_EVERY" \
        --seed "$seed" "${iters[@]}" "${flags[@]}"
    done
  done
done
"$python" -m trainreport.experiments seeds "$out" --target "$TARGET" --out "$out/seeds.md"
