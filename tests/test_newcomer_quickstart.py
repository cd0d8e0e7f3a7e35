"""scripts/quickstart.sh keeps the metrics of earlier runs: nothing is removed before the trainer
has accepted the flags (docs/TRAINING.md, "Outputs": the trainer backs old rows up itself).

The script runs in a copy of the repository's layout whose .venv is fake (its install stamp
matches, its python forwards to this interpreter, its mpiexec starts one process), so nothing
is installed and no MPI job starts.
"""

import os
import shutil
import stat
import subprocess
import sys

from tests.mpirun import ROOT

OLD_ROWS = '{"epoch": 1, "test_acc": 0.5, "compressor": "dense", "nworkers": 2}\n'


def _executable(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _fake_checkout(tmp_path, mpiexec_body):
    """A folder laid out like the repository, with a fake .venv; returns its path."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "scripts", "quickstart.sh"), root / "scripts")
    (root / "main_trainer.py").symlink_to(os.path.join(ROOT, "main_trainer.py"))
    (root / "requirements.txt").write_text("torch\n")
    (root / "pyproject.toml").write_text("[project]\n")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    stamp = subprocess.run(
        "cat requirements.txt pyproject.toml | cksum",
        shell=True,
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (root / ".venv" / ".quickstart-installed").write_text(stamp)
    # The import check passes; pip (an install) would be a failure of the test's setup.
    _executable(
        bin_dir / "python",
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  -c) exit 0 ;;\n"
        '  -m) echo "fake python: no installs here: $*" >&2; exit 97 ;;\n'
        "esac\n"
        f'exec "{sys.executable}" "$@"\n',
    )
    _executable(bin_dir / "mpiexec", "#!/bin/sh\n" + mpiexec_body)
    return root


def _quickstart(root, log_dir, *flags, timeout=60):
    env = dict(os.environ, NWORKERS="2", LOG_DIR=str(log_dir), OMP_NUM_THREADS="1")
    env.pop("PMI_RANK", None)
    return subprocess.run(
        ["bash", str(root / "scripts" / "quickstart.sh"), *flags],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _old_run(tmp_path):
    log_dir = tmp_path / "runs" / "quickstart"
    log_dir.mkdir(parents=True)
    (log_dir / "metrics.jsonl").write_text(OLD_ROWS)
    return log_dir


def test_the_metrics_are_still_there_when_the_trainer_starts_and_refuses(tmp_path):
    log_dir = _old_run(tmp_path)
    seen = tmp_path / "seen"
    # The trainer's stand-in: records what LOG_DIR held when it started, then refuses (status 2).
    root = _fake_checkout(
        tmp_path,
        f'cat "{log_dir}/metrics.jsonl" > "{seen}" 2>&1 || echo missing > "{seen}"\n'
        'echo "main_trainer.py: error: unknown synchronization method" >&2\n'
        "exit 2\n",
    )
    result = _quickstart(root, log_dir, "--method", "foo")
    assert result.returncode == 2, result.stdout + result.stderr
    assert seen.read_text() == OLD_ROWS
    assert sorted(os.listdir(log_dir)) == ["metrics.jsonl"]
    assert (log_dir / "metrics.jsonl").read_text() == OLD_ROWS
    assert "final test accuracy" not in result.stdout


def test_the_real_trainer_refuses_a_bad_flag_and_leaves_the_metrics_alone(tmp_path):
    log_dir = _old_run(tmp_path)
    # One process, not NWORKERS: enough for the trainer to check its flags.
    root = _fake_checkout(tmp_path, 'shift 2\nexec "$@"\n')
    result = _quickstart(root, log_dir, "--method", "foo", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "main_trainer.py: error:" in result.stderr and "method 'foo'" in result.stderr
    assert sorted(os.listdir(log_dir)) == ["metrics.jsonl"]
    assert (log_dir / "metrics.jsonl").read_text() == OLD_ROWS


def test_help_shows_the_trainer_s_flags_and_reads_no_old_metrics(tmp_path):
    log_dir = _old_run(tmp_path)
    root = _fake_checkout(tmp_path, 'echo "mpiexec must not run for --help" >&2\nexit 96\n')
    result = _quickstart(root, log_dir, "--help", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--log-dir" in result.stdout and "final test accuracy" not in result.stdout
    assert (log_dir / "metrics.jsonl").read_text() == OLD_ROWS


def test_a_cpu_build_that_fails_to_install_is_reported_with_pips_own_reason(tmp_path):
    """No GPU, and the CPU wheel's dependency cannot be resolved: the script says pip's reason
    and that the default (CUDA) build comes instead, then installs requirements.txt."""
    root = _fake_checkout(tmp_path, 'echo "mpiexec must not run for --help" >&2\nexit 96\n')
    (root / ".venv" / ".quickstart-installed").write_text("another install\n")
    (root / "requirements.txt").write_text("torch==2.14.1\n")
    installs = tmp_path / "installs"
    _executable(
        root / ".venv" / "bin" / "python",
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  -c) exit 0 ;;\n"
        f'  -m) echo "$*" >> "{installs}"\n'
        '      case "$*" in *index-url*)\n'
        '        echo "ERROR: Could not find a version that satisfies the requirement '
        'cuda-bindings (from torch)" >&2\n'
        '        echo "ERROR: No matching distribution found for cuda-bindings" >&2\n'
        "        exit 1 ;;\n"
        "      esac\n"
        "      exit 0 ;;\n"
        "esac\n"
        f'exec "{sys.executable}" "$@"\n',
    )
    no_gpu = tmp_path / "no-gpu"
    no_gpu.mkdir()
    _executable(no_gpu / "nvidia-smi", "#!/bin/sh\nexit 9\n")
    env = dict(os.environ, PATH=f"{no_gpu}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(
        ["bash", str(root / "scripts" / "quickstart.sh"), "--help"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    said = result.stdout
    assert "torch's CPU build did not install: ERROR: Could not find a version" in said, said
    assert "No matching distribution found for cuda-bindings" in said, said
    assert "not reachable" not in said
    assert "the default torch build of requirements.txt instead" in said, said
    assert "-r requirements.txt" in installs.read_text()
