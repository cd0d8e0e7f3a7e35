#!/usr/bin/env bash
# Experiment b: SparDL with global residual collection (its default) against local residuals
# (--method-option residuals=local), in the setup of time_to_accuracy.sh at one rate.
#
#   scripts/experiments/residual_ablation.sh OUT
#
# Runs OUT/RATE/spardl and OUT/RATE/spardl_local (RATE default 1gbit; density DENSITY, default
# 0.01; ITERS_TOTAL 120 iterations, an evaluation every EVAL_EVERY 20, CAP seconds each). Given
# the OUT of time_to_accuracy.sh, its SparDL run is reused. Prints the accuracy and loss curves
# as a table (also OUT/residuals.md) and plots them (OUT/residuals.png). TINY=1: a smoke test.
set -euo pipefail
source "$(dirname "$0")/common.sh"
usage_out "$0" "$@"
out=$1
if [ "${TINY:-0}" = 1 ]; then
  : "${ITERS_TOTAL:=2}" "${EVAL_EVERY:=1}"
else
  : "${ITERS_TOTAL:=120}" "${EVAL_EVERY:=20}"
fi
: "${RATE:=1gbit}" "${DENSITY:=0.01}"
epochs=$((ITERS_TOTAL / EVAL_EVERY))
train "$out/$RATE/spardl" "$RATE" "$EVAL_EVERY" "$epochs" --method spardl --density "$DENSITY"
train "$out/$RATE/spardl_local" "$RATE" "$EVAL_EVERY" "$epochs" --method spardl \
  --density "$DENSITY" --method-option residuals=local
"$python" -m trainreport.experiments residuals "$out" --rate "$RATE" --out "$out/residuals.md"
