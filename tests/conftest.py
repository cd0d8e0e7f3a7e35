"""Shared test setup: the repository root on sys.path, methods kept outside the repository
(``SPARDL_TEST_METHODS``) registered before the tests are collected."""

import os
import signal
import sys

# A test run started with SIGINT ignored (a background job of a script) would hand the ignore on
# to every process the interrupt tests start, which then could not be interrupted: handle it as
# Python does by default, so those processes start with the default action.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.ranks import import_extra_methods  # noqa: E402  (needs the root on sys.path)

import_extra_methods()
