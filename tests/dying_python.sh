#!/usr/bin/env bash
# A Python for scripts/elastic_mpi.sh's test: rank 1 of the first attempt is killed (SIGKILL)
# once the first checkpoint within an epoch is complete, as a lost worker would be; every other
# process is the plain interpreter. DYING_MARKER names the file that says it happened.
set -u
python=${REAL_PYTHON:?}
if [ "${PMI_RANK:-}" != 1 ] || [ -e "$DYING_MARKER" ]; then
  exec "$python" "$@"
fi
"$python" "$@" &
child=$!
for _ in $(seq 600); do
  if compgen -G "$DYING_CHECKPOINTS/epoch-*-iter-*/rank-0001.pt" >/dev/null; then
    touch "$DYING_MARKER"
    kill -9 "$child"
    wait "$child"
    exit 137
  fi
  kill -0 "$child" 2>/dev/null || break
  sleep 0.1
done
wait "$child"
