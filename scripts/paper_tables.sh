#!/usr/bin/env bash
# Measure the paper's training tables on shaped networks on one machine and report them.
#
#   sudo scripts/paper_tables.sh [OUT_DIR]         (default OUT_DIR: paper_tables)
#
# Two tables, each for every method on NWORKERS ranks on every rate of RATES, every run inside
# scripts/shaped_network.sh (its own namespace whose loopback is shaped to the rate):
#   vgg16          VGG-16 on synthetic-cifar10 (random CIFAR-shaped images: timing only, its
#                  accuracy means nothing): time per iteration split into compute, selection,
#                  communication and the rest, bytes per iteration, SparDL's speed-up.
#   fashion-mnist  the small CNN on Fashion-MNIST (real data): the same, plus test accuracy
#                  against wall time and the time to TARGET_ACCURACY.
# Runs go to OUT_DIR/runs/TABLE/RATE_METHOD (metrics.jsonl and train.log; a rerun replaces
# them), the reports (scripts/report.py: report.md and figures) to OUT_DIR/TABLE.
#
# Environment variables (defaults in brackets):
#   RATES             tc rates, space-separated; loopback = unshaped [100mbit 1gbit 10gbit]
#   METHODS           methods, space-separated [dense topk gtopk oktopk spardl]
#   TABLES            tables to make [vgg16 fashion-mnist]
#   NWORKERS          MPI ranks [4]
#   VGG_EPOCHS, VGG_ITERS   epochs and iterations per epoch of every VGG-16 run [1, 10]
#   CNN_EPOCHS, CNN_ITERS   the same for the CNN runs (ITERS empty: whole epochs) [5, 100]
#   DENSITY           kept fraction of the sparse methods [0.01]
#   TARGET_ACCURACY   Fashion-MNIST test accuracy whose time is reported [0.8]
#   DATA_DIR          main_trainer.py --data-dir (Fashion-MNIST is also found in Debian's
#                     /usr/share/datasets/fashion-mnist: apt-get install dataset-fashion-mnist)
#   PYTHON, MPIEXEC   interpreter and launcher [.venv/bin/python, .venv/bin/mpiexec if present]
# OMP_NUM_THREADS (1), MPIR_CVAR_POLLS_BEFORE_YIELD (1) and MPIR_CVAR_ENABLE_HEAVY_YIELD (1)
# are set where the caller has not set them: ranks outnumber the cores of a small machine.
#
# Needs root (the namespaces) unless RATES is just loopback. Every rate and method is checked
# before the first run; the script stops at the first run that fails, with the end of its log.
set -euo pipefail

if [ $# -gt 1 ] || [[ "${1:-}" == -* ]]; then
    echo "usage: $0 [OUT_DIR]   (settings: environment variables, see the top of this script)" >&2
    exit 2
fi
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
out=$(absolute "${1:-paper_tables}")
data_dir=${DATA_DIR:+$(absolute "$DATA_DIR")}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

read -r -a rates <<<"${RATES:-100mbit 1gbit 10gbit}"
read -r -a methods <<<"${METHODS:-dense topk gtopk oktopk spardl}"
read -r -a tables <<<"${TABLES:-vgg16 fashion-mnist}"
nworkers=${NWORKERS:-4}
density=${DENSITY:-0.01}
target=${TARGET_ACCURACY:-0.8}
python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
mpiexec=${MPIEXEC:-$([ -x .venv/bin/mpiexec ] && echo .venv/bin/mpiexec || echo mpiexec)}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MPIR_CVAR_POLLS_BEFORE_YIELD=${MPIR_CVAR_POLLS_BEFORE_YIELD:-1}
export MPIR_CVAR_ENABLE_HEAVY_YIELD=${MPIR_CVAR_ENABLE_HEAVY_YIELD:-1}

fail() { echo "paper_tables.sh: $1" >&2; exit 2; }
[ ${#rates[@]} -gt 0 ] && [ ${#methods[@]} -gt 0 ] && [ ${#tables[@]} -gt 0 ] || \
    fail "RATES, METHODS and TABLES must each name at least one"
for table in "${tables[@]}"; do
    case "$table" in
        vgg16|fashion-mnist) ;;
        *) fail "unknown table '$table' in TABLES; choose vgg16, fashion-mnist" ;;
    esac
done
for rate in "${rates[@]}"; do  # the shaping script checks the rate, root and tc, then cleans up
    [ "$rate" = loopback ] || scripts/shaped_network.sh --rate "$rate" -- true || \
        fail "cannot shape a network to RATES entry '$rate' (above: why)"
done
"$python" -c 'import sys, compressors; [compressors.resolve(name) for name in sys.argv[1:]]' "${methods[@]}" \
    2>/dev/null || fail "unknown method in METHODS '${methods[*]}'; choose from: $("$python" -c \
    'import compressors; print(", ".join(compressors.available()))')"

data=()
[ -z "$data_dir" ] || data=(--data-dir "$data_dir")

# run TABLE RATE METHOD MODEL DATASET EPOCHS ITERS: one training run into OUT_DIR/runs/TABLE/RATE_METHOD.
run() {
    local table=$1 rate=$2 method=$3 model=$4 dataset=$5 epochs=$6 iters=$7
    local dir="$out/runs/$table/${rate}_$method" started=$SECONDS
    rm -rf "$dir"
    mkdir -p "$dir"
    local command=("$mpiexec" -n "$nworkers" "$python" main_trainer.py --dnn "$model" --dataset "$dataset"
                   --nworkers "$nworkers" --max-epochs "$epochs" --log-dir "$dir" "${data[@]}")
    [ -z "$iters" ] || command+=(--max-iters "$iters")
    [ "$method" = dense ] || command+=(--compression --compressor "$method" --density "$density")
    [ "$rate" = loopback ] || command=(scripts/shaped_network.sh --rate "$rate" -- "${command[@]}")
    printf '%s %-8s %-8s ... ' "$table" "$rate" "$method"
    if ! "${command[@]}" >"$dir/train.log" 2>&1; then
        echo "failed; the end of $dir/train.log:"
        tail -n 20 "$dir/train.log"
        exit 1
    fi
    echo "$((SECONDS - started)) s"
}

for table in "${tables[@]}"; do
    if [ "$table" = vgg16 ]; then
        settings=(vgg16 synthetic-cifar10 "${VGG_EPOCHS:-1}" "${VGG_ITERS-10}")
        report=()
    else
        settings=(cnn fashion-mnist "${CNN_EPOCHS:-5}" "${CNN_ITERS-100}")
        report=(--target-accuracy "$target")
    fi
    for rate in "${rates[@]}"; do
        for method in "${methods[@]}"; do
            run "$table" "$rate" "$method" "${settings[@]}"
        done
    done
    runs=()
    for rate in "${rates[@]}"; do
        for method in "${methods[@]}"; do
            runs+=("$out/runs/$table/${rate}_$method")
        done
    done
    "$python" scripts/report.py "${runs[@]}" "${report[@]}" --out "$out/$table" >/dev/null
    echo "$table: $out/$table/report.md"
done
