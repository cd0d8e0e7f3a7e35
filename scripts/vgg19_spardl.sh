#!/usr/bin/env bash
# VGG-19 on CIFAR-100, 161 epochs, SparDL: the authors' settings (configs/vgg19.json).
# Environment (NWORKERS, HOSTS, DATA_DIR, DENSITY, ...) and extra flags: see run_experiment.sh.
exec "$(dirname "$0")/run_experiment.sh" vgg19 spardl "$@"
