#!/usr/bin/env bash
# Killed and continued: a 4-rank run loses its ranks and goes on at another world size.
#
#   scripts/experiments/elastic.sh OUT
#
# Trains MODEL (widemlp) on Fashion-MNIST for one epoch with SparDL (density 0.01, momentum
# correction 0.9), checkpointing every EVERY (50) iterations, on loopback:
#   straight/  4 ranks, never interrupted;
#   killed/    the same run, killed (SIGKILL to every rank) once the checkpoint of iteration
#              KILL_AT (200) is complete, then continued with --resume on 3 ranks (killed/on3)
#              and, from a copy of the same checkpoints, on 2 ranks (killed/on2);
#   repeated/  one run killed FAULTS (5) times, each time a random 0-3 s after a new checkpoint,
#              and relaunched with --resume on the next of 4 3 2 3 4 ... ranks until it finishes.
# Each directory keeps the trainer's metrics.jsonl and its output; OUT/summary.txt gives the
# final accuracies, what each restart resumed and the seconds from each kill to the restarted
# run's "resumed" line (the restart time under MPI: a relaunch, data and model built again).
set -euo pipefail
if [ "$#" -ne 1 ] || [ "${1:0:1}" = - ]; then
  echo "usage: $0 OUT (settings in the environment: see the script's header)" >&2
  exit 2
fi
out=$1
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
mpiexec="${MPIEXEC:-$(dirname "$python")/mpiexec}"
export OMP_NUM_THREADS=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1 MPIR_CVAR_ENABLE_HEAVY_YIELD=1
: "${MODEL:=widemlp}" "${DATASET:=fashion-mnist}" "${EVERY:=50}" "${KILL_AT:=200}" "${FAULTS:=5}"
flags=(--dnn "$MODEL" --dataset "$DATASET" --max-epochs 1 --method spardl --density 0.01
  --method-option momentum=0.9 --checkpoint-every "$EVERY" --seed 0)
mkdir -p "$out"

train() {  # $1 ranks, $2 directory, rest: extra flags; the trainer's output in $2/out.txt
  local ranks=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  "$mpiexec" -n "$ranks" "$python" "$root/main_trainer.py" "${flags[@]}" --log-dir "$dir/log" \
    --checkpoint-dir "$dir/ckpt" "$@" >>"$dir/out.txt" 2>&1
}

complete() {  # $1 checkpoint directory: whether every rank of its WORLD wrote its file
  [ -f "$1/WORLD" ] || return 1
  local world
  world=$(cat "$1/WORLD")
  for ((rank = 0; rank < world; rank++)); do
    [ -f "$1/$(printf 'rank-%04d.pt' "$rank")" ] || return 1
  done
}

kill_when() {  # $1 pid of mpiexec, $2 checkpoint directory to wait for; prints the kill time
  while ! complete "$2"; do
    kill -0 "$1" 2>/dev/null || return 1
    sleep 0.05
  done
  pkill -9 -f "main_trainer.py.*$(dirname "$2")" || true
  date +%s.%N
}

resumed_after() {  # $1 kill time, $2 output file: seconds to the "resumed" line (polled)
  while ! grep -q "^resumed" "$2"; do sleep 0.05; done
  awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'
}

accuracy() { "$python" -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])['test_acc'])" "$1/log/metrics.jsonl"; }

[ -f "$out/straight/log/metrics.jsonl" ] || train 4 "$out/straight"

if [ ! -f "$out/killed/on2/log/metrics.jsonl" ]; then
  rm -rf "$out/killed"
  train 4 "$out/killed/first" &
  job=$!
  killed=$(kill_when "$job" "$out/killed/first/ckpt/$(printf 'epoch-0000-iter-%06d' "$KILL_AT")")
  wait "$job" || true
  for ranks in 3 2; do
    mkdir -p "$out/killed/on$ranks"
    cp -r "$out/killed/first/ckpt" "$out/killed/on$ranks/ckpt"
    cp -r "$out/killed/first/log" "$out/killed/on$ranks/log"
    train "$ranks" "$out/killed/on$ranks" --resume &
    job=$!
    echo "on$ranks restart_seconds $(resumed_after "$killed" "$out/killed/on$ranks/out.txt")" \
      >>"$out/killed/restarts.txt"
    wait "$job"
    killed=$(date +%s.%N)  # the second continuation starts from the same kill, now
  done
fi

if ! grep -qs '"epoch": 1' "$out/repeated/log/metrics.jsonl"; then
  rm -rf "$out/repeated"
  mkdir -p "$out/repeated"
  "$python" - "$out/repeated" "$FAULTS" "$mpiexec" "$python" "$root/main_trainer.py" "${flags[@]}" <<'PY'
"""Kill the run FAULTS times, each a random 0-3 s after a new complete checkpoint, relaunching
it with --resume on the next of 4 3 2 3 4 3 ranks; then let it finish."""
import os, random, signal, subprocess, sys, time
from pathlib import Path

out, faults, launcher, *trainer = sys.argv[1:]
out, faults, rng = Path(out), int(faults), random.Random(0)
ckpt, sizes = out / "ckpt", [4, 3, 2, 3, 4, 3]


def complete(directory):
    world = directory / "WORLD"
    if not world.is_file():
        return False
    return all((directory / f"rank-{r:04d}.pt").is_file() for r in range(int(world.read_text())))


def newest():
    done = [d.name for d in ckpt.iterdir() if complete(d)] if ckpt.is_dir() else []
    return max(done) if done else None


with open(out / "out.txt", "a") as log, open(out / "restarts.txt", "w") as restarts:
    killed = None
    for fault in range(faults + 1):
        ranks = sizes[fault % len(sizes)]
        command = [launcher, "-n", str(ranks), *trainer, "--log-dir", str(out / "log")]
        command += ["--checkpoint-dir", str(ckpt)] + (["--resume"] if fault else [])
        before = newest()
        log.write(f"--- attempt {fault} on {ranks} ranks\n")
        log.flush()
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
        resumed, stopped = None, False
        for line in job.stdout:
            log.write(line)
            log.flush()
            if line.startswith("resumed") and killed is not None:
                resumed = line.strip()
                restarts.write(f"restart {fault} on {ranks} ranks: {time.time() - killed:.1f} s "
                               f"from the kill to '{resumed}'\n")
                restarts.flush()
            if fault < faults and line.startswith("epoch 1:"):  # a progress line: look around
                latest = newest()
                if latest is not None and latest != before:
                    time.sleep(rng.uniform(0, 3))
                    os.killpg(job.pid, signal.SIGKILL)
                    killed, stopped = time.time(), True
                    break
        job.wait()
        if fault < faults and not stopped:
            sys.exit("the run ended before it could be killed")
        log.write(f"--- attempt {fault} ended with {job.returncode}\n")
    sys.exit(job.returncode)
PY
fi

{
  echo "straight 4 ranks: test_acc $(accuracy "$out/straight")"
  for ranks in 3 2; do
    echo "killed after iteration $KILL_AT, continued on $ranks: test_acc $(accuracy "$out/killed/on$ranks")"
  done
  cat "$out/killed/restarts.txt"
  echo "repeated faults ($FAULTS): test_acc $(accuracy "$out/repeated")"
  cat "$out/repeated/restarts.txt"
} >"$out/summary.txt"
rm -rf "$out"/straight/ckpt "$out"/killed/*/ckpt "$out"/repeated/ckpt  # gigabytes; not kept
cat "$out/summary.txt"
