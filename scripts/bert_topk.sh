#!/usr/bin/env bash
# BERT-Base masked-LM pre-training on a text corpus (DATA_DIR: Wikipedia as plain text), TopkA (local top-k + all-gather)
# (configs/bert-base.json; a GPU model: run_experiment.sh bert-tiny topk trains the 2-layer one on CPUs).
# Environment (NWORKERS, HOSTS, DATA_DIR, DENSITY, ...) and extra flags: see run_experiment.sh.
exec "$(dirname "$0")/run_experiment.sh" bert-base topk "$@"
