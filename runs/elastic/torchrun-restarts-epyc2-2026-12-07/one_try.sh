cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1 PYTHONPATH=$(pwd)
d=$(mktemp -d)
port=$((29500 + RANDOM % 2000))
start=$(date +%s.%N)
timeout 180 .venv/bin/torchrun --nnodes 1 --nproc-per-node 2 --max-restarts 1 --rdzv-backend c10d --rdzv-endpoint localhost:$port --rdzv-id t$RANDOM examples/elastic_ddp.py --checkpoint-dir $d --steps 60 --checkpoint-every 10 --die-at-step 25 $EXTRA > $d/out 2>&1
rc=$?
echo "rc=$rc $(grep -h 'elastic_ddp' $d/out | tr '\n' '|') $(grep -ho 'connectFullMesh[^\n]*' $d/out | head -1 | cut -c1-100)"

rm -rf $d
