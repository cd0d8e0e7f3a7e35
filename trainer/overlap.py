"""The trainer's overlapped synchronization: buckets averaged while backward goes on.

:class:`OverlappedSync` stands where the flat synchronizer stands in the loop: the model's
gradients go to :class:`compressors.buckets.GradientBuckets` in buckets of ``bucket_mb`` MiB,
each bucket is averaged by its own synchronizer on the pipeline's communication thread as soon
as backward has produced it, and :meth:`OverlappedSync.finish` waits for the last one. Each
bucket's selection is that bucket's own (a bucket's top-k is not the model's top-k:
docs/DESIGN.md, section "Overlap"); residuals belong to parameters, so checkpoints carry them
whatever the bucket layout.
"""

from __future__ import annotations

from compressors.buckets import GradientBuckets
from compressors.pipeline import BucketPipeline
from compressors.stats import summed
from trainer.checkpoint import mode_mismatch
from trainer.flat import WholeState


class OverlappedSync(WholeState):
    """Averages ``model``'s gradients bucket by bucket with method ``name``, overlapped.

    Args:
        comm: the ``mpi4py`` communicator of the ranks.
        model: the module whose trainable parameters are synchronized.
        name: the registered method.
        density: the density of every bucket's synchronizer.
        options: the method's options.
        bucket_mb: the most MiB of float32 gradient per bucket.

    Attributes:
        numel: the number of synchronized entries (every trainable parameter's).
        stats: the last step's record, summed over the buckets (``compressors.stats``: the
            shape of a synchronizer's ``stats``), plus ``sync_seconds``: the buckets' time on
            the communication thread.
    """

    def __init__(self, comm, model, name, density, options, bucket_mb) -> None:
        # NaN or inf on any rank makes that bucket NaN on every rank (one extra one-element
        # all-reduce per bucket), so all ranks see the divergence at the same step.
        self.pipeline = BucketPipeline(comm, name, density, options, skip_nonfinite=True)
        self.buckets = GradientBuckets(model, self.pipeline, bucket_mb)
        self.name, self.density = self.pipeline.method, density
        self.numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self.forward_model = model
        self.stats = _stats(summed([], thread_seconds=0.0))

    overlaps_backward = True

    def finish(self, agree) -> None:
        """Wait for the step's buckets, put the averages into ``.grad``, then ``agree`` (with
        whether every average is finite: the same on every rank)."""
        finite = self.buckets.finish()
        self.stats = _stats(self.pipeline.take_stats())
        agree(finite=finite)

    def state_dict(self) -> dict:
        """Return the residuals of every bucket layout, by parameter (collective-free)."""
        return {
            "overlap": True,
            "method": self.name,
            "numel": self.numel,
            "buckets": self.pipeline.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; the layouts take their residuals at their first step."""
        self.pipeline.load_state_dict(state["buckets"])

    def state_mismatch(self, state) -> str | None:
        """Return why ``state`` cannot be loaded here, or ``None``."""
        mode = "a --no-overlap run (resume it with --no-overlap)"
        return mode_mismatch(state, "overlap", True, mode, self.name)


def _stats(taken: dict) -> dict:
    """The protocol's stats from a step's record (:meth:`BucketPipeline.take_stats`)."""
    return {
        **taken,
        "sync_seconds": taken["thread_seconds"],
        "compute_end": None,
        # teams="auto": per bucket, the configuration SparDL's probe chose and its times
        **(
            {"auto": autos} if (autos := [b["auto"] for b in taken["parts"] if "auto" in b]) else {}
        ),
    }
