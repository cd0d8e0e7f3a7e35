#!/usr/bin/env bash
# Launch one of the paper's training runs: scripts/run_experiment.sh MODEL METHOD [FLAGS...]
#
# MODEL is a main_trainer.py --dnn name (its configs/MODEL.json holds the authors' batch size,
# learning rate, warm-up, decay epochs and data set); METHOD is dense or a compressor name.
# Extra FLAGS go to main_trainer.py and override everything else. Environment variables:
#   NWORKERS        MPI processes (default 6, the authors' non-power-of-two launcher)
#   HOSTS           comma-separated host names, one process slot each, cycled (default: local)
#   HOSTFILE        an MPI hostfile instead of HOSTS
#   MPIEXEC         launcher (default .venv/bin/mpiexec if present, else mpiexec on PATH)
#   PYTHON          interpreter (default .venv/bin/python if present, else python3)
#   DATA_DIR        data directory (default: main_trainer.py's, data)
#   DENSITY         kept fraction for sparse methods (default 0.01)
#   DENSE_WARMUP    dense iterations before sparsifying, the same for every method (for a
#                   controlled comparison); default: each method's own, as its released code
#                   runs it: spardl and dense 0 (SparDL's code has none); oktopk, topk, gtopk,
#                   gaussiank and topkdsa (all run from Ok-Topk's code) 512 on CNNs (its VGG
#                   code; it has no ResNet runs), 128 on lstm* models, 0 on bert*
#   TEAMS, SAG      SparDL's Spar-All-Gather teams and variant (default 1, bruck)
#   RUN_ROOT        logs go to RUN_ROOT/MODEL_METHOD_pN (plus _densityD, _teamsT, _sagS,
#                   _warmupW for settings other than the defaults), checkpoints below it
#                   (default runs)
# Relative paths given in DATA_DIR, HOSTFILE and RUN_ROOT are taken from the directory it is
# started in; the defaults are the repository's data/ and runs/.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 MODEL METHOD [main_trainer.py flags...]" >&2
  exit 2
fi
model=$1 method=$2
shift 2
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
data_dir=${DATA_DIR:+$(absolute "$DATA_DIR")}
hostfile=${HOSTFILE:+$(absolute "$HOSTFILE")}
run_root=${RUN_ROOT:+$(absolute "$RUN_ROOT")}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"  # the defaults (./data, ./runs) are the repository's

nworkers=${NWORKERS:-6}
python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
mpiexec=${MPIEXEC:-$([ -x .venv/bin/mpiexec ] && echo .venv/bin/mpiexec || echo mpiexec)}
density=${DENSITY:-0.01} teams=${TEAMS:-1} sag=${SAG:-bruck}
case "$method:$model" in
  spardl:* | dense:* | *:bert*) own_warmup=0 ;;
  *:lstm*) own_warmup=128 ;;
  *) own_warmup=512 ;;
esac
dense_warmup=${DENSE_WARMUP:-$own_warmup}
# One directory per setting: a run resumes only its own checkpoints.
run_dir=${run_root:-runs}/${model}_${method}_p${nworkers}
if [ "$method" != dense ]; then
  [ "$density" = 0.01 ] || run_dir+=_density$density
  [ "$teams" = 1 ] || run_dir+=_teams$teams
  [ "$sag" = bruck ] || run_dir+=_sag$sag
  [ "$dense_warmup" = "$own_warmup" ] || run_dir+=_warmup$dense_warmup
fi

launch=("$mpiexec" -n "$nworkers")
if [ -n "$hostfile" ]; then
  launch+=(-hostfile "$hostfile")
elif [ -n "${HOSTS:-}" ]; then
  mkdir -p "$run_dir"
  tr ',' '\n' <<<"$HOSTS" >"$run_dir/hosts"
  launch+=(-hostfile "$run_dir/hosts")
fi

data=()
if [ -n "$data_dir" ]; then
  data=(--data-dir "$data_dir")
fi

sync=()
if [ "$method" != dense ]; then
  sync=(--compression --compressor "$method" --density "$density" --teams "$teams" --sag "$sag")
fi

# Waiting ranks yield their core and use one thread each: needed when ranks outnumber cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MPIR_CVAR_POLLS_BEFORE_YIELD=${MPIR_CVAR_POLLS_BEFORE_YIELD:-1}
export MPIR_CVAR_ENABLE_HEAVY_YIELD=${MPIR_CVAR_ENABLE_HEAVY_YIELD:-1}

echo "$method on $model: $dense_warmup dense warm-up steps ($([ -n "${DENSE_WARMUP:-}" ] \
  && echo "DENSE_WARMUP" || echo "the method's own; DENSE_WARMUP=N sets N for every method"))" >&2
set -x
exec "${launch[@]}" "$python" main_trainer.py --dnn "$model" --nworkers "$nworkers" \
  "${data[@]}" "${sync[@]}" --dense-warmup "$dense_warmup" \
  --log-dir "$run_dir" --checkpoint-dir "$run_dir/checkpoints" --resume "$@"
