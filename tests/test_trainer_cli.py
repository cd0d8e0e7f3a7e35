"""The command line: bad input ends every rank with status 2 and one message, fast; a failure on
one rank aborts the job; every flag is documented."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.mpirun import ROOT, command, environment, mpiexec

pytestmark = pytest.mark.mpi

MESSAGE = "main_trainer.py: error:"


#: Bad command lines and a fragment of the one message each gives ({tmp}: a fresh folder).
BAD_INPUT = [
    (["--dnn", "lenet"], "unknown model 'lenet'; choose one of: alexnet"),
    (["--dataset", "svhn"], "unknown data set 'svhn'"),
    (["--compression", "--compressor", "nope"], "unknown synchronization method 'nope'"),
    (["--compressor", "nope"], "unknown synchronization method 'nope'"),
    (["--compression", "--density", "0"], "--density must lie in (0, 1]"),
    (["--density", "1.5"], "--density must lie in (0, 1]"),
    (["--nworkers", "3"], "--nworkers 3 does not match the 2 MPI process(es)"),
    (
        ["--dataset", "mnist", "--data-dir", "/nonexistent/data"],
        "data directory /nonexistent/data does not exist",
    ),
    (["--dataset", "cifar10", "--data-dir", "{tmp}"], "cifar-10-batches-py lacks data_batch_1"),
    (
        ["--dataset", "cifar10", "--data-dir", "{tmp}"],
        "--data-dir {tmp} is an empty directory: CIFAR-10 not found",
    ),
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (
        ["--compression", "--compressor", "oktopk", "--method-option", "nope=1"],
        "--method-option nope=1: oktopk has no option 'nope'; valid keys: local_interval, ",
    ),
    (
        ["--compression", "--compressor", "oktopk", "--method-option", "in_flight=0"],
        "--method-option: in_flight must be an integer >= 1, got 0",
    ),
    (["--compression", "--teams", "3"], "--teams 3 must divide the number of workers 2"),
    (
        ["--dnn", "vgg16", "--dataset", "digits"],
        "vgg16 cannot train on batches of 1x8x8 images",
    ),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--config", "{tmp}/absent.json"], "absent.json does not exist"),
    (["--batch-size", "many"], "invalid int value: 'many'"),
    (["--lr", "inf"], "--lr must be a positive number"),
    (["--lr-gamma", "-1"], "--lr-gamma must be a positive number"),
    (["--momentum", "-0.5"], "--momentum must be a number >= 0"),
    (["--weight-decay", "-1"], "--weight-decay must be a number >= 0"),
    (["--log-dir", "/etc/passwd"], "--log-dir /etc/passwd: "),
    (["--checkpoint-dir", "/etc/passwd/ckpt"], "--checkpoint-dir /etc/passwd/ckpt: "),
    (["--seed", "-1"], "--seed must lie in [0, 2^32), got -1"),
    (["--lr-milestones", "-3"], "--lr-milestones must be epochs >= 0"),
    (["--batch-size", "100000"], "batch size 100000 per rank is more than the "),
    (["--local-steps", "0"], "--local-steps must be at least 1, got 0"),
    (["--local-steps", "5", "--outer-lr", "0"], "--outer-lr must be a number > 0, got 0.0"),
    (["--local-steps", "5", "--outer-momentum", "1"], "--outer-momentum must lie in [0, 1)"),
    (["--outer-lr", "0.5"], "--outer-lr only act with --local-steps H > 1"),
    (["--outer-overlap"], "--outer-overlap only act with --local-steps H > 1"),
    (["--local-steps", "5", "--fsdp"], "--local-steps with --fsdp: local steps need every rank"),
    (["--local-steps", "5", "--method", "powersgd"], "--local-steps with powersgd: a DDP method"),
    (
        ["--local-steps", "5", "--method", "spardl", "--method-option", "momentum=0.9"],
        "--local-steps with momentum correction",
    ),
]


@pytest.fixture(scope="module")
def bad_input_results(tmp_path_factory):
    """Every command line of ``BAD_INPUT`` in one ``mpiexec -n 2`` job (one torch import)."""
    folder = tmp_path_factory.mktemp("bad-input")
    cases = []
    for number, (flags, _) in enumerate(BAD_INPUT):
        tmp = folder / str(number)
        tmp.mkdir()
        cases.append([flag.replace("{tmp}", str(tmp)) for flag in flags])
    (folder / "cases.json").write_text(json.dumps(cases))
    started = time.monotonic()
    run = mpiexec(
        2,
        "tests/trainer_bad_input_check.py",
        str(folder / "cases.json"),
        str(folder / "results.json"),
        timeout=600,
    )
    elapsed = time.monotonic() - started
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stdout + run.stderr
    assert elapsed < 30 * len(cases)
    return folder, json.loads((folder / "results.json").read_text())


@pytest.mark.parametrize("number", range(len(BAD_INPUT)), ids=lambda n: " ".join(BAD_INPUT[n][0]))
def test_bad_input_exits_2_with_one_message(bad_input_results, number):
    folder, results = bad_input_results
    fragment = BAD_INPUT[number][1].replace("{tmp}", str(folder / str(number)))
    result = results[number]
    output = result["stdout"] + result["stderr"]
    assert result["statuses"] == [2, 2], output
    assert output.count(MESSAGE) == 1, output
    assert fragment in result["stderr"], output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    "first,second,fragment",
    [
        (["--dnn", "cnn"], ["--dnn", "mlp"], "--dnn is 'cnn' on rank 0 but 'mlp' on rank 1"),
        (["--density", "0.01"], ["--density", "0.1"], "--density is 0.01 on rank 0 but 0.1"),
    ],
)
def test_ranks_started_with_different_settings_stop_in_one_line(first, second, fragment):
    """An MPMD launch (``mpiexec -n 1 A : -n 1 B``): compared before any other collective."""
    launch = command(1, "main_trainer.py", "--method", "spardl", *first)
    launch += [":", "-n", "1", sys.executable, "main_trainer.py", "--method", "spardl", *second]
    result = subprocess.run(
        launch, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=120
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert output.count(MESSAGE) == 1 and "Traceback" not in output, output
    assert "the ranks were started with different settings" in result.stderr, output
    assert fragment in result.stderr, output


def test_a_model_state_that_fails_on_one_rank_ends_every_rank_in_one_line(tmp_path):
    saved = mpiexec(
        2,
        "main_trainer.py",
        "--max-epochs",
        "1",
        "--max-iters",
        "2",
        "--checkpoint-dir",
        str(tmp_path),
        timeout=120,
    )
    assert saved.returncode == 0, saved.stderr
    # Only rank 1's file is bad: a model state
    # state that lacks a tensor (a readable file: an unreadable one is a usage error, exit 2).
    path = tmp_path / "epoch-0001" / "rank-0001.pt"
    state = torch.load(path, weights_only=True)
    state["model"].popitem()
    torch.save(state, path)
    started = time.monotonic()
    result = mpiexec(
        2,
        "main_trainer.py",
        "--max-epochs",
        "2",
        "--max-iters",
        "2",
        "--checkpoint-dir",
        str(tmp_path),
        "--resume",
        timeout=120,
    )
    # Every rank refuses it in one line (exit 2), rank 0 waiting in no collective.
    assert result.returncode == 2, result.stderr
    assert "does not fit this run" in result.stderr and "Missing key" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    "flags", [[], ["--compression"], ["--compression", "--compressor", "oktopk"]]
)
def test_a_diverging_run_stops_every_rank_with_one_line(flags):
    """The ranks agree on a loss or gradient that is not finite before synchronizing it: one
    line from rank 0 naming the step, status 1 (a sparse method used to fail inside its
    selection on every rank, with tracebacks)."""
    result = mpiexec(
        4,
        "main_trainer.py",
        "--lr",
        "1e6",
        "--max-epochs",
        "1",
        "--max-iters",
        "20",
        *flags,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert re.fullmatch(
        r"main_trainer.py: error: the run diverged at epoch 1, iteration \d+: "
        r"(the training loss is (nan|inf|-inf)|the gradient holds NaN or inf) "
        r"\(a lower --lr, or more --warmup-epochs\?\)",
        lines[0],
    ), lines[0]


def test_help_lists_and_the_docs_describe_every_flag():
    result = mpiexec(2, "main_trainer.py", "--help", timeout=120)
    assert result.returncode == 0
    flags = set(re.findall(r"--[a-z][a-z-]+", result.stdout))
    contract = {
        "--dnn",
        "--dataset",
        "--data-dir",
        "--batch-size",
        "--lr",
        "--max-epochs",
        "--nworkers",
        "--compression",
        "--compressor",
        "--density",
        "--teams",
        "--sag",
        "--seed",
        "--log-dir",
        "--checkpoint-dir",
        "--resume",
        "--max-iters",
        "--device",
        "--dense-warmup",
    }
    assert contract <= flags
    assert result.stdout.count("usage: main_trainer.py") == 1  # printed by rank 0 only
    docs = (Path(ROOT) / "docs" / "TRAINING.md").read_text()
    undocumented = sorted(flag for flag in flags if f"`{flag}" not in docs)
    assert not undocumented


def test_nothing_left_to_train_is_said():
    result = mpiexec(1, "main_trainer.py", "--max-epochs", "0", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "nothing to train: 0 of --max-epochs 0 epochs done" in result.stdout + result.stderr


def test_a_milestone_inside_the_warm_up_is_noted():
    result = mpiexec(
        1,
        "main_trainer.py",
        "--max-epochs",
        "0",
        "--warmup-epochs",
        "2.5",
        "--lr-milestones",
        "1,2,3",
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert (
        "--lr-milestones 1,2 fall inside the 2.5-epoch warm-up: their decay starts when it ends"
        in output
    )


def test_an_unreadable_image_met_in_training_ends_the_job_with_one_line(tmp_path):
    from PIL import Image

    for part in ("train", "val"):
        for label in ("n01", "n02"):
            (tmp_path / part / label).mkdir(parents=True)
            Image.new("RGB", (40, 30)).save(tmp_path / part / label / "a.JPEG")
    (tmp_path / "train" / "n02" / "b.JPEG").write_bytes(b"not an image")
    started = time.monotonic()
    result = mpiexec(
        2,
        "main_trainer.py",
        "--dnn",
        "cnn",
        "--dataset",
        "imagenet",
        "--data-dir",
        str(tmp_path),
        "--batch-size",
        "1",
        "--max-epochs",
        "1",
        "--loader-workers",
        "1",
        timeout=120,
    )
    assert result.returncode not in (0, 2)
    assert (
        f"failed: {tmp_path}/train/n02/b.JPEG: unreadable image (UnidentifiedImageError"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert time.monotonic() - started < 60
