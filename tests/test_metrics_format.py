"""The trainer's one-line epoch summary: short phases in milliseconds, never "0.0s".

(That the parts of the line add up: tests/test_report_epoch_line.py.)"""

from trainer.metrics import format_row, format_seconds


def test_seconds_below_one_are_milliseconds():
    assert [format_seconds(s) for s in (0.0123, 0.0, 0.5, 1.0, 61.24)] == [
        "12.3ms",
        "0.0ms",
        "500.0ms",
        "1.0s",
        "61.2s",
    ]


def test_a_short_epoch_prints_its_split_in_milliseconds():
    row = {
        "epoch": 1,
        "max_epochs": 2,
        "train_loss": 1.0,
        "test_loss": 1.0,
        "test_acc": 0.5,
        "lr": 0.1,
        "epoch_seconds": 0.42,
        "compute_seconds": 0.3,
        "sync_seconds": 0.012,
        "select_seconds": 0.004,
        "comm_seconds": 0.006,
        "bytes_sent_per_rank": 2048,
    }
    assert (
        "per epoch: 420.0ms = compute 300.0ms + exposed sync 12.0ms + other 108.0ms; "
        "sync 12.0ms = select 4.0ms + comm 6.0ms + other 2.0ms; sent 2 KiB/rank" in format_row(row)
    )


def test_an_overlapped_synchronization_says_how_much_of_it_was_exposed():
    row = {
        "epoch": 1,
        "max_epochs": 2,
        "train_loss": 1.0,
        "test_loss": 1.0,
        "test_acc": 0.5,
        "lr": 0.1,
        "epoch_seconds": 0.42,
        "compute_seconds": 0.3,
        "sync_seconds": 0.2,
        "exposed_sync_seconds": 0.05,
        "select_seconds": 0.004,
        "comm_seconds": 0.15,
        "bytes_sent_per_rank": 2048,
    }
    assert "420.0ms = compute 300.0ms + exposed sync 50.0ms + other 70.0ms; sync 200.0ms = " in (
        format_row(row)
    )
    row.update(exposed_sync_seconds=0.2, epoch_seconds=0.6)  # blocking: the same form
    assert "600.0ms = compute 300.0ms + exposed sync 200.0ms + other 100.0ms; sync 200.0ms = " in (
        format_row(row)
    )
