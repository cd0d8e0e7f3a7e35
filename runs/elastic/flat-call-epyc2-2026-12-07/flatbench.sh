# Interleaved: the flat call at P = 4 (replayed local work, n = 14.7M, SparDL), before (df2f5ae) and after.
export OMP_NUM_THREADS=1
for round in 4 5 6; do
  for tree in /work/main /tmp/basewt; do
    (cd $tree && /work/main/.venv/bin/python scripts/bench_allreduce.py --replay 4 --numel 14728266 --density 0.01 --methods spardl,topk --iters 10 --json /tmp/flat-$(basename $tree)-$round.json > /dev/null 2>&1)
    /work/main/.venv/bin/python -c "
import json,sys; rows=json.load(open('/tmp/flat-$(basename $tree)-$round.json'))
print('$round', '$(basename $tree)', ' '.join(f\"{r['method']} {r['median_ms']:.1f}ms\" for r in rows))"
  done
done
