#!/usr/bin/env bash
# ResNet-50 on ImageNet, 90 epochs, dense all-reduce: the authors' settings (configs/resnet50.json).
# Environment (NWORKERS, HOSTS, DATA_DIR, DENSITY, ...) and extra flags: see run_experiment.sh.
exec "$(dirname "$0")/run_experiment.sh" resnet50 dense "$@"
