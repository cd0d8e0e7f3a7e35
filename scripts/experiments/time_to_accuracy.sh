#!/usr/bin/env bash
# Experiment a: time to accuracy of every method on a network where communication matters.
#
#   scripts/experiments/time_to_accuracy.sh OUT
#
# Trains MODEL (default widemlp, 10,020,874 parameters) on Fashion-MNIST on NWORKERS (4) ranks,
# once per method of METHODS and rate of RATES (default 1gbit 100mbit), each run inside
# scripts/shaped_network.sh and under the measurement lock, at most ITERS_TOTAL (120) iterations
# with a test evaluation every EVAL_EVERY (20) iterations, every run stopped after CAP (120)
# seconds. Methods whose iteration is slow on the network (SLOW, default dense ddp ddp_fp16 at
# 100mbit) evaluate every SLOW_EVAL_EVERY (4) iterations, so that capped runs still log a
# curve. Runs go to OUT/RATE/LABEL; then the table (time to each of TARGET, default 0.7,0.75 test accuracy,
# final accuracy, bytes per iteration) is printed and written to OUT/tta.md, curves to
# OUT/tta_*.png. A method entry is LABEL=trainer flags, see METHODS below. TINY=1: a smoke test.
set -euo pipefail
source "$(dirname "$0")/common.sh"
usage_out "$0" "$@"
out=$1

if [ "${TINY:-0}" = 1 ]; then
  : "${RATES:=1gbit}" "${ITERS_TOTAL:=2}" "${EVAL_EVERY:=1}" "${SLOW_EVAL_EVERY:=1}"
  default_methods=("dense=--method dense" "spardl=--method spardl --density 0.01")
else
  : "${RATES:=1gbit 100mbit}" "${ITERS_TOTAL:=120}" "${EVAL_EVERY:=20}" "${SLOW_EVAL_EVERY:=4}"
  default_methods=(
    "dense=--method dense"
    "ddp=--method ddp"
    "ddp_fp16=--method ddp_fp16"
    "powersgd=--method powersgd"
    "topk=--method topk --density 0.01"
    "oktopk=--method oktopk --density 0.01"
    "zen=--method zen --density 0.01"
    "spardl=--method spardl --density 0.01"
    "spardl_fp16=--method spardl --density 0.01 --wire fp16"
  )
fi
: "${TARGET:=0.7,0.75}" "${SLOW:=100mbit:dense 100mbit:ddp 100mbit:ddp_fp16}"
if [ -n "${METHODS:-}" ]; then
  mapfile -t methods < <(tr ';' '\n' <<<"$METHODS")
else
  methods=("${default_methods[@]}")
fi

for rate in $RATES; do
  for entry in "${methods[@]}"; do
    label=${entry%%=*}
    read -ra flags <<<"${entry#*=}"
    every=$EVAL_EVERY
    [[ " $SLOW " == *" $rate:$label "* ]] && every=$SLOW_EVAL_EVERY
    train "$out/$rate/$label" "$rate" "$every" $((ITERS_TOTAL / every)) "${flags[@]}"
  done
done
"$python" -m trainreport.experiments tta "$out" --target "$TARGET" --out "$out/tta.md"
