"""Every table the documents publish from raw rows regenerates from them (trainreport.docs)."""

import shutil
from pathlib import Path

import pytest

from trainreport import docs

ROOT = Path(__file__).resolve().parents[1]


def test_every_published_table_matches_its_raw_rows(capsys):
    assert docs.main(["check"]) == 0
    assert f"{len(docs.TABLES)} of {len(docs.TABLES)} tables match" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name, page, old, new",
    [
        ("hook-momentum", "DDP_HOOK.md", "| 0.152 (0.125-0.197) |", "| 0.150 (0.125-0.197) |"),
        # a table indented inside a list item
        ("lean-replay", "PERFORMANCE.md", "| zen | 4.92 / 4.77 |", "| zen | 4.92 / 4.71 |"),
    ],
)
def test_a_number_changed_in_a_document_is_named(tmp_path, capsys, name, page, old, new):
    for part in (
        "docs",
        "runs/experiments",
        "runs/convergence",
        "runs/lean-engine",
        "runs/deviations",
        "runs/elastic",
        "runs/headline",
        "runs/local-sgd",
        "runs/gpu-projection",
    ):
        shutil.copytree(ROOT / part, tmp_path / part)
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")  # the headline table
    path = tmp_path / "docs" / page
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))
    assert docs.main(["check", "--root", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert f"{name} (docs/{page})" in captured.err and new.strip("| ") in captured.err
    assert f"{len(docs.TABLES) - 1} of {len(docs.TABLES)} tables match" in captured.out


def test_tables_without_raw_rows_say_so_in_one_form():
    """Each published table whose rows were not kept carries one line: what is missing, and the
    machine and date its figures were measured on."""
    lines = [
        line.strip()
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for line in page.read_text().splitlines()
        if line.strip().lower().startswith("raw rows not kept")
    ]
    assert lines
    for line in lines:
        assert line.startswith("Raw rows not kept: "), line
        assert "; the figures are as measured on " in line and line.endswith("."), line


def test_show_prints_a_table_and_an_unknown_name_exits_2(capsys):
    assert docs.main(["show", "tta-seeds"]) == 0
    assert capsys.readouterr().out.startswith("| method | seeds |")
    with pytest.raises(SystemExit) as stop:
        docs.main(["show", "nope"])
    assert stop.value.code == 2
