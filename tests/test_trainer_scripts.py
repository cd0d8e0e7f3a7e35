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
    """Run ``script`` in ``cwd`` with the trainer's environment and ``env`` added; return the result."""
    variables = dict(os.environ, PYTHON=str(Path(BIN) / "python"),
                     MPIEXEC=str(Path(BIN) / "mpiexec"), **env)
    return subprocess.run(["bash", str(script), *flags], cwd=cwd, env=variables,
                          capture_output=True, text=True, timeout=240)


def test_every_experiment_has_an_executable_script():
    for model in MODELS:
        for method in METHODS:
            script = SCRIPTS / f"{model}_{method}.sh"
            assert os.access(script, os.X_OK), script
            assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
            assert f"run_experiment.sh\" {model} {method}" in script.read_text()
    assert (SCRIPTS / "slurm_example.sbatch").is_file()


def test_launcher_trains_with_the_environment_settings(tmp_path):
    """A relative RUN_ROOT is the caller's; a density other than the default gets a directory
    of its own, so it never resumes another setting's checkpoints."""
    result = launch(SCRIPTS / "run_experiment.sh", "cnn", "spardl", "--max-epochs", "1",
                    "--max-iters", "4", cwd=tmp_path, NWORKERS="2", DENSITY="0.05", DENSE_WARMUP="2",
                    RUN_ROOT="runs")
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "runs" / "cnn_spardl_p2_density0.05"
    (row,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert (row["compressor"], row["density"], row["nworkers"], row["iters"]) == \
        ("spardl", 0.05, 2, 4)
    assert (run_dir / "checkpoints" / "epoch-0001" / "rank-0001.pt").is_file()


def test_experiment_script_uses_the_models_config(tmp_path):
    result = launch(SCRIPTS / "vgg16_dense.sh", NWORKERS="2", DATA_DIR=str(tmp_path),
                    RUN_ROOT=str(tmp_path / "runs"))
    assert result.returncode == 2
    assert "CIFAR-10 not found" in result.stderr  # configs/vgg16.json trains on cifar10
