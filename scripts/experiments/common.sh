# Shared by the experiment scripts of this folder (sourced, not run). Settings come from the
# environment; TINY=1 shrinks everything to a smoke test (2 ranks, the MLP on scikit-learn's
# digits, 2 iterations, no shaped network, no lock) that needs neither root nor minutes.
#
#   LOCK        file every training or bench run holds while it measures (default
#               /tmp/measure.lock; empty: no lock), so that measurements of other jobs interleave
#               between runs instead of overlapping them
#   NWORKERS    ranks (default 4)
#   MODEL       trainer model (default widemlp: 10,020,874 parameters) on DATASET
#               (default fashion-mnist)
#   CAP         wall-clock seconds one training run may take, start-up included (default 120);
#               a run still going then is stopped with SIGINT after its current iteration, and
#               the tables report it as capped
#   SHAPE       0: run on the unshaped loopback (no root needed); default 1
#   HOSTS       with SHAPE=1: emulate that many hosts (scripts/cluster_network.sh, NWORKERS/HOSTS
#               ranks each, every host's link at the rate) instead of one shaped loopback
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
mpiexec="${MPIEXEC:-$(dirname "$python")/mpiexec}"
export OMP_NUM_THREADS=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1 MPIR_CVAR_ENABLE_HEAVY_YIELD=1

if [ "${TINY:-0}" = 1 ]; then
  : "${NWORKERS:=2}" "${MODEL:=mlp}" "${DATASET:=digits}" "${CAP:=60}" "${SHAPE:=0}"
  : "${LOCK:=}"
else
  : "${NWORKERS:=4}" "${MODEL:=widemlp}" "${DATASET:=fashion-mnist}" "${CAP:=120}" "${SHAPE:=1}"
  : "${LOCK=/tmp/measure.lock}"
fi

usage_out() {  # $1: the script's name; exits 2 unless exactly one argument (OUT) was given
  if [ "$#" -ne 2 ] || [ "${2:0:1}" = - ]; then
    echo "usage: $1 OUT (settings in the environment: see the script's header)" >&2
    exit 2
  fi
}

# locked CMD...: run CMD holding $LOCK (or just run it without a lock file).
locked() {
  if [ -n "$LOCK" ]; then flock "$LOCK" "$@"; else "$@"; fi
}

# network_prefix RATE: print (NUL-separated) the command prefix that runs a command on a
# loopback shaped to RATE (or unshaped with SHAPE=0, the rows still recording RATE).
network_prefix() {
  if [ "$SHAPE" = 1 ] && [ -n "${HOSTS:-}" ]; then
    printf '%s\0' "$root/scripts/cluster_network.sh" --hosts "$HOSTS" \
      --ranks-per-host $((NWORKERS / HOSTS)) --rate "$1" --
  elif [ "$SHAPE" = 1 ]; then
    printf '%s\0' "$root/scripts/shaped_network.sh" --rate "$1" --
  else
    printf '%s\0' env "SPARDL_NETWORK_RATE=$1"
  fi
}

# record FILE RATE CAP STATUS STARTED CMD...: write a run's run.json (what ran, where, how it
# ended), with paths as seen from the repository root and the run's folder as RUN_DIR.
record() {
  "$python" - "$root" "$@" <<'PY'
import json, os, sys
root, path, rate, cap, status, started, *command = sys.argv[1:]
line = " ".join(command).replace(os.path.dirname(path), "RUN_DIR").replace(root + "/", "")
with open(path, "w") as stream:
    json.dump({"rate": rate, "cap_seconds": float(cap), "status": int(status),
               "started": started, "command": line}, stream, indent=1)
PY
}

# train DIR RATE ITERS EPOCHS [trainer flags...]: one training run into DIR (metrics.jsonl,
# run.json, log.txt), at most ITERS iterations per epoch (empty: all; an evaluation after each
# epoch) and EPOCHS epochs, stopped after CAP seconds. A DIR whose run.json exists is kept: rerunning a script
# continues where it stopped (delete the DIR to measure it again).
train() {
  local dir=$1 rate=$2 iters=$3 epochs=$4
  shift 4
  if [ -f "$dir/run.json" ]; then
    echo "kept $dir (run before)" >&2
    return 0
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  local command=("$mpiexec" -n "$NWORKERS" "$python" "$root/main_trainer.py" --dnn "$MODEL"
    --dataset "$DATASET" ${iters:+--max-iters "$iters"} --max-epochs "$epochs" --log-dir "$dir"
    "$@")
  local prefix started status=0
  mapfile -d '' prefix < <(network_prefix "$rate")
  echo "run $dir: ${command[*]} (network $rate, cap ${CAP}s)" >&2
  started=$(date -u +%FT%TZ)
  (cd "$root" && locked timeout -s INT -k 30 "$CAP" "${prefix[@]}" "${command[@]}") \
    >"$dir/log.txt" 2>&1 || status=$?
  record "$dir/run.json" "$rate" "$CAP" "$status" "$started" "${command[@]}"
  [ "$status" = 0 ] || echo "  exit status $status (124: stopped at the cap of ${CAP}s)" >&2
  return 0
}
