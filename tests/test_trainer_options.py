"""The trainer's method options (``--method-option KEY=VALUE`` and the flags of SparDL's options,
taken from the registry) and what a newcomer met: messages naming the flag and its value, data
sets that read no files, empty data folders, and caches kept out of the data folder."""

import json
import re
import warnings
from pathlib import Path

import pytest
from mpi4py import MPI

import compressors
from tests.imdb_sample import reviews, write_csv
from tests.mpirun import FirstOf, mpiexec
from trainer import build, cli
from trainer.distributed import UsageError

OKTOPK = ["--compression", "--compressor", "oktopk"]


def parse(*flags):
    args, _ = cli.parse_settings(list(flags), FirstOf(4))
    return args


def refusal(*flags):
    with pytest.raises(UsageError) as refused:
        parse(*flags)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_method_option_reaches_the_synchronizer():
    args, _ = cli.parse_settings([*OKTOPK, "--method-option", "in_flight=2"], MPI.COMM_SELF)
    assert args.method_options == {"in_flight": 2}
    synchronizer = build.build_synchronizer(args, 1000, MPI.COMM_SELF)
    assert synchronizer.in_flight == 2 and synchronizer.reducer.in_flight == 2
    default, _ = cli.parse_settings(OKTOPK, MPI.COMM_SELF)
    assert build.build_synchronizer(default, 1000, MPI.COMM_SELF).in_flight == 4


def test_values_take_the_type_of_the_options_default():
    args = parse(*OKTOPK, "--method-option", "raise-scale=1.5", "--method-option", "raise_limit=3")
    assert args.method_options == {"raise_scale": 1.5, "raise_limit": 3}
    gtopk = parse("--compression", "--compressor", "gtopk", "--method-option", "measure_loss=yes")
    assert gtopk.method_options == {"measure_loss": True}
    spardl = parse(
        "--compression", "--method-option", "sag=recursive", "--method-option", "teams=2"
    )
    assert spardl.method_options == {"sag": "recursive", "teams": 2}


def test_an_unknown_key_is_one_line_naming_the_valid_keys():
    message = refusal(*OKTOPK, "--method-option", "in_flights=2")
    valid = ", ".join(compressors.options("oktopk"))
    assert message == (
        f"--method-option in_flights=2: oktopk has no option 'in_flights'; valid keys: {valid}"
    )
    # a dense run (no --compression) takes only dense's options
    assert "dense has no option 'in_flight'; valid keys: dense_warmup" in refusal(
        "--method-option", "in_flight=2"
    )


@pytest.mark.parametrize(
    "flags,fragment",
    [
        ([*OKTOPK, "--method-option", "in_flight=x"], "in_flight takes a whole number"),
        ([*OKTOPK, "--method-option", "in_flight=0"], "in_flight must be an integer >= 1, got 0"),
        ([*OKTOPK, "--method-option", "in_flight"], "expected KEY=VALUE, got 'in_flight'"),
        (["--compression", "--method-option", "sag=ring"], "sag='ring' is invalid; valid: bruck"),
        (["--compression", "--method-option", "teams=3"], "teams=3 must divide the worker count 4"),
    ],
)
def test_a_bad_value_is_one_line(flags, fragment):
    message = refusal(*flags)
    assert message.startswith("--method-option") and fragment in message


def test_the_method_option_wins_over_the_dedicated_flag_with_a_note(capsys):
    args = parse("--compression", "--teams", "4", "--method-option", "teams=2")
    assert args.method_options == {"teams": 2}
    assert "--method-option teams=2 wins over --teams 4" in capsys.readouterr().err
    # the flag it overrides is not checked either: 3 does not divide 4
    assert parse("--compression", "--teams", "3", "--method-option", "teams=1").method_options == {
        "teams": 1
    }


def test_spardls_flags_take_their_choices_and_defaults_from_the_registry():
    parser = cli.build_parser()
    actions = {action.dest: action for action in parser._actions}
    for key, valid in compressors.option_choices("spardl").items():
        assert tuple(actions[key].choices) == valid
    defaults = compressors.option_defaults("spardl")
    assert f"(default: {defaults['teams']})" in actions["teams"].help
    assert parser.method_flags == {
        "teams": "--teams",
        "sag": "--sag",
        "srs": "--srs",
        "dense_warmup": "--dense-warmup",
        "wire": "--wire",
    }
    # flags given are checked by the registry, and said in the flags' terms
    assert "--sag recursive needs --teams a power of two, got 3" in (
        _six("--compression", "--teams", "3", "--sag", "recursive")
    )


def test_wire_reaches_every_methods_synchronizer():
    assert parse("--wire", "fp16").method_options == {"wire": "fp16"}  # dense too
    for method in compressors.available():
        flags = ["--compression", "--compressor", method, "--wire", "bf16"]
        args, _ = cli.parse_settings(flags, MPI.COMM_SELF)
        assert args.method_options == {"wire": "bf16"}, method
        synchronizer = build.build_synchronizer(args, 1000, MPI.COMM_SELF)
        assert synchronizer.wire == "bf16" and synchronizer.codec.wire == "bf16", method
    default, _ = cli.parse_settings(["--compression"], MPI.COMM_SELF)
    assert build.build_synchronizer(default, 1000, MPI.COMM_SELF).wire == "fp32"


def test_a_bad_wire_is_one_line_naming_the_formats():
    message = refusal("--compression", "--wire", "fp8")
    assert message.startswith("argument --wire: invalid choice: 'fp8'")
    assert all(wire in message for wire in ("fp32", "fp16", "bf16"))


def test_the_wire_method_option_wins_over_the_wire_flag(capsys):
    args = parse("--compression", "--wire", "fp16", "--method-option", "wire=bf16")
    assert args.method_options == {"wire": "bf16"}
    assert "--method-option wire=bf16 wins over --wire fp16" in capsys.readouterr().err


def _six(*flags):
    with pytest.raises(UsageError) as refused:
        cli.parse_settings(list(flags), FirstOf(6))
    return str(refused.value)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["--eval-batch-size", "0"], "--eval-batch-size must be at least 1, got 0"),
        (["--max-iters", "0"], "--max-iters must be at least 1, got 0"),
        (["--dense-warmup", "-2"], "--dense-warmup must be at least 0, got -2"),
        (["--max-epochs", "-1"], "--max-epochs must be at least 0, got -1"),
    ],
)
def test_a_value_out_of_range_names_its_flag_and_value(flags, message):
    assert refusal(*flags).startswith(message)


def test_data_sets_that_read_no_files_ignore_the_data_dir(capsys):
    for dataset in ("synthetic-cifar10", "digits"):
        parse("--dataset", dataset, "--data-dir", "/nonexistent/data")
        assert (
            f"--data-dir has no effect with {dataset}: it reads no files" in capsys.readouterr().err
        )
    assert "data directory /nonexistent/data does not exist" in refusal(
        "--dataset", "mnist", "--data-dir", "/nonexistent/data"
    )


@pytest.mark.parametrize(
    "model,dataset",
    [("cnn", "mnist"), ("lstmimdb", "imdb"), ("bert-tiny", "wikipedia"), ("cnn", "imagenet")],
)
def test_an_empty_data_dir_is_refused_for_data_sets_that_read_files(tmp_path, model, dataset):
    args, settings = cli.parse_settings(
        ["--dnn", model, "--dataset", dataset, "--data-dir", str(tmp_path)], MPI.COMM_SELF
    )
    with pytest.raises(UsageError, match=f"--data-dir {tmp_path} is an empty directory: "):
        build.load_data(args, settings, MPI.COMM_SELF)


def _listing(folder):
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(Path(folder).rglob("*"))
    }


def test_caches_go_to_the_cache_dir_and_the_data_folder_is_left_alone(tmp_path, monkeypatch):
    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()
    write_csv(data, reviews(12, seed=1), reviews(4, seed=2))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    before = _listing(data)
    flags = ["--dnn", "lstmimdb", "--dataset", "imdb", "--data-dir", str(data)]
    for extra in (["--cache-dir", str(cache)], []):  # the one given, then the user's
        args, settings = cli.parse_settings(flags + extra, MPI.COMM_SELF)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "cannot cache" would fail here
            build.load_data(args, settings, MPI.COMM_SELF)
    assert _listing(data) == before
    assert [path.name.startswith("imdb-") for path in cache.iterdir()] == [True]
    assert len(list((tmp_path / "home-cache" / "spardl-repro").glob("imdb-*.pt"))) == 1
    assert "--cache-dir /etc/passwd/c: " in refusal("--cache-dir", "/etc/passwd/c")


@pytest.mark.mpi
def test_a_run_records_its_method_options_and_counts_iterations_in_words(tmp_path):
    result = mpiexec(
        2,
        "main_trainer.py",
        *OKTOPK,
        "--method-option",
        "in_flight=1",
        "--dataset",
        "synthetic-cifar10",
        "--data-dir",
        str(tmp_path / "absent"),  # read by no one
        "--max-epochs",
        "1",
        "--max-iters",
        "1",
        "--log-dir",
        str(tmp_path / "log"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "1 iteration per epoch" in output and "1 iterations" not in output
    assert "--data-dir has no effect with synthetic-cifar10" in output
    (row,) = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").open()]
    defaults = compressors.option_defaults("oktopk")
    assert {key: row[key] for key in defaults} == {**defaults, "in_flight": 1}
    assert not (tmp_path / "absent").exists()


@pytest.mark.mpi
def test_teams_auto_records_what_spardl_chose_per_bucket(tmp_path):
    result = mpiexec(
        2,
        "main_trainer.py",
        "--method",
        "spardl",
        "--teams",
        "auto",
        "--dnn",
        "cnn",
        "--dataset",
        "synthetic-cifar10",
        "--max-epochs",
        "1",
        "--max-iters",
        "1",
        "--log-dir",
        str(tmp_path / "log"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (row,) = [json.loads(line) for line in (tmp_path / "log" / "metrics.jsonl").open()]
    assert row["teams"] == "auto" and row["overlap"]
    assert row["auto"], row  # one record per bucket
    for chosen in row["auto"]:
        assert chosen["teams_requested"] == "auto"
        assert (chosen["teams"], chosen["sag"]) in {(1, "bruck"), (2, "bruck"), (2, "recursive")}
        assert {entry["teams"] for entry in chosen["probe"]} == {1, 2}


@pytest.mark.mpi
@pytest.mark.parametrize(
    "option,pattern",
    [
        ("nope=1", r"--method-option nope=1: oktopk has no option 'nope'; valid keys: .*in_flight"),
        ("in_flight=x", r"--method-option in_flight=x: oktopk's in_flight takes a whole number"),
    ],
)
def test_a_bad_method_option_ends_every_rank_with_status_2_and_one_line(option, pattern):
    result = mpiexec(2, "main_trainer.py", *OKTOPK, "--method-option", option, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(f"main_trainer.py: error: {pattern}.*", lines[0])


def _bytes_per_rank(tmp_path, *flags):
    log = tmp_path / "-".join(flags)
    result = mpiexec(
        2,
        "main_trainer.py",
        "--compression",
        "--compressor",
        "topk",
        "--dataset",
        "synthetic-cifar10",
        "--max-epochs",
        "1",
        "--max-iters",
        "2",
        "--log-dir",
        str(log),
        *flags,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (row,) = [json.loads(line) for line in (log / "metrics.jsonl").open()]
    return row


@pytest.mark.mpi
def test_a_16_bit_wire_halves_the_bytes_a_run_records(tmp_path):
    fp32, fp16 = (_bytes_per_rank(tmp_path, "--wire", wire) for wire in ("fp32", "fp16"))
    assert (fp32["wire"], fp16["wire"]) == ("fp32", "fp16")
    ratio = fp16["bytes_sent_per_rank"] / fp32["bytes_sent_per_rank"]
    assert 0.45 < ratio < 0.6, ratio


@pytest.mark.mpi
def test_a_bad_wire_ends_every_rank_with_status_2_and_one_line():
    result = mpiexec(2, "main_trainer.py", "--wire", "fp8", timeout=120)
    assert result.returncode == 2, result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "main_trainer.py: error: argument --wire: invalid choice: 'fp8'"
    ), lines
