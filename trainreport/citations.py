"""Figures quoted in prose, checked against the table they cite.

A sentence (or a table cell) that quotes a regenerated table ends its claim with the marker
``(rows: `NAME`)``, NAME a table of ``trainreport.docs.TABLES``. Every figure with a decimal
point in the claim, the text from the start of its sentence, list item or cell up to the
marker, must appear in that table as the raw rows give it (``python -m trainreport.docs show
NAME``). Whole numbers (P = 4, 3 seeds) are not checked.
"""

from __future__ import annotations

import os
import re

__all__ = ["MARKER", "DOCUMENTS", "Citation", "citations", "problems"]

#: The marker that ends a claim: ``(rows: `NAME`)``.
MARKER = re.compile(r"\(rows:\s+`([A-Za-z0-9-]+)`\)")
#: The documents whose prose is checked.
DOCUMENTS = ("README.md", "docs")
_FIGURE = re.compile(r"(?<![\w.])\d[\d,]*\.\d+(?![\d])")
#: Where a claim starts: a table cell, a paragraph, a list item, a sentence, an earlier marker.
_START = re.compile(r"\||\n\s*\n|\n\s*- |\.\s|;\s")


class Citation:
    """One claim: where it is, the table it cites, its text and its figures."""

    def __init__(self, document: str, line: int, table: str, claim: str) -> None:
        self.document, self.line, self.table, self.claim = document, line, table, claim
        self.figures = [f.replace(",", "") for f in _FIGURE.findall(claim)]


def _documents(root: str) -> list:
    found = []
    for name in DOCUMENTS:
        path = os.path.join(root, name)
        if os.path.isdir(path):
            found += sorted(os.path.join(name, f) for f in os.listdir(path) if f.endswith(".md"))
        elif os.path.exists(path):
            found.append(name)
    return found


def citations(root: str) -> list:
    """Every claim that cites a table, in document order."""
    found = []
    for document in _documents(root):
        with open(os.path.join(root, document)) as stream:
            text = stream.read()
        start = 0
        for marker in MARKER.finditer(text):
            before = text[start : marker.start()]
            starts = list(_START.finditer(before))
            claim = before[starts[-1].end() :] if starts else before
            line = text.count("\n", 0, marker.start()) + 1
            found.append(Citation(document, line, marker.group(1), " ".join(claim.split())))
            start = marker.end()
    return found


def problems(root: str, tables: dict) -> tuple:
    """Check every claim's figures against the table it cites.

    Returns:
        (the problems found, the number of figures checked). A problem is a cited table that
        is unknown or cannot be made, or a figure its table does not hold.
    """
    found, checked, made = [], 0, {}
    for citation in citations(root):
        where = f"{citation.document}:{citation.line}"
        if citation.table not in tables:
            found.append(f"{where}: cites an unknown table {citation.table!r}")
            continue
        if citation.table not in made:
            try:
                made[citation.table] = tables[citation.table].make(root).replace(",", "")
            except (OSError, ValueError) as error:
                found.append(f"{where}: {citation.table}: {error}")
                continue
        text = made[citation.table]
        for figure in citation.figures:
            checked += 1
            if not re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", text):
                found.append(
                    f"{where}: {figure} is not in table {citation.table} "
                    f"(claim: {citation.claim[:120]!r})"
                )
    return found, checked
