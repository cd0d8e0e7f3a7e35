"""The documents' lists of models and methods name every one the code offers."""

import re
from pathlib import Path

from mpirun import ROOT

import compressors
from models import registry

DOCS = Path(ROOT) / "docs"
TASKS = {
    "image-classification": "image classification",
    "text-classification": "text classification",
    "masked-lm": "masked-LM",
}


def _line(text: str, start: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith(start)]
    return line


def test_the_models_table_names_every_model_and_its_task():
    text = (DOCS / "TRAINING.md").read_text()
    flag = _line(text, "| `--dnn NAME` |")
    rows = {}
    after = text.split("| `--dnn` | task (default `--dataset`) |", 1)[1]
    for line in after.splitlines()[2:]:
        if not line.startswith("| `"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            rows[name] = cells[1]
    for name in registry.available():
        assert f"`{name}`" in flag, name
        assert TASKS[registry.task(name)] in rows[name], name


def test_the_method_lists_name_every_registered_method():
    compressor = _line((DOCS / "TRAINING.md").read_text(), "| `--compressor NAME` |")
    hook = (DOCS / "DDP_HOOK.md").read_text().split("can average", 1)[0]
    for name in compressors.available():
        assert f"`{name}`" in compressor, name
        assert re.search(rf"\b{re.escape(name)}\b", hook), name
