"""The bucket pipeline on the in-process group: same bits as blocking calls, overlap, errors."""

import threading
import time

import pytest
import torch

import compressors
from allreducers.transports import TAG_STRIDE, TaggedTransport, local_group
from compressors.pipeline import BucketPipeline, comm_thread
from compressors.stats import call_record

# Three buckets of parameters of uneven sizes, as a model's backward would produce them.
BUCKETS = [(["w2", "b2"], [300, 7]), (["w1"], [1000]), (["b1", "e"], [13, 1])]
STEPS = 3


def gradients(rank, step, sizes, index):
    generator = torch.Generator().manual_seed(1000 * step + 100 * index + rank)
    return torch.randn(sum(sizes), generator=generator) * (1 + index)


def options(method):
    return {"dense_warmup": 1} if method == "topk" else {}


def pipelined(transport, method, density):
    """Every bucket submitted before any is waited for, per step; results and residuals."""
    pipeline = BucketPipeline(transport, method, density, options(method))
    history = []
    for step in range(STEPS):
        futures = [
            pipeline.submit(keys, sizes, gradients(transport.rank, step, sizes, index), index)
            for index, (keys, sizes) in enumerate(BUCKETS)
        ]
        pipeline.wait()
        stats = pipeline.take_stats()
        history.append(
            (
                [future.value().clone() for future in futures],
                [
                    pipeline.residuals.layouts[",".join(keys)].sync.residual.clone()
                    for keys, _ in BUCKETS
                ],
                stats,
            )
        )
    return history


def blocking(transport, method, density):
    """The same buckets, each by a synchronizer of its own called in place, one after another."""
    syncs = [
        compressors.create(method, transport, numel=sum(sizes), density=density, **options(method))
        for _, sizes in BUCKETS
    ]
    history = []
    for step in range(STEPS):
        results, traffic = [], []
        for index, ((_, sizes), sync) in enumerate(zip(BUCKETS, syncs)):
            results.append(sync.allreduce(gradients(transport.rank, step, sizes, index)).clone())
            traffic.append(sync.stats["bytes_sent"])
        history.append((results, [sync.residual.clone() for sync in syncs], traffic))
    return history


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("method", compressors.available())
def test_pipeline_gives_the_bits_of_blocking_calls_per_bucket(method, workers):
    density = 0.05
    overlapped = local_group(workers).run(pipelined, method, density)
    reference = local_group(workers).run(blocking, method, density)
    for rank in range(workers):
        for step in range(STEPS):
            results, residuals, stats = overlapped[rank][step]
            want_results, want_residuals, want_bytes = reference[rank][step]
            for got, want in zip(results + residuals, want_results + want_residuals):
                assert torch.equal(got, want), (method, rank, step)
            assert [b["bytes_sent"] for b in stats["buckets"]] == want_bytes
            assert [b["space"] for b in stats["buckets"]] == [0, 1, 2]
            assert stats["bytes_sent"] == sum(want_bytes)
            assert torch.equal(results[0], overlapped[0][step][0][0])  # same on every rank
    if compressors.resolve(method).conserves_mass:  # sum of gradients = P result + residuals
        for step in range(STEPS):
            for index, (_, sizes) in enumerate(BUCKETS):
                raw = sum(
                    gradients(r, s, sizes, index).double()
                    for r in range(workers)
                    for s in range(step + 1)
                )
                applied = sum(
                    workers * overlapped[0][s][0][index].double() for s in range(step + 1)
                )
                kept = sum(overlapped[r][step][1][index].double() for r in range(workers))
                assert torch.allclose(applied + kept, raw, atol=1e-4), (method, step, index)


def test_futures_stay_pending_while_the_thread_is_busy_and_complete_in_order():
    def body(transport):
        pipeline = BucketPipeline(transport, "spardl", 0.1)
        gate = threading.Event()
        comm_thread(transport).put(gate.wait)  # hold the thread: backward would go on now
        futures = [
            pipeline.submit(keys, sizes, torch.ones(sum(sizes)), index)
            for index, (keys, sizes) in enumerate(BUCKETS)
        ]
        pending = [not future.done() for future in futures]
        assert not pipeline.idle
        gate.set()
        pipeline.wait()
        return pending, [future.value().numel() for future in futures]

    for pending, sizes in local_group(2).run(body):
        assert all(pending)
        assert sizes == [sum(s) for _, s in BUCKETS]


def test_an_error_lands_in_the_future_and_wait_raises_it():
    def body(transport):
        pipeline = BucketPipeline(transport, "topk", 0.1)
        bad = torch.ones(10)
        bad[3] = float("nan")
        future = pipeline.submit(["a"], [10], bad)
        with pytest.raises(ValueError, match="NaN or inf"):
            pipeline.wait()
        with pytest.raises(ValueError, match="NaN or inf"):
            future.wait()
        assert pipeline.idle
        # The pipeline goes on (bucket "a"'s residual holds the NaN now: a new bucket).
        return pipeline.synchronize(["b"], [10], torch.ones(10)).sum().item()

    assert local_group(2).run(body) == [pytest.approx(1.0)] * 2


def test_skip_nonfinite_gives_nan_everywhere_and_keeps_residuals():
    def body(transport):
        pipeline = BucketPipeline(transport, "spardl", 0.1, skip_nonfinite=True)
        pipeline.synchronize(["a"], [50], torch.arange(50.0))
        before = pipeline.residuals.residual("a").clone()
        grad = torch.ones(50)
        if transport.rank == 1:
            grad[7] = float("inf")
        result = pipeline.synchronize(["a"], [50], grad)
        return bool(result.isnan().all()), torch.equal(pipeline.residuals.residual("a"), before)

    assert local_group(2).run(body) == [(True, True)] * 2


def test_other_dtypes_are_synchronized_in_float32_and_cast_back():
    def body(transport):
        pipeline = BucketPipeline(transport, "dense", 1.0)
        grad = torch.full((8,), float(transport.rank + 1), dtype=torch.float64)
        return pipeline.synchronize(["a"], [8], grad)

    for result in local_group(2).run(body):
        assert result.dtype == torch.float64 and torch.equal(
            result, torch.full((8,), 1.5, dtype=torch.float64)
        )


def test_a_bucket_whose_size_differs_from_its_parameters_is_refused():
    def body(transport):
        with pytest.raises(RuntimeError, match="entries for parameters of"):
            BucketPipeline(transport, "dense", 1.0).synchronize(["a"], [5], torch.ones(6))

    local_group(1).run(body)


def test_tagged_transport_keeps_spaces_apart_and_counts_its_own_traffic():
    def body(transport):
        first, second = TaggedTransport(transport, 0), TaggedTransport(transport, 1)
        assert second.offset == TAG_STRIDE
        peer = 1 - transport.rank
        # Sent in one order, received in the other: the tags tell them apart.
        handles = [
            first.isend(torch.full((3,), 1.0), peer, 5),
            second.isend(torch.full((2,), 2.0), peer, 5),
        ]
        late = second.recv(peer, 5, torch.float32, torch.device("cpu"))
        early = first.recv(peer, 5, torch.float32, torch.device("cpu"))
        first.waitall(handles[:1])
        second.waitall(handles[1:])
        with pytest.raises(ValueError, match="outside this view's range"):
            first.isend(torch.ones(1), peer, TAG_STRIDE)
        total = second.allreduce_sum_(torch.ones(4))
        return (
            early.tolist(),
            late.tolist(),
            first.traffic.bytes_sent,
            second.traffic.messages,
            transport.traffic.bytes_sent,
            total.tolist(),
        )

    for result in local_group(2).run(body):
        assert result == ([1.0] * 3, [2.0] * 2, 12, 1 + 2, 0, [2.0] * 4)


def test_a_view_counts_the_host_syncs_its_calls_made_on_the_base():
    def body(transport):
        def waiting_recv(*args, real=transport._recv):
            transport.traffic.host_syncs += 1  # as the MPI transport's staging does
            return real(*args)

        transport._recv = waiting_recv
        first, second = TaggedTransport(transport, 0), TaggedTransport(transport, 1)
        peer = 1 - transport.rank
        handle = first.isend(torch.ones(2), peer, 0)
        first.recv(peer, 0, torch.float32, torch.device("cpu"))
        first.waitall([handle])
        return first.traffic.host_syncs, second.traffic.host_syncs

    assert local_group(2).run(body) == [(1, 0), (1, 0)]


def test_a_negative_tag_space_is_refused():
    with pytest.raises(ValueError, match="tag space"):
        TaggedTransport(local_group(1).rank(0), -1)


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.Linear(32, 4)
    )


def _backward(net, rank, step):
    generator = torch.Generator().manual_seed(10 * step + rank)
    net(torch.randn(8, 16, generator=generator)).square().sum().backward()


def test_gradient_buckets_average_a_models_gradients_as_blocking_calls_do():
    from compressors.buckets import GradientBuckets

    # Built here: torch.manual_seed in the rank threads would race on the global generator.
    models = [(_net(), _net()) for _ in range(2)]

    def body(transport):
        net, reference = models[transport.rank]
        net[2].weight.requires_grad_(False)  # frozen: in no bucket
        reference[2].weight.requires_grad_(False)
        overlapped = GradientBuckets(
            net, BucketPipeline(transport, "spardl", 0.1), bucket_mb=200 * 4 / 2**20
        )
        assert overlapped.buckets == [["3.bias", "3.weight", "2.bias"], ["0.bias"], ["0.weight"]]
        blocking = BucketPipeline(transport, "spardl", 0.1)
        results = []
        for step in range(3):
            for model in (net, reference):
                model.zero_grad()
                _backward(model, transport.rank, step)
            overlapped.finish()
            for index, names in enumerate(overlapped.buckets):
                params = [dict(reference.named_parameters())[name] for name in names]
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                averaged = blocking.synchronize(names, [p.numel() for p in params], flat, index)
                got = torch.cat([dict(net.named_parameters())[n].grad.reshape(-1) for n in names])
                results.append(torch.equal(got, averaged))
        assert net[2].weight.grad is None
        return results, overlapped.pipeline.residuals.state_dict().keys()

    for results, layouts in local_group(2).run(body):
        assert all(results)
        assert set(layouts) == {"3.bias,3.weight,2.bias", "0.bias", "0.weight"}


def test_gradient_buckets_dense_is_the_average_and_missing_gradients_count_as_zeros():
    from compressors.buckets import GradientBuckets

    nets = [_net() for _ in range(2)]

    def body(transport):
        net = nets[transport.rank]
        buckets = GradientBuckets(net, BucketPipeline(transport, "dense", 1.0))
        assert len(buckets.buckets) == 1
        if transport.rank == 0:
            _backward(net, 0, 0)
        mine = {n: None if p.grad is None else p.grad.clone() for n, p in net.named_parameters()}
        buckets.finish()
        return mine, {n: p.grad.clone() for n, p in net.named_parameters()}

    (raw, averaged), (nothing, averaged_too) = local_group(2).run(body)
    assert all(g is None for g in nothing.values())
    for name, gradient in raw.items():
        assert torch.allclose(averaged[name], gradient / 2)
        assert torch.equal(averaged[name], averaged_too[name])


def test_gradient_buckets_refuse_a_bad_size_or_a_frozen_model():
    from compressors.buckets import GradientBuckets

    pipeline = BucketPipeline(local_group(1).rank(0), "dense", 1.0)
    with pytest.raises(ValueError, match="bucket_mb"):
        GradientBuckets(_net(), pipeline, bucket_mb=0)
    with pytest.raises(ValueError, match="no trainable parameter"):
        GradientBuckets(_net().requires_grad_(False), pipeline)


def test_stats_are_per_bucket_and_summed_per_step_in_the_one_record():
    def body(transport):
        pipeline = BucketPipeline(transport, "topk", 0.1, count_nnz=True)
        for index, (keys, sizes) in enumerate(BUCKETS):
            pipeline.submit(keys, sizes, torch.randn(sum(sizes)), index)
        pipeline.wait()
        stats = pipeline.take_stats()
        assert pipeline.take_stats()["parts"] == []  # taken once
        return stats

    for stats in local_group(2).run(body):
        parts = stats["parts"]
        assert stats["buckets"] is parts  # (its name before)
        assert [b["numel"] for b in parts] == [sum(s) for _, s in BUCKETS]
        # each bucket's record is its synchronizer's call's: the same fields
        assert all(set(call_record({}, 0, {})) <= set(b) for b in parts)
        assert all(b["nnz"] is not None and b["seconds"]["total"] > 0 for b in parts)
        for key in ("bytes_sent", "messages", "rounds", "nnz", "thread_seconds", "cpu_seconds"):
            assert stats[key] == sum(b[key] for b in parts)
        assert all(0 < b["cpu_seconds"] for b in parts)
        for phase in ("select", "comm", "accumulate", "total"):
            assert stats["seconds"][phase] == pytest.approx(sum(b["seconds"][phase] for b in parts))


def test_finish_tells_every_rank_alike_when_an_average_is_not_finite():
    from compressors.buckets import GradientBuckets

    nets = [_net() for _ in range(2)]

    def body(transport, poison):
        net = nets[transport.rank]
        pipeline = BucketPipeline(transport, "spardl", 0.1, skip_nonfinite=True)
        buckets = GradientBuckets(net, pipeline, bucket_mb=200 * 4 / 2**20)
        net.zero_grad()
        generator = torch.Generator().manual_seed(transport.rank)
        x = torch.randn(8, 16, generator=generator)
        if poison and transport.rank == 1:
            x[0, 0] = float("nan")
        net(x).square().sum().backward()
        finite = buckets.finish()
        buckets.remove()
        return finite

    assert local_group(2).run(body, False) == [True, True]
    assert local_group(2).run(body, True) == [False, False]


def test_a_stopped_comm_thread_runs_its_queued_jobs_ends_and_is_replaced():
    from compressors.pipeline import comm_thread

    transport = local_group(1).rank(0)
    thread = comm_thread(transport)
    ran = []
    assert thread.put(lambda: (time.sleep(0.05), ran.append(1)))
    assert thread.put(lambda: ran.append(2))
    thread.stop()
    assert ran == [1, 2] and not thread.thread.is_alive()
    assert not thread.put(lambda: ran.append(3))
    fresh = comm_thread(transport)
    assert fresh is not thread and fresh.put(lambda: ran.append(4))
    fresh.stop()
    assert ran == [1, 2, 4]


def test_closing_a_pipeline_runs_its_buckets_and_ends_its_thread():
    from compressors.pipeline import comm_thread

    transport = local_group(1).rank(0)
    pipeline = BucketPipeline(transport, "topk", 0.5)
    thread = comm_thread(transport)
    pipeline.close()
    assert not thread.thread.is_alive()
    pipeline.close()  # nothing left to end
