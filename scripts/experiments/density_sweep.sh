#!/usr/bin/env bash
# Experiment c: SparDL's time per iteration and accuracy over densities, with global and with
# local residuals.
#
#   scripts/experiments/density_sweep.sh OUT
#
# For every density of DENSITIES (default 0.001 0.003 0.01 0.03 0.1) and residual mode (global,
# local) one short run of SWEEP_ITERS (50) iterations and one test evaluation at the end, at
# RATE (1gbit), into OUT/sweep/dD_MODE; then prints the table (also OUT/sweep.md).
# TINY=1: a smoke test.
set -euo pipefail
source "$(dirname "$0")/common.sh"
usage_out "$0" "$@"
out=$1
if [ "${TINY:-0}" = 1 ]; then
  : "${DENSITIES:=0.01}" "${SWEEP_ITERS:=2}"
else
  : "${DENSITIES:=0.001 0.003 0.01 0.03 0.1}" "${SWEEP_ITERS:=50}"
fi
: "${RATE:=1gbit}"
for density in $DENSITIES; do
  train "$out/sweep/d${density}_global" "$RATE" "$SWEEP_ITERS" 1 --method spardl \
    --density "$density"
  train "$out/sweep/d${density}_local" "$RATE" "$SWEEP_ITERS" 1 --method spardl \
    --density "$density" --method-option residuals=local
done
"$python" -m trainreport.experiments sweep "$out" --out "$out/sweep.md"
