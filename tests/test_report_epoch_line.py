"""The trainer's epoch line names every part of the time and says per what: the parts add up."""

import re

import pytest

from trainer.metrics import format_row, time_split

ROW = {
    "epoch": 2,
    "max_epochs": 5,
    "iters": 40,
    "epoch_iters": 20,
    "train_loss": 1.0,
    "test_loss": 1.0,
    "test_acc": 0.5,
    "lr": 0.1,
    "epoch_seconds": 6.61,  # 330.5 ms per iteration
    "compute_seconds": 0.906,
    "sync_seconds": 4.808,
    "exposed_sync_seconds": 4.808,
    "select_seconds": 0.294,
    "comm_seconds": 3.202,
    "bytes_sent_per_rank": 20 * 4096,
}

#: ``T = compute C + exposed sync E + other O; sync S = select A + comm B + other R``
LINE = re.compile(
    r"per (?P<unit>iteration|epoch): (?P<total>\S+) = compute (?P<compute>\S+) \+ exposed sync "
    r"(?P<exposed>\S+) \+ other (?P<other>\S+); sync (?P<sync>\S+) = select (?P<select>\S+) \+ "
    r"comm (?P<comm>\S+) \+ other (?P<sync_other>\S+); sent (?P<bytes>.+)/rank$"
)


def parts(line: str) -> dict:
    """The printed parts of an epoch line, in milliseconds (and the unit and bytes as printed)."""
    found = LINE.search(line)
    assert found, line
    values = found.groupdict()
    for key, text in values.items():
        if key not in ("unit", "bytes"):
            values[key] = float(text[:-2]) if text.endswith("ms") else 1e3 * float(text[:-1])
    return values


@pytest.mark.parametrize(
    "changes",
    [
        {},  # blocking: exposed is all of sync
        {"exposed_sync_seconds": 0.5},  # overlapped: most of sync hidden behind compute
        {"exposed_sync_seconds": 0.0, "sync_seconds": 0.9},  # all of it hidden
        {  # one iteration of seconds: parts printed in s and in ms
            "epoch_iters": 1,
            "epoch_seconds": 2.5,
            "compute_seconds": 1.2,
            "sync_seconds": 1.1,
            "exposed_sync_seconds": 1.1,
            "select_seconds": 0.3,
            "comm_seconds": 0.6,
        },
    ],
)
def test_the_parts_add_up_to_the_total_and_to_sync(changes):
    row = dict(ROW, **changes)
    t = time_split(row)
    assert t["compute"] + t["exposed"] + t["other"] == pytest.approx(t["total"])
    assert t["select"] + t["comm"] + t["sync_other"] == pytest.approx(t["sync"])
    printed = parts(format_row(row))
    assert printed["unit"] == "iteration"
    # Each printed part is rounded to 0.1 ms: the sum of three is off by at most 0.15 ms.
    for total, terms in (("total", ("compute", "exposed", "other")), ("sync", ("select", "comm"))):
        terms = terms + (("sync_other",) if total == "sync" else ())
        tolerance = 0.15 if printed[total] < 1e3 else 150  # "1.2s" has one decimal of seconds
        assert sum(printed[term] for term in terms) == pytest.approx(printed[total], abs=tolerance)
    assert printed["total"] == pytest.approx(1e3 * row["epoch_seconds"] / row["epoch_iters"], 0.01)


def test_the_line_is_per_iteration_and_keeps_one_form_whether_or_not_sync_overlapped():
    blocking = format_row(ROW)
    assert "6.6s for 20 iterations; per iteration: 330.5ms = compute 45.3ms + exposed sync " in (
        blocking
    )
    assert (
        "240.4ms + other 44.8ms; sync 240.4ms = select 14.7ms + comm 160.1ms + other 65.6ms; "
        in blocking
    )
    assert blocking.endswith("; sent 4 KiB/rank")  # per iteration, as the times
    overlapped = format_row(dict(ROW, exposed_sync_seconds=0.5))
    assert "+ exposed sync 25.0ms + other 260.2ms; sync 240.4ms = " in overlapped
    # Every epoch prints the same parts in the same order, exposed or not, overlapped or not.
    shape = [re.sub(r"[-\d.]+(ms|s|KiB|B)", "N", line) for line in (blocking, overlapped)]
    assert shape[0] == shape[1]


def test_a_row_without_epoch_iters_says_its_times_are_per_epoch():
    """Older trainers wrote no ``epoch_iters`` nor ``exposed_sync_seconds``."""
    row = {k: v for k, v in ROW.items() if k not in ("epoch_iters", "exposed_sync_seconds")}
    printed = parts(format_row(row))
    assert printed["unit"] == "epoch" and printed["total"] == pytest.approx(6600, abs=1)
    assert printed["exposed"] == printed["sync"]
    assert "for 20 iterations" not in format_row(row)


def test_a_row_within_an_epoch_is_split_per_iteration_of_its_own():
    row = dict(ROW, within_epoch=True, epoch_iters=5, epoch_seconds=1.0)
    line = format_row(row)
    assert line.startswith("epoch   2/5 (iteration 40)")
    assert "1.0s for 5 iterations; per iteration: 200.0ms = " in line
