"""Shared test setup: the repository root on sys.path, methods kept outside the repository
(``SPARDL_TEST_METHODS``) registered before the tests are collected."""

import atexit
import os
import shutil
import signal
import sys
import tempfile

import pytest

# A test run started with SIGINT ignored (a background job of a script) would hand the ignore on
# to every process the interrupt tests start, which then could not be interrupted: handle it as
# Python does by default, so those processes start with the default action.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# The data sets' caches go to the user's cache folder by default: a test run (and everything it
# spawns, which inherits the environment) writes into a temporary one instead, removed at exit.
_cache = tempfile.mkdtemp(prefix="spardl-test-cache-")
os.environ["XDG_CACHE_HOME"] = _cache
atexit.register(shutil.rmtree, _cache, ignore_errors=True)

from tests.ranks import import_extra_methods  # noqa: E402 - needs the root on sys.path

import_extra_methods()


@pytest.fixture(params=[1, 2], ids=["one-thread", "two-threads"])
def threads(request):
    """Both CPU selection paths: NumPy passes in chunks (one thread) and torch's (several)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(previous)
