#!/usr/bin/env bash
# Interleaved: the flat call at P = 4 (replayed local work, n = 14.7M, SparDL and TopkA), in a
# checkout from before the feedback state (BEFORE, df2f5ae: `git worktree add BEFORE df2f5ae`)
# and in this one (AFTER). Rounds 1-3 ran BEFORE first, rounds 4-6 AFTER first; each writes
# flat-basewt-ROUND.json (before) and flat-main-ROUND.json (after) here.
#   BEFORE=/path/to/worktree AFTER=/path/to/checkout ROUNDS="1 2 3" runs/elastic/flat-call-epyc2-2026-12-07/flatbench.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-$AFTER/.venv/bin/python}
export OMP_NUM_THREADS=1
for round in ${ROUNDS:-1 2 3}; do
  for pair in "basewt=$BEFORE" "main=$AFTER"; do
    name=${pair%%=*} tree=${pair#*=}
    (cd "$tree" && "$python" scripts/bench_allreduce.py --replay 4 --numel 14728266 \
      --density 0.01 --methods spardl,topk --iters 10 --json "$here/flat-$name-$round.json" >/dev/null)
  done
done
