"""The per-experiment scripts: all present, and they launch main_trainer.py as documented."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.mpirun import BIN, ROOT

pytestmark = pytest.mark.mpi

SCRIPTS = Path(ROOT) / "scripts"
MODELS = ("vgg16", "vgg19", "resnet20", "resnet50")
METHODS = ("dense", "topk", "gtopk", "oktopk", "spardl")


def launch(script, *flags, cwd=ROOT, **env):
    """Run ``script`` in ``cwd`` with the trainer's environment and ``env``; return the result."""
    variables = dict(
        os.environ, PYTHON=str(Path(BIN) / "python"), MPIEXEC=str(Path(BIN) / "mpiexec"), **env
    )
    return subprocess.run(
        ["bash", str(script), *flags],
        cwd=cwd,
        env=variables,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_every_experiment_has_an_executable_script():
    for model in MODELS:
        for method in METHODS:
            script = SCRIPTS / f"{model}_{method}.sh"
            assert os.access(script, os.X_OK), script
            assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
            assert f'run_experiment.sh" {model} {method}' in script.read_text()
    assert (SCRIPTS / "slurm_example.sbatch").is_file()


def test_launcher_trains_with_the_environment_settings(tmp_path):
    """A relative RUN_ROOT is the caller's; a density other than the default gets a directory
    of its own (as does a dense warm-up other than the method's own), so it never resumes
    another setting's checkpoints."""
    result = launch(
        SCRIPTS / "run_experiment.sh",
        "cnn",
        "spardl",
        "--max-epochs",
        "1",
        "--max-iters",
        "4",
        cwd=tmp_path,
        NWORKERS="2",
        DENSITY="0.05",
        DENSE_WARMUP="2",
        RUN_ROOT="runs",
    )
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "runs" / "cnn_spardl_p2_density0.05_warmup2"
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert (row["compressor"], row["density"], row["nworkers"], row["iters"]) == (
        "spardl",
        0.05,
        2,
        4,
    )
    assert (run_dir / "checkpoints" / "epoch-0001" / "rank-0001.pt").is_file()


def test_experiment_script_uses_the_models_config(tmp_path):
    result = launch(
        SCRIPTS / "vgg16_dense.sh",
        NWORKERS="2",
        DATA_DIR=str(tmp_path),
        RUN_ROOT=str(tmp_path / "runs"),
    )
    assert result.returncode == 2
    assert "CIFAR-10 not found" in result.stderr  # configs/vgg16.json trains on cifar10


OWN_WARMUP = [
    ("vgg16", "spardl", 0),
    ("vgg16", "dense", 0),
    ("vgg16", "oktopk", 512),
    ("resnet20", "gtopk", 512),
    ("vgg19", "topk", 512),
    ("lstmimdb", "oktopk", 128),
    ("lstmimdb", "spardl", 0),
    ("bert", "oktopk", 0),
    ("resnet50", "gaussiank", 512),
]


def launched(tmp_path, model, method, **env):
    """The command line run_experiment.sh would start, from a launcher that only prints it."""
    echo = tmp_path / "echo-launcher"
    echo.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    echo.chmod(0o755)
    variables = {key: value for key, value in os.environ.items() if key != "DENSE_WARMUP"}
    variables.update(PYTHON="python", MPIEXEC=str(echo), RUN_ROOT=str(tmp_path / "runs"), **env)
    result = subprocess.run(
        ["bash", str(SCRIPTS / "run_experiment.sh"), model, method],
        env=variables,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\n"), result.stderr


@pytest.mark.parametrize("model,method,steps", OWN_WARMUP)
def test_each_method_gets_the_dense_warm_up_of_its_own_code(tmp_path, model, method, steps):
    args, note = launched(tmp_path, model, method)
    assert args[args.index("--dense-warmup") + 1] == str(steps)
    assert f"{steps} dense warm-up steps (the method's own" in note
    assert args[args.index("--log-dir") + 1] == str(tmp_path / "runs" / f"{model}_{method}_p6")


@pytest.mark.parametrize("model,method,steps", OWN_WARMUP[:4])
def test_dense_warmup_sets_one_count_for_every_method(tmp_path, model, method, steps):
    args, note = launched(tmp_path, model, method, DENSE_WARMUP="512")
    assert args[args.index("--dense-warmup") + 1] == "512" and "(DENSE_WARMUP)" in note
    suffix = "" if method == "dense" or steps == 512 else "_warmup512"  # its own directory
    assert args[args.index("--log-dir") + 1] == str(
        tmp_path / "runs" / f"{model}_{method}_p6{suffix}"
    )
