"""A published table whose note says its raw rows are kept ("Raw rows: ...", not "Raw rows not
kept") must be one the checker regenerates (trainreport.docs.TABLES)."""

import os
import re

from tests.mpirun import ROOT
from trainreport import docs

RULE = re.compile(r"^\|[\s:|-]+\|?\s*$")


def tables(lines):
    """(first line, line after the last) of every Markdown table."""
    found, i = [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and RULE.match(lines[i + 1]):
            start = i
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            found.append((start, i))
        else:
            i += 1
    return found


def checked(root):
    """(document, first line) of every table in TABLES."""
    places = set()
    for table in docs.TABLES.values():
        lines = open(os.path.join(root, table.document)).read().split("\n")
        after = next(n for n, line in enumerate(lines) if table.after in line)
        places.add((table.document, next(s for s, _ in tables(lines) if s > after)))
    return places


def kept_but_unchecked(root):
    names = ["README.md"] + sorted(f"docs/{f}" for f in os.listdir(os.path.join(root, "docs")))
    covered, missing = checked(root), []
    for name in (n for n in names if n.endswith(".md")):
        lines = open(os.path.join(root, name)).read().split("\n")
        found = tables(lines)
        for number, (start, end) in enumerate(found):
            stop = found[number + 1][0] if number + 1 < len(found) else len(lines)
            note = []
            for line in lines[end:stop]:
                if line.startswith("#"):
                    break
                note.append(line)
            text = " ".join(note)
            if "Raw rows" in text and "Raw rows not kept" not in text:
                if (name, start) not in covered:
                    missing.append(f"{name}:{start + 1}")
    return missing


def test_every_table_noted_as_kept_is_regenerated():
    assert not kept_but_unchecked(ROOT), kept_but_unchecked(ROOT)


def test_a_kept_table_left_out_of_the_check_fails(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# x\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nRaw rows: `runs/x`.\n"
    )
    monkeypatch.setattr(docs, "TABLES", {})
    assert kept_but_unchecked(str(tmp_path)) == ["README.md:3"]
