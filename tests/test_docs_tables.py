"""Every table the documents publish from raw rows regenerates from them (trainreport.docs)."""

import shutil
from pathlib import Path

import pytest

from trainreport import docs

ROOT = Path(__file__).resolve().parents[1]


def test_every_published_table_matches_its_raw_rows(capsys):
    assert docs.main(["check"]) == 0
    assert f"{len(docs.TABLES)} of {len(docs.TABLES)} tables match" in capsys.readouterr().out


def test_a_number_changed_in_a_document_is_named(tmp_path, capsys):
    for part in ("docs", "runs/experiments", "runs/convergence"):
        shutil.copytree(ROOT / part, tmp_path / part)
    page = tmp_path / "docs" / "DDP_HOOK.md"
    page.write_text(page.read_text().replace("| 0.152 (0.125-0.197) |", "| 0.150 (0.125-0.197) |"))
    assert docs.main(["check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "hook-momentum (docs/DDP_HOOK.md)" in err and "0.150 (0.125-0.197)" in err


def test_show_prints_a_table_and_an_unknown_name_exits_2(capsys):
    assert docs.main(["show", "tta-seeds"]) == 0
    assert capsys.readouterr().out.startswith("| method | seeds |")
    with pytest.raises(SystemExit) as stop:
        docs.main(["show", "nope"])
    assert stop.value.code == 2
