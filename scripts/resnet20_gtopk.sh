#!/usr/bin/env bash
# ResNet-20 on CIFAR-10, 121 epochs, gTop-k: the authors' settings (configs/resnet20.json).
# Environment (NWORKERS, HOSTS, DATA_DIR, DENSITY, ...) and extra flags: see run_experiment.sh.
exec "$(dirname "$0")/run_experiment.sh" resnet20 gtopk "$@"
