#!/usr/bin/env bash
# LSTM on IMDB, 31 epochs, SparDL: the authors' settings (configs/lstmimdb.json; batch 1 per worker).
# DATA_DIR holds aclImdb/ or imdb_train.csv and imdb_test.csv (docs/TRAINING.md).
# Environment (NWORKERS, HOSTS, DATA_DIR, DENSITY, ...) and extra flags: see run_experiment.sh.
exec "$(dirname "$0")/run_experiment.sh" lstmimdb spardl "$@"
