"""The bucket pipeline on CUDA: its work on a side stream, after the caller's, with the bits of
the blocking calls (skipped without a GPU)."""

import pytest
import torch

import compressors
from allreducers.transports import local_group
from compressors.pipeline import BucketPipeline, side_stream

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# Buckets as a backward pass would produce them; the last is float64, averaged in float32.
BUCKETS = [(["w2", "b2"], [30000, 70], torch.float32), (["w1"], [100000], torch.float32)]
BUCKETS += [(["b1", "e"], [130, 1], torch.float64)]
STEPS = 3
DENSITY = 0.05
SPIN = 10_000_000  # GPU cycles the caller's stream spins before it writes a bucket (a few ms)


def gradients(rank, step, index, dtype):
    generator = torch.Generator().manual_seed(1000 * step + 100 * index + rank)
    numel = sum(BUCKETS[index][1])
    return (torch.randn(numel, generator=generator) * (1 + index)).to(dtype).cuda()


def options(method):
    return {"dense_warmup": 1} if method == "topk" else {}


def pipelined(transport, method):
    """Each bucket written on the caller's busy stream and submitted at once; what ran where."""
    pipeline = BucketPipeline(transport, method, DENSITY, options(method))
    streams, average = [], pipeline._average

    def spy(*args):
        streams.append(torch.cuda.current_stream())
        return average(*args)

    pipeline._average = spy
    history = []
    for step in range(STEPS):
        futures = []
        for index, (keys, sizes, dtype) in enumerate(BUCKETS):
            grad = gradients(transport.rank, step, index, dtype)
            flat = torch.zeros_like(grad)
            torch.cuda._sleep(SPIN)  # the copy below is still queued when the bucket goes
            flat.copy_(grad)
            futures.append(pipeline.submit(keys, sizes, flat, index))
        pipeline.wait()
        residuals = [
            pipeline.residuals.layouts[",".join(keys)].sync.residual.clone()
            for keys, _, _ in BUCKETS
        ]
        history.append(([future.wait().clone() for future in futures], residuals))
    return history, streams, side_stream(transport, torch.device("cuda"))


def blocking(transport, method):
    """The same buckets, each by a synchronizer of its own, called in place on this stream."""
    syncs = [
        compressors.create(method, transport, numel=sum(sizes), density=DENSITY, **options(method))
        for _, sizes, _ in BUCKETS
    ]
    history = []
    for step in range(STEPS):
        results = [
            sync.allreduce(gradients(transport.rank, step, index, dtype).float()).to(dtype)
            for index, ((_, _, dtype), sync) in enumerate(zip(BUCKETS, syncs))
        ]
        history.append(([r.clone() for r in results], [sync.residual.clone() for sync in syncs]))
    return history


@pytest.mark.parametrize("method", compressors.available())
def test_cuda_pipeline_runs_on_a_side_stream_with_the_bits_of_blocking_calls(method):
    workers = 2
    overlapped = local_group(workers).run(pipelined, method)
    reference = local_group(workers).run(blocking, method)
    for rank in range(workers):
        history, streams, side = overlapped[rank]
        assert len(streams) == STEPS * len(BUCKETS)
        assert all(stream == side for stream in streams)
        assert side != torch.cuda.default_stream()
        for step in range(STEPS):
            (results, residuals), (want_results, want_residuals) = (
                history[step],
                reference[rank][step],
            )
            for got, want in zip(results + residuals, want_results + want_residuals):
                assert got.is_cuda and got.dtype == want.dtype
                assert torch.equal(got, want), (method, rank, step)
