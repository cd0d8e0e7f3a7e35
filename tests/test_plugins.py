"""A method of another package joins through the ``compressors.methods`` entry-point group.

The test builds a tiny package with pip (no network: ``--no-build-isolation --no-deps`` into a
folder), then imports ``compressors`` in a fresh interpreter with that folder on the path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

MODULE = '''
from compressors.registry import register
from compressors.topk import TopK


@register("plugintopk", description="TopkA from another package")
class PluginTopK(TopK):
    """TopkA, registered by a package outside this repository."""


class Unregistered(TopK):
    """TopkA, registered under its entry point's name."""
'''

CHECK = """
import warnings
import torch
import compressors
from allreducers.transports import local_group

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    names = compressors.available()
print("warnings", [str(w.message) for w in caught])
assert "plugintopk" in names and "classtopk" in names, names
assert "brokentopk" not in names

def body(t):
    gradient = torch.arange(100, dtype=torch.float32) * (t.rank + 1)
    mine = compressors.create("plugintopk", t, numel=100, density=0.1).allreduce(gradient)
    theirs = compressors.create("topk", t, numel=100, density=0.1).allreduce(gradient)
    return torch.equal(mine, theirs), type(compressors.create("classtopk", t, numel=100)).name

print("results", local_group(2).run(body))
try:
    compressors.create("brokentopk", None, numel=10)
except ValueError as error:
    print("broken", error)
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    source = tmp_path_factory.mktemp("plugin")
    (source / "tinyplugin").mkdir()
    (source / "tinyplugin" / "__init__.py").write_text(textwrap.dedent(MODULE))
    (source / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [build-system]
            requires = ["setuptools>=64"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "tinyplugin"
            version = "0.0.1"

            [project.entry-points."compressors.methods"]
            plugintopk = "tinyplugin"
            classtopk = "tinyplugin:Unregistered"
            brokentopk = "tinyplugin_missing"
            """
        )
    )
    target = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    command += ["--no-deps", "--no-build-isolation", "--no-index", "--target", target, source]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return target


def test_an_installed_packages_method_is_found_by_name(installed):
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env=environment, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["results"] == "[(True, 'classtopk'), (True, 'classtopk')]"
    assert "'brokentopk'" in lines["warnings"] and "tinyplugin_missing" in lines["warnings"]
    assert lines["broken"].startswith("synchronization method 'brokentopk' did not load")
