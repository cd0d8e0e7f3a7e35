#!/usr/bin/env bash
# The GPU figures of docs/PERFORMANCE.md ("On a GPU"), on a machine with one CUDA device and an
# MPI (ranks share the device; the MPI need not be CUDA-aware). Run from anywhere:
#
#   scripts/experiments/gpu.sh OUT
#
# Writes under OUT (each step's output also goes to OUT/log.txt):
#   mpi_cuda.txt      every method over MPI on CUDA gradients against the CPU, 4 ranks, with
#                     the transport's waits for the GPU and all host synchronizations per call
#   replay.json       one rank's local work on the GPU (scripts/bench_allreduce.py --replay 4
#                     --device cuda, n = 14,728,266, density 0.01, --count-ops)
#   ops.json          SparDL's operations and host synchronizations per call on the GPU, P = 2..32
#   bert_overlap_MB.jsonl, bert_blocking.jsonl
#                     bert-base, 4 ranks sharing the GPU, spardl at density 0.01: the trainer's
#                     metrics with overlapped buckets of MB MiB (each of BUCKETS) and with
#                     --no-overlap
#   tests.txt         the CUDA tests (pytest -m gpu)
#
# Settings (environment): PYTHON (default the python3 on the PATH), MPIEXEC (default mpiexec, else mpirun),
# ITERS (bert iterations, default 20), BUCKETS (default 25), STEPS (default "mpi replay ops bert tests"), WORK (the
# bert runs' log folders, default /tmp/gpu-work: OUT keeps only the files above), TEXT (a
# folder of UTF-8 text for bert; default: WORK/text, copied from /usr/share/common-licenses and
# the machine's Debian copyright files).
set -uo pipefail

if [ "$#" -ne 1 ] || [ "${1:0:1}" = - ]; then
  echo "usage: $0 OUT (settings in the environment: see the script's header)" >&2
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out=$(mkdir -p "$1" && cd "$1" && pwd)
python=$(command -v "${PYTHON:-python3}")  # absolute: mpiexec's ranks may not see this PATH
mpiexec=${MPIEXEC:-$(command -v mpiexec || command -v mpirun)}
: "${ITERS:=20}" "${STEPS:=mpi replay ops bert tests}" "${WORK:=/tmp/gpu-work}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # Open MPI, in a container
cd "$root" || exit 1
if ! "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
  echo "$0: needs a CUDA device that $python's torch can use" >&2
  exit 2
fi
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$out/log.txt"; }

step_mpi() {
  "$mpiexec" -n 4 "$python" tests/mpi_cuda_check.py 2>&1 | tee "$out/mpi_cuda.txt"
}

step_replay() {
  "$python" scripts/bench_allreduce.py --replay 4 --device cuda --numel 14728266 \
    --methods spardl,topk,gtopk,oktopk,zen --wire fp32,fp16 --iters 10 --warmup 2 \
    --count-ops --json "$out/replay.json"
}

step_ops() {
  "$python" -m syncbench.opcount --methods spardl,topk,zen,oktopk --device cuda \
    --json "$out/ops.json"
}

bert() {  # $1: label; more: trainer flags
  local label=$1
  shift
  "$mpiexec" -n 4 "$python" main_trainer.py --dnn bert-base --dataset wikipedia \
    --data-dir "$text" --method spardl --density 0.01 --device cuda --max-epochs 1 \
    --max-iters "$ITERS" --batch-size 8 --clip-grad-norm 0 --log-dir "$WORK/bert_$label" "$@" &&
    cp "$WORK/bert_$label/metrics.jsonl" "$out/bert_$label.jsonl"
}

step_bert() {
  text=${TEXT:-$WORK/text}
  if [ ! -d "$text" ]; then
    mkdir -p "$text" && cp -r /usr/share/common-licenses "$text/"
    find /usr/share/doc -name copyright -size -256k | head -150 |
      while read -r file; do cp "$file" "$text/$(echo "$file" | tr / _)"; done
  fi
  for mb in ${BUCKETS:-25}; do
    bert "overlap_$mb" --bucket-mb "$mb" || return 1
  done
  bert blocking --no-overlap
}

step_tests() {
  "$python" -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tee "$out/tests.txt"
}

log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)" \
  "torch $("$python" -c 'import torch; print(torch.__version__)')"
status=0
for step in $STEPS; do
  log "step $step"
  "step_$step" 2>&1 | tee -a "$out/log.txt"
  code=${PIPESTATUS[0]}
  log "step $step: exit $code"
  [ "$code" = 0 ] || status=1
done
exit $status
