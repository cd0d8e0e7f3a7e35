"""scripts/ddp_compare.py: DDP with each hook, interleaved, on 2 ranks under torchrun."""

import json
import os
import subprocess

import pytest

from syncbench import ddp_compare
from tests.mpirun import BIN, ROOT, environment

TORCHRUN = os.path.join(BIN, "torchrun")
HOOKS = ["compute", "ddp", "ddp_fp16", "powersgd", "spardl", "spardl:wire=fp16"]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(TORCHRUN), reason="torchrun is not installed")
def test_the_table_and_json_name_every_hook_with_its_ratio(tmp_path):
    result = subprocess.run(
        [
            TORCHRUN,
            "--standalone",
            "--nproc-per-node",
            "2",
            "scripts/ddp_compare.py",
            "--model",
            "cnn",
            "--iters",
            "2",
            "--warmup",
            "2",
            "--bucket-mb",
            "0.05",  # several buckets: powersgd gets one, with a note
            "--hooks",
            ",".join(HOOKS),
            "--json",
            str(tmp_path / "out.json"),
        ],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "powersgd on Gloo: one bucket" in result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in lines[1:]] == HOOKS
    assert lines[1].endswith("| 1.00 | - | - | - |")  # compute against itself, no thread
    saved = json.loads((tmp_path / "out.json").read_text())
    assert [row["hook"] for row in saved["rows"]] == HOOKS
    assert all(len(saved["times"][hook]) == 2 for hook in HOOKS)
    assert all(row["median_s"] > 0 and row["ratio"] > 0 for row in saved["rows"])
    assert all(0 <= row["exposed_s"] <= row["median_s"] for row in saved["rows"])
    methods = [row for row in saved["rows"] if row["hook"].startswith("spardl")]
    assert sorted(saved["threads"]) == ["spardl", "spardl:wire=fp16"]
    for row in methods:  # where the communication thread's time went
        assert 0 < row["thread_cpu_s"] and 0 < row["transport_s"] < row["thread_s"]
    assert all(row["thread_s"] is None for row in saved["rows"] if row not in methods)
    assert saved["setting"]["ranks"] == 2 and saved["setting"]["model"] == "cnn"


@pytest.mark.parametrize(
    "flags,fragment",
    [
        (["--hooks", "compute,nonesuch"], "unknown hook 'nonesuch'"),
        (["--hooks", "ddp,ddp"], "names a hook twice"),
        (["--hooks", "spardl:nope=1"], "hook 'spardl:nope=1': "),
        (["--hooks", "ddp:wire=fp16"], "ddp takes no options"),
        (["--model", "nonesuch"], "unknown model"),
        (["--iters", "0"], "--iters must be at least 1"),
        (["--powersgd-start-iter", "1"], "at least 2"),
    ],
)
def test_bad_input_is_one_line_and_status_2(flags, fragment, capsys):
    with pytest.raises(SystemExit) as stopped:
        ddp_compare.main(flags)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1
