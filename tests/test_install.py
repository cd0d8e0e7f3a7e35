"""The library installs with ``pip install -e .`` and then imports from any folder, without
putting the trainer's own ``datasets`` and ``models`` packages on the environment's path."""

import json
import os
import subprocess
import sys
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = ["compressors", "allreducers", "syncbench", "trainreport"]
NOT_INSTALLED = ["datasets", "models", "trainer", "main_trainer", "hooks"]
# Where each name resolves, or None; run from a folder outside the repository.
#: The environment of the fresh venv's processes: a PYTHONPATH of the caller's (one that names this
#: repository, say) would put the library on the path before it is installed.
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
PROBE = (
    "import importlib.util, json, sys; "
    "print(json.dumps({name: getattr(importlib.util.find_spec(name), 'origin', None) "
    "for name in sys.argv[1:]}))"
)

#: Imports every installed package and the modules users name, beside Jupyter's ``comm``.
IMPORT_ALL = (
    "import comm, compressors, compressors.ddp, allreducers.transports, syncbench, "
    "trainreport; from allreducers.transports import local_group; "
    "from compressors.ddp import SparDLState, spardl_hook; "
    "print(sorted(compressors.available())); print(comm.__file__)"
)


def _origins(python, names, cwd):
    result = subprocess.run(
        [python, "-c", PROBE, *names],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)


@pytest.mark.slow
def test_editable_install_in_a_fresh_venv(tmp_path):
    venv, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
    )
    python = str(venv / "bin" / "python")
    # The fresh venv borrows this environment's packages (pip, setuptools, torch: nothing is
    # downloaded) through a path entry; .pth files in a folder added that way are not run, so
    # an install of the library here does not leak into the fresh venv.
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        env=ENV,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    with open(os.path.join(purelib, "borrowed.pth"), "w") as borrowed:
        borrowed.write(sysconfig.get_paths()["purelib"] + "\n")
    assert _origins(python, LIBRARY, elsewhere) == dict.fromkeys(LIBRARY)

    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-e",
            ROOT,
        ],
        cwd=elsewhere,
        env=ENV,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )

    origins = _origins(python, LIBRARY + NOT_INSTALLED, elsewhere)
    for name in LIBRARY:
        assert origins[name] is not None and origins[name].startswith(os.path.join(ROOT, name)), (
            origins
        )
    for name in NOT_INSTALLED:  # absent, or another distribution's (Hugging Face's datasets)
        assert origins[name] is None or not origins[name].startswith(ROOT + os.sep), origins
    imported = subprocess.run(
        [python, "-c", IMPORT_ALL],
        cwd=elsewhere,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert imported.returncode == 0, imported.stderr
    assert "spardl" in imported.stdout
    # Jupyter's ``comm`` (a requirement of this environment, as of most notebook environments)
    # is still the one that ``import comm`` finds: nothing of ours competes for its name.
    jupyter_comm = imported.stdout.split()[-1]
    assert f"{os.sep}site-packages{os.sep}comm{os.sep}" in jupyter_comm, imported.stdout
