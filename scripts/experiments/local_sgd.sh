#!/usr/bin/env bash
# Experiment e: synchronizing less often (local SGD, DiLoCo) against compressing every step.
#
#   scripts/experiments/local_sgd.sh OUT
#
# The time-to-accuracy runs of time_to_accuracy.sh (widemlp on Fashion-MNIST, NWORKERS=4 ranks,
# one epoch, evaluated every EVAL_EVERY=20 inner steps, the same batches for every row, each run
# inside scripts/shaped_network.sh), with these rows unless METHODS says otherwise:
#   per-step SparDL with momentum correction and the fp16 wire, per-step PowerSGD;
#   DiLoCo (--local-steps H, its outer Nesterov step: lr 0.7, momentum 0.9) with a dense outer
#   all-reduce, with SparDL's and with TopkA's at density DENSITY (default 0.01), H of HS.
# Defaults: RATES="100mbit", SEEDS="0 1 2", HS="10 50", CAP=900; the table goes to OUT/seeds.md
# (docs/EXPERIMENTS.md, section e). TINY=1: a smoke test (2 ranks, the MLP on digits, H = 2).
set -euo pipefail
here=$(dirname "$0")
: "${DENSITY:=0.01}"
if [ "${TINY:-0}" = 1 ]; then
  : "${HS:=2}"
else
  : "${HS:=10 50}" "${RATES:=100mbit}"
  export RATES
fi
if [ -z "${METHODS:-}" ]; then
  mc="--method-option momentum=0.9"
  rows=("spardl_fp16_mc=--method spardl --density $DENSITY --wire fp16 $mc" "powersgd=--method powersgd")
  for h in $HS; do
    rows+=("diloco_dense_h$h=--method dense --local-steps $h")
    rows+=("diloco_spardl_h$h=--method spardl --density $DENSITY --local-steps $h")
    rows+=("diloco_topk_h$h=--method topk --density $DENSITY --local-steps $h")
  done
  METHODS=$(IFS=';' && echo "${rows[*]}")
  export METHODS
fi
exec "$here/time_to_accuracy.sh" "$@"
