"""The process-lifecycle policy lives in its own module; the transport's old names still work."""

import sys

import pytest

MPI = pytest.importorskip("mpi4py.MPI")

from allreducers.transports import lifecycle, mpi  # noqa: E402 - after the skip


def test_the_old_names_are_the_policys():
    for name in ("abort_on_uncaught_exception", "end_interrupted", "report_and_abort"):
        assert getattr(mpi, name) is getattr(lifecycle, name)


def test_thread_level_is_checked_with_one_clear_message(monkeypatch):
    assert lifecycle.require_thread_level(MPI.Query_thread()) == MPI.Query_thread()
    monkeypatch.setattr(MPI, "Query_thread", lambda: MPI.THREAD_FUNNELED)
    with pytest.raises(
        RuntimeError,
        match="needs MPI_THREAD_SERIALIZED, but MPI was started with MPI_THREAD_FUNNELED",
    ):
        lifecycle.require_thread_level(what="x")
    assert lifecycle.thread_level_name(MPI.THREAD_MULTIPLE) == "MPI_THREAD_MULTIPLE"


def test_the_abort_hook_replaces_only_default_hooks(monkeypatch):
    class Two:
        def Get_size(self):
            return 2

        def Get_rank(self):
            return 0

    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    assert lifecycle.install_abort_hook(Two()) and sys.excepthook is not sys.__excepthook__

    def _distributed_excepthook(*args):  # torch.distributed's, by name and module
        pass

    _distributed_excepthook.__module__ = "torch.distributed.distributed_c10d"
    monkeypatch.setattr(sys, "excepthook", _distributed_excepthook)
    assert lifecycle.install_abort_hook(Two())

    def own(*args):
        pass

    monkeypatch.setattr(sys, "excepthook", own)
    assert not lifecycle.install_abort_hook(Two()) and sys.excepthook is own
