#!/usr/bin/env bash
# Train under MPI and go on after a lost rank: relaunch with --resume, perhaps on fewer ranks.
#
#   scripts/elastic_mpi.sh "4 3 2" [main_trainer.py flags...]      (needs --checkpoint-dir)
#
# An MPI job cannot shrink: when a rank dies, mpiexec ends the whole job. This loop starts the
# run on the first world size of the list, and after every failure relaunches it with --resume
# on the next one (the last one repeats), so the run goes on from its newest complete checkpoint
# with the error-feedback state resharded to the new number of ranks (docs/ELASTIC.md). Use
# --checkpoint-every ITERS to lose at most ITERS iterations per failure. Each relaunch prints
# one line: which attempt, after what exit status, on how many ranks, and how long the failed
# attempt's last checkpoint-to-death took is in the trainer's own "resumed ..." line.
#
# It stops at success (exit 0), at bad input (exit 2: a relaunch would fail alike), at an
# interrupt (exit 130: Ctrl-C is not a crash), or after RESTARTS relaunches. Environment:
#   RESTARTS  most relaunches (default 5)
#   ATTEMPT_TIMEOUT  seconds after which an attempt that has not ended is ended (SIGTERM, then
#             SIGKILL 10 s later) and counted as failed: a launcher that does not end the job
#             after a lost rank then cannot hold the loop (default: no limit)
#   MPIEXEC   launcher (default .venv/bin/mpiexec if present, else mpiexec on PATH)
#   PYTHON    interpreter (default .venv/bin/python if present, else python3)
#   MPIEXEC_FLAGS  extra launcher flags (a hostfile, for instance), split on spaces
set -uo pipefail
if [ $# -lt 1 ] || [ -z "${1// /}" ]; then
  echo "usage: $0 \"WORLD_SIZES\" [main_trainer.py flags...]  (for example \"4 3 2\")" >&2
  exit 2
fi
read -r -a sizes <<<"$1"
shift
for size in "${sizes[@]}"; do
  if ! [[ $size =~ ^[1-9][0-9]*$ ]]; then
    echo "$0: world sizes must be positive integers, got '$size'" >&2
    exit 2
  fi
done
case " $* " in
*" --checkpoint-dir "*) ;;
*)
  echo "$0: needs --checkpoint-dir DIR (the relaunches resume from it)" >&2
  exit 2
  ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
mpiexec=${MPIEXEC:-$([ -x "$here/.venv/bin/mpiexec" ] && echo "$here/.venv/bin/mpiexec" || echo mpiexec)}
python=${PYTHON:-$([ -x "$here/.venv/bin/python" ] && echo "$here/.venv/bin/python" || echo python3)}
restarts=${RESTARTS:-5}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MPIR_CVAR_POLLS_BEFORE_YIELD=1 MPIR_CVAR_ENABLE_HEAVY_YIELD=1
read -r -a launcher_flags <<<"${MPIEXEC_FLAGS:-}"
limit=()
if [ -n "${ATTEMPT_TIMEOUT:-}" ]; then
  if ! [[ $ATTEMPT_TIMEOUT =~ ^[1-9][0-9]*$ ]]; then
    echo "$0: ATTEMPT_TIMEOUT must be a positive number of seconds, got '$ATTEMPT_TIMEOUT'" >&2
    exit 2
  fi
  limit=(timeout --kill-after=10 "$ATTEMPT_TIMEOUT")
fi
attempt=0
resume=()
while :; do
  index=$((attempt < ${#sizes[@]} ? attempt : ${#sizes[@]} - 1))
  size=${sizes[$index]}
  started=$(date +%s)
  "${limit[@]}" "$mpiexec" "${launcher_flags[@]}" -n "$size" "$python" "$here/main_trainer.py" \
    "$@" "${resume[@]}"
  status=$?
  ended=$(date +%s.%N)
  if [ ${#limit[@]} -gt 0 ] && [ $(($(date +%s) - started)) -ge "$ATTEMPT_TIMEOUT" ] &&
    { [ "$status" = 124 ] || [ "$status" = 137 ]; }; then
    echo "$0: attempt $((attempt + 1)) had not ended after ATTEMPT_TIMEOUT=$ATTEMPT_TIMEOUT s; ended it" >&2
  fi
  case $status in
  0 | 2 | 130) exit "$status" ;;
  esac
  if [ "$attempt" -ge "$restarts" ]; then
    echo "$0: attempt $((attempt + 1)) failed (exit $status); no relaunch left (RESTARTS=$restarts)" >&2
    exit "$status"
  fi
  attempt=$((attempt + 1))
  next=${sizes[$((attempt < ${#sizes[@]} ? attempt : ${#sizes[@]} - 1))]}
  echo "$0: attempt $attempt failed (exit $status); relaunching on $next ranks with --resume" \
    "($(awk -v a="$ended" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s after it ended)" >&2
  resume=(--resume)
done
