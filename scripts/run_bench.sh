#!/usr/bin/env bash
# Run the benchmark under mpiexec with the settings that make oversubscribed timings meaningful:
# one thread per rank, and MPICH ranks that yield the CPU while they wait.
#   scripts/run_bench.sh -n 4 --numel 14728266 --density 0.01 --json bench.json
# The first two arguments are "-n P"; the rest go to scripts/bench_allreduce.py.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  echo "usage: $0 -n WORKERS [bench_allreduce.py options]; the options:"
  exec "$python" "$root/scripts/bench_allreduce.py" --help
fi
if [ "$#" -lt 2 ] || [ "$1" != "-n" ]; then
  echo "usage: $0 -n WORKERS [bench_allreduce.py options]" >&2
  exit 2
fi
workers="$2"
if ! [[ "$workers" =~ ^[1-9][0-9]*$ ]]; then
  echo "$0: -n takes a worker count >= 1, got '$workers'" >&2
  exit 2
fi
shift 2
export OMP_NUM_THREADS=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1 MPIR_CVAR_ENABLE_HEAVY_YIELD=1
mpiexec="${MPIEXEC:-$(dirname "$python")/mpiexec}"
exec "$mpiexec" -n "$workers" "$python" "$root/scripts/bench_allreduce.py" "$@"
