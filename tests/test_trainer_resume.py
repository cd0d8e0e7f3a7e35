"""Resuming from a checkpoint continues exactly as if the run had never stopped."""

import json

import pytest
import torch

from tests.mpirun import mpiexec

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

# SparDL keeps per-rank residuals and a dense warm-up counter (30 steps cross the epoch
# boundary at 23 iterations per epoch on 2 ranks): both must survive the restart.
FLAGS = ["--compression", "--compressor", "spardl", "--density", "0.02", "--dense-warmup", "30"]
SAME = ("iters", "train_loss", "test_loss", "test_acc", "lr", "bytes_sent_per_rank")


def train(tmp_path, name, epochs, *extra):
    result = mpiexec(
        2,
        "main_trainer.py",
        "--max-epochs",
        str(epochs),
        "--log-dir",
        str(tmp_path / name),
        "--checkpoint-dir",
        str(tmp_path / f"{name}-ckpt"),
        *FLAGS,
        *extra,
    )
    assert result.returncode == 0, result.stderr
    return result


def rows(tmp_path, name):
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    return [{key: json.loads(line)[key] for key in SAME} for line in lines]


def test_two_epochs_equal_one_epoch_resume_one_epoch(tmp_path):
    train(tmp_path, "straight", 2)
    first = train(tmp_path, "resumed", 1, "--resume")
    assert "starting from scratch" in first.stderr
    second = train(tmp_path, "resumed", 2, "--resume")
    assert "resumed from the checkpoint of epoch 1" in second.stdout
    assert rows(tmp_path, "straight") == rows(tmp_path, "resumed")
    for rank in range(2):
        straight, resumed = (
            torch.load(
                tmp_path / f"{name}-ckpt" / "epoch-0002" / f"rank-{rank:04d}.pt", weights_only=True
            )
            for name in ("straight", "resumed")
        )
        for key, tensor in straight["model"].items():
            assert torch.equal(tensor, resumed["model"][key]), key
        # Overlapped (the default): every bucket layout's residual, by its parameters.
        buckets = straight["synchronizer"]["buckets"]
        assert buckets and buckets.keys() == resumed["synchronizer"]["buckets"].keys()
        for layout, entry in buckets.items():
            again = resumed["synchronizer"]["buckets"][layout]["state"]
            assert torch.equal(entry["state"]["residual"], again["residual"]), layout
            assert entry["state"]["calls"] == again["calls"]


def test_resume_refuses_a_checkpoint_of_another_world_size(tmp_path):
    epoch = tmp_path / "epoch-0001"
    epoch.mkdir()
    for rank in range(2):  # what ranks 0 and 1 of a 3-worker run would have left
        torch.save(
            {"nworkers": 3, "run_info": {"compressor": "spardl"}}, epoch / f"rank-{rank:04d}.pt"
        )
    result = mpiexec(
        2,
        "main_trainer.py",
        "--max-epochs",
        "2",
        "--checkpoint-dir",
        str(tmp_path),
        "--resume",
        *FLAGS,
        timeout=120,
    )
    assert result.returncode == 2
    assert "does not fit this run" in result.stderr and "nworkers 3 (this run: 2)" in result.stderr
    assert "Traceback" not in result.stderr


def quick(tmp_path, name, checkpoints, epochs, iters, *extra):
    """A short 2-rank run logging to ``tmp_path/name``; its result and metrics rows."""
    result = mpiexec(
        2,
        "main_trainer.py",
        "--max-epochs",
        str(epochs),
        "--max-iters",
        str(iters),
        "--log-dir",
        str(tmp_path / name),
        "--checkpoint-dir",
        str(tmp_path / checkpoints),
        *extra,
        timeout=120,
    )
    lines = (
        (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        if result.returncode == 0
        else []
    )
    return result, [json.loads(line) for line in lines]


def test_resume_follows_this_runs_flags_and_keeps_one_history(tmp_path):
    """Resumed with another --lr and --max-iters, epochs 2-3 run the schedule those flags give,
    as a straight run with them does (it used to keep the first run's rate and steps per epoch);
    the log holds each epoch once."""
    _, straight = quick(
        tmp_path, "straight", "straight-ckpt", 3, 3, "--lr", "0.01", "--warmup-epochs", "1"
    )
    first, _ = quick(tmp_path, "split", "split-ckpt", 1, 2, "--warmup-epochs", "1")
    assert first.returncode == 0, first.stderr
    again, split = quick(
        tmp_path, "split", "split-ckpt", 3, 3, "--lr", "0.01", "--warmup-epochs", "1", "--resume"
    )
    assert again.returncode == 0, again.stderr
    assert [row["epoch"] for row in split] == [1, 2, 3]
    assert [row["lr"] for row in split[1:]] == [row["lr"] for row in straight[1:]]


def test_resume_refuses_another_model_and_a_fresh_run_refuses_old_checkpoints(tmp_path):
    saved, _ = quick(tmp_path, "log", "ckpt", 1, 2)
    assert saved.returncode == 0, saved.stderr
    other, _ = quick(tmp_path, "log", "ckpt", 2, 2, "--dnn", "mlp", "--resume")
    assert other.returncode == 2 and "model cnn (this run: mlp)" in other.stderr, other.stderr
    assert "Traceback" not in other.stderr
    fresh, _ = quick(tmp_path, "log", "ckpt", 2, 2)
    assert fresh.returncode == 2, fresh.stderr
    assert "holds checkpoints of an earlier run (epochs 1): pass --resume" in fresh.stderr
    (tmp_path / "ckpt" / "epoch-0001" / "rank-0001.pt").unlink()  # a lost rank's file
    more = mpiexec(
        3,
        "main_trainer.py",
        "--max-epochs",
        "2",
        "--max-iters",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--resume",
        timeout=120,
    )  # 1 of 2 ranks' files, 3 ranks
    assert (
        more.returncode == 2 and "none of them complete for this run's 3 worker(s)" in more.stderr
    ), more.stderr
    elsewhere, rows = quick(tmp_path, "log", "ckpt-new", 1, 2, "--seed", "3")
    assert elsewhere.returncode == 0 and [row["epoch"] for row in rows] == [1]  # a fresh log


def test_resume_refuses_another_density_and_an_unreadable_checkpoint(tmp_path):
    """SparDL's saved h fits only its density: resumed at another one, a later call used to
    crash with a malformed message (and Ok-Topk ran silently at the old density)."""
    spardl = ["--compression", "--compressor", "spardl"]
    saved, _ = quick(tmp_path, "log", "ckpt", 1, 2, *spardl, "--density", "0.05")
    assert saved.returncode == 0, saved.stderr
    other, _ = quick(tmp_path, "log", "ckpt", 2, 2, *spardl, "--density", "0.5", "--resume")
    assert other.returncode == 2 and "density 0.05 (this run: 0.5)" in other.stderr, other.stderr
    assert "Traceback" not in other.stderr
    # Refused from what the command line says, before the data and model are built; a refused
    # run leaves no log directory behind.
    teams, _ = quick(
        tmp_path, "refused", "ckpt", 2, 2, *spardl, "--density", "0.05", "--teams", "2", "--resume"
    )
    assert teams.returncode == 2 and "teams 1 (this run: 2)" in teams.stderr, teams.stderr
    assert not (tmp_path / "refused").exists()
    (tmp_path / "ckpt" / "epoch-0001" / "rank-0001.pt").write_text("garbage\n")
    broken, _ = quick(tmp_path, "log", "ckpt", 2, 2, *spardl, "--density", "0.05", "--resume")
    assert broken.returncode == 2, broken.stderr
    assert (
        "epoch-0001/rank-0001.pt is unreadable" in broken.stderr
        and "Traceback" not in broken.stderr
    )


class _RunsCode:
    """Unpickling this calls ``Path.touch`` on ``marker``: what a crafted checkpoint could do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (type(self.marker).touch, (self.marker,))


def test_resume_refuses_a_checkpoint_holding_an_arbitrary_object(tmp_path):
    saved, _ = quick(tmp_path, "log", "ckpt", 1, 2)
    assert saved.returncode == 0, saved.stderr
    path, marker = tmp_path / "ckpt" / "epoch-0001" / "rank-0001.pt", tmp_path / "ran"
    state = torch.load(path, weights_only=True)  # what the trainer writes loads safely
    torch.save(dict(state, extra=_RunsCode(marker)), path)
    crafted, _ = quick(tmp_path, "log", "ckpt", 2, 2, "--resume")
    assert crafted.returncode == 2, crafted.stderr
    assert not marker.exists()
    assert (
        f"checkpoint {path} holds something other than tensors and plain values" in crafted.stderr
    )
    assert "refused, since loading it could run code" in crafted.stderr
    assert "Traceback" not in crafted.stderr and len(crafted.stderr.splitlines()) == 1
