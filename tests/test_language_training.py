"""The language tasks through main_trainer.py under mpiexec: they learn with SparDL, a resumed BERT
run continues bit-identically, and bad data exits 2 with one message."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from tests.imdb_sample import reviews, write_acl
from tests.mpirun import mpiexec

pytestmark = pytest.mark.mpi

LICENSES = Path("/usr/share/common-licenses")
needs_licenses = pytest.mark.skipif(
    not (LICENSES / "GPL-3").is_file(), reason="no /usr/share/common-licenses/GPL-3 on this machine"
)
SPARDL = ["--compression", "--compressor", "spardl", "--density", "0.05"]


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    """The ranks' default cache directory (inherited by mpiexec): inside tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-home"))


def _config(tmp_path, **values):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    return str(path)


def _corpus(tmp_path):
    """A real English text (two licences, about 50 KB), copied into tmp_path."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("GPL-3", "Apache-2.0"):
        shutil.copy(LICENSES / name, corpus)
    return str(corpus)


def _bert(tmp_path):
    return [
        "--dnn",
        "bert-tiny",
        "--data-dir",
        _corpus(tmp_path),
        "--config",
        _config(
            tmp_path,
            dataset="wikipedia",
            batch_size=8,
            lr=0.05,
            clip_grad_norm=1.0,
            data_options={"vocab_size": 400, "seq_len": 32},
        ),
    ]


def _rows(log_dir):
    return [json.loads(line) for line in (Path(log_dir) / "metrics.jsonl").read_text().splitlines()]


def _train(*flags, timeout=120):
    result = mpiexec(2, "main_trainer.py", *flags, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.slow
def test_lstmimdb_learns_with_spardl(tmp_path):
    write_acl(tmp_path, reviews(40, seed=1), reviews(10, seed=2))
    config = _config(
        tmp_path,
        dataset="imdb",
        batch_size=4,
        lr=0.3,
        max_epochs=3,
        data_options={"vocab_size": 1000, "max_tokens": 100},
    )
    _train(
        "--dnn",
        "lstmimdb",
        "--data-dir",
        str(tmp_path),
        "--config",
        config,
        *SPARDL,
        "--log-dir",
        str(tmp_path / "log"),
    )
    rows = _rows(tmp_path / "log")
    assert [row["iters"] for row in rows] == [10, 20, 30]  # 80 reviews, 2 workers, batch 4
    assert rows[-1]["train_loss"] < 0.5 * rows[0]["train_loss"]
    assert rows[-1]["task"] == "text-classification" and rows[-1]["test_acc"] > 0.9


@pytest.mark.slow
@needs_licenses
def test_bert_tiny_learns_with_spardl_on_real_text(tmp_path):
    _train(
        *_bert(tmp_path),
        *SPARDL,
        "--max-epochs",
        "3",
        "--max-iters",
        "8",
        "--log-dir",
        str(tmp_path / "log"),
    )
    rows = _rows(tmp_path / "log")
    assert rows[-1]["iters"] == 24
    assert rows[-1]["train_loss"] < rows[0]["train_loss"] - 0.3  # from about ln(400) = 6
    assert rows[-1]["test_loss"] < rows[0]["test_loss"]
    assert rows[-1]["task"] == "masked-lm"
    assert rows[-1]["test_perplexity"] == pytest.approx(math.exp(rows[-1]["test_loss"]))


@pytest.mark.slow
@needs_licenses
def test_a_resumed_bert_run_continues_bit_identically(tmp_path):
    flags = [*_bert(tmp_path), *SPARDL, "--max-iters", "4"]
    for name, epochs in (("straight", ["2"]), ("resumed", ["1", "2"])):
        for total in epochs:
            _train(
                *flags,
                "--max-epochs",
                total,
                "--log-dir",
                str(tmp_path / name),
                "--checkpoint-dir",
                str(tmp_path / f"{name}-ckpt"),
                "--resume",
            )
    keys = ("iters", "train_loss", "test_loss", "test_acc", "lr", "bytes_sent_per_rank")
    straight, resumed = (
        [{key: row[key] for key in keys} for row in _rows(tmp_path / name)]
        for name in ("straight", "resumed")
    )
    assert straight == resumed and len(straight) == 2
    for rank in range(2):
        saved = [
            torch.load(
                tmp_path / f"{name}-ckpt" / "epoch-0002" / f"rank-{rank:04d}.pt", weights_only=True
            )
            for name in ("straight", "resumed")
        ]
        for key, tensor in saved[0]["model"].items():
            assert torch.equal(tensor, saved[1]["model"][key]), key


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (
            ["--dnn", "bert-tiny", "--data-dir", "{tmp}/absent"],
            "data directory {tmp}/absent does not exist",
        ),
        (
            ["--dnn", "bert-tiny", "--data-dir", "{tmp}/binary"],
            "binary/x.txt is not readable UTF-8 text",
        ),
        (
            ["--dnn", "lstmimdb", "--data-dir", "{tmp}/binary"],
            "imdb: no data in {tmp}/binary. IMDB is expected",
        ),
        (
            ["--dnn", "lstmimdb", "--dataset", "cifar10"],
            "model lstmimdb trains on imdb (text-classification), not cifar10",
        ),
        (
            ["--dnn", "bert-tiny", "--config", "{tmp}/options.json"],
            "data set wikipedia takes no option(s) max_tokens",
        ),
    ],
)
def test_bad_text_data_exits_2_with_one_message(tmp_path, flags, fragment):
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "x.txt").write_bytes(b"\x89PNG\r\n\x1a\n\0\0")
    (tmp_path / "options.json").write_text(
        '{"dataset": "wikipedia", "data_options": {"max_tokens": 5}}'
    )
    result = mpiexec(
        2, "main_trainer.py", *[flag.replace("{tmp}", str(tmp_path)) for flag in flags], timeout=120
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert output.count("main_trainer.py: error:") == 1 and "Traceback" not in output
    assert fragment.replace("{tmp}", str(tmp_path)) in result.stderr
