"""The command-line scripts loaded as modules, so that tests can call their ``parse_args`` and
``main`` in-process (scripts/ is not a package; nothing is added to ``sys.path``)."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name: str):
    """The module of ``scripts/<name>.py``, run once per call."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
