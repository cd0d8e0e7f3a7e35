"""The repository stands on its own: no tracked file names a path outside it, and only
tests/conftest.py touches sys.path (the library is installed with ``pip install -e .``; the
trainer runs from the repository folder)."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Built from pieces, so that this file does not match itself.
SHARED, WORK, SPEC, CONTRACT = "../" + "shared", "/" + "work/", "SPEC" + ".md", "CONTRACT" + ".md"
OUTSIDE = re.compile("|".join(re.escape(piece) for piece in (SHARED, WORK, SPEC, CONTRACT)))
SYS_PATH = re.compile(r"\bsys\." + r"path\s*(\.\s*(insert|append|extend|remove)\b|\[|[+]?=)")
SYS_PATH_ALLOWED = {"tests/conftest.py"}


def _tracked_texts():
    """(path, text) of every tracked file that is UTF-8 text."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"not a git checkout ({error})")
    for name in filter(None, listed.decode().split("\0")):
        path = ROOT / name
        if not path.is_file():  # deleted in the working tree
            continue
        try:
            yield name, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue


def _hits(pattern, files):
    return [
        f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
        for name, text in files
        for match in pattern.finditer(text)
    ]


def test_no_tracked_file_names_a_path_outside_the_repository():
    assert _hits(OUTSIDE, _tracked_texts()) == []


def test_only_the_test_setup_changes_sys_path():
    python = [
        (name, text)
        for name, text in _tracked_texts()
        if name.endswith(".py") and name not in SYS_PATH_ALLOWED
    ]
    assert _hits(SYS_PATH, python) == []


def test_the_checks_find_what_they_look_for():
    outside = f"see {SHARED}/{SPEC}\nand {WORK}main, {CONTRACT}\n"
    assert _hits(OUTSIDE, [("x", outside)]) == [
        f"x:1: {SHARED}",
        f"x:1: {SPEC}",
        f"x:2: {WORK}",
        f"x:2: {CONTRACT}",
    ]
    assert (
        len(_hits(SYS_PATH, [("x", "sys." + "path.insert(0, ROOT)\nsys." + "path += [d]\n")])) == 2
    )
    assert _hits(SYS_PATH, [("x", "print(sys." + "path)\n")]) == []


def test_the_registry_lives_in_its_own_module_and_the_methods_import_it_there():
    import compressors
    from compressors import registry

    assert compressors.create is registry.create and compressors.register is registry.register
    for path in (ROOT / "compressors").glob("*.py"):
        assert "from . import register" not in path.read_text(), path.name
