#!/usr/bin/env bash
# VGG-16 on CIFAR-10, 121 epochs, gTop-k: the authors' settings (configs/vgg16.json).
# Environment (NWORKERS, HOSTS, DATA_DIR, DENSITY, ...) and extra flags: see run_experiment.sh.
exec "$(dirname "$0")/run_experiment.sh" vgg16 gtopk "$@"
