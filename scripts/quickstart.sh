#!/usr/bin/env bash
# One command from a fresh clone to a trained model:
#
#     bash scripts/quickstart.sh [TRAINER FLAGS...]
#
# 1. creates .venv (Python 3.9 or newer) if it is missing;
# 2. installs the requirements and the library into it, taking the CPU build of torch where no
#    NVIDIA GPU is present (the default Linux wheel brings about 4 GB of CUDA libraries);
# 3. runs the default training, 4 ranks under mpiexec (8x8 digits, offline), and prints its
#    final test accuracy.
#
# A second run reuses .venv: it installs again only when requirements.txt or pyproject.toml
# changed. Flags after the script's name go to main_trainer.py (e.g. --compression --compressor
# spardl --density 0.01). NWORKERS sets the rank count (default 4), PYTHON the interpreter that
# creates .venv (default python3), LOG_DIR where the run's metrics go (default runs/quickstart).
set -euo pipefail
cd "$(dirname "$0")/.."

NWORKERS=${NWORKERS:-4}
PYTHON=${PYTHON:-python3}
LOG_DIR=${LOG_DIR:-runs/quickstart}
VENV=.venv
STAMP=$VENV/.quickstart-installed
say() { printf 'quickstart: %s\n' "$*"; }
fail() { printf 'quickstart: error: %s\n' "$*" >&2; exit 1; }

case $NWORKERS in '' | *[!0-9]* | 0) fail "NWORKERS must be a positive integer, got '$NWORKERS'" ;; esac

if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PYTHON" >/dev/null 2>&1 || fail "$PYTHON not found; install Python 3.9 or newer, or set PYTHON"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 9))' \
    || fail "$PYTHON is $("$PYTHON" -V 2>&1); Python 3.9 or newer is needed (set PYTHON)"
  say "creating $VENV with $("$PYTHON" -V 2>&1)"
  "$PYTHON" -m venv "$VENV" || fail "could not create $VENV (on Debian: apt-get install python3-venv)"
fi

# What the installed environment was made from: a change to either file installs again.
wanted=$(cat requirements.txt pyproject.toml | cksum)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$wanted" ] \
  && "$VENV/bin/python" -c 'import torch, mpi4py, compressors' >/dev/null 2>&1; then
  say "reusing $VENV (requirements unchanged)"
else
  pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    say "NVIDIA GPU found: installing the default (CUDA) torch build"
  else
    say "no NVIDIA GPU: installing torch's CPU build where PyTorch's CPU index is reachable"
    torch_pins=$(grep -E '^(torch|torchvision)==' requirements.txt | sed 's/[[:space:]]*#.*//')
    cpu_log=$VENV/.quickstart-cpu-index.log
    # shellcheck disable=SC2086  # the pins are separate words
    if ! "${pip[@]}" --retries 0 --timeout 30 $torch_pins --index-url https://download.pytorch.org/whl/cpu \
      >"$cpu_log" 2>&1; then
      # pip's own reason (an unreachable index, a dependency it could not resolve), not a guess.
      reason=$(grep -E '^ERROR:' "$cpu_log" | tail -n 2 | tr '\n' ' ' | sed 's/[[:space:]]*$//')
      say "torch's CPU build did not install: ${reason:-pip gave no ERROR line} (pip's output: $cpu_log)"
      say "installing the default torch build of requirements.txt instead: it brings NVIDIA's CUDA" \
        "libraries, several GB more to download, which this machine cannot use"
    fi
  fi
  say "installing requirements.txt and the library into $VENV (the first time takes a few minutes)"
  "${pip[@]}" -r requirements.txt 2>&1 | grep -v '^WARNING: Location .* is ignored' || true
  "$VENV/bin/python" -c 'import torch, mpi4py' 2>/dev/null || fail "installing requirements.txt failed (see above)"
  "${pip[@]}" --no-deps --no-build-isolation -e . || fail "installing the library (pip install -e .) failed"
  printf '%s\n' "$wanted" >"$STAMP"
fi

[ -x "$VENV/bin/mpiexec" ] || fail "$VENV/bin/mpiexec is missing (the mpich wheel of requirements.txt brings it)"
# A --log-dir among the flags is where the metrics are read from; otherwise LOG_DIR.
log_flag=(--log-dir "$LOG_DIR")
previous=
help=
for arg in "$@"; do
  case $arg in
    --log-dir=*) LOG_DIR=${arg#--log-dir=} log_flag=() ;;
    -h | --help) help=1 ;;
  esac
  [ "$previous" = --log-dir ] && LOG_DIR=$arg log_flag=()
  previous=$arg
done
if [ -n "$help" ]; then  # the trainer's help: no training, no metrics to read
  exec "$VENV/bin/python" main_trainer.py "$@"
fi
say "training: $NWORKERS ranks, main_trainer.py ${log_flag[*]} $*"
# Nothing is removed here: the trainer checks the flags first (a bad one exits 2 and leaves
# LOG_DIR as it was), then starts metrics.jsonl anew, copying the earlier rows it would lose
# to metrics.jsonl.1 (.2, ...) first (docs/TRAINING.md, "Outputs").
"$VENV/bin/mpiexec" -n "$NWORKERS" "$VENV/bin/python" main_trainer.py --nworkers "$NWORKERS" \
  "${log_flag[@]}" "$@"
"$VENV/bin/python" - "$LOG_DIR/metrics.jsonl" <<'EOF'
import json
import sys

with open(sys.argv[1]) as metrics:
    last = [json.loads(line) for line in metrics if line.strip()][-1]
epochs = f"{last['epoch']} epoch" + ("s" if last["epoch"] != 1 else "")
print(
    f"quickstart: final test accuracy {100 * last['test_acc']:.2f}% after {epochs} "
    f"({last['compressor']}, {last['nworkers']} ranks); metrics in {sys.argv[1]}"
)
EOF
