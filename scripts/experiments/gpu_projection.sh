#!/usr/bin/env bash
# The GPU-cluster projection of docs/CHOOSING.md ("On GPU clusters, projected"), on a CPU:
#
#   scripts/experiments/gpu_projection.sh OUT
#
# Writes under OUT:
#   ops_fp32.json, ops_fp16.json   this library's operations per call (python -m syncbench.opcount,
#                                  P = 2..32: the projection fits P <= 16 and checks P = 32)
#   projection.json                the projected rows (python -m syncbench.gpu_projection)
#   projection.txt                 its tables and the fit's check
#
# Settings (environment): PYTHON (default .venv/bin/python, as common.sh has it); WORKERS (the projected P,
# default 8,16,32,64,128,256); REPLAYS (the GPU replay rows, default the kept H200 rows of
# 2026-11-28 under runs/lean-engine/).
set -euo pipefail
source "$(dirname "$0")/common.sh"
usage_out "$0" "$@"
out=$(mkdir -p "$1" && cd "$1" && pwd)
gpu="$root/runs/lean-engine/gpu-h200-2026-11-28"
: "${WORKERS:=8,16,32,64,128,256}"
: "${REPLAYS:=$gpu/replay_call1.json $gpu/call2_replay_1.json $gpu/call2_replay_2.json $gpu/call3_replay_1.json $gpu/call3_replay_2.json $gpu/call3_replay_3.json}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
cd "$root"
for wire in fp32 fp16; do
  "$python" -m syncbench.opcount --methods spardl,topk,gtopk --workers 2,4,8,16,32 \
    --wire "$wire" --json "$out/ops_$wire.json" >/dev/null
done
# shellcheck disable=SC2086 # REPLAYS is a list of paths
"$python" -m syncbench.gpu_projection --workers "$WORKERS" --replays $REPLAYS \
  --ops "$out/ops_fp32.json" "$out/ops_fp16.json" --json "$out/projection.json" \
  2>&1 | tee "$out/projection.txt"
"$python" -m trainreport.projection "$out/projection.json" | tee -a "$out/projection.txt"
