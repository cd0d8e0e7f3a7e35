"""The lean engine: operations per call grow with the rounds, not with P; fixed-size messages
batch whole ranges of blocks; ranks that disagree on their settings are told so at the first
call."""

import threading
import warnings

import pytest
import torch

import compressors
from allreducers import codec
from allreducers.schedule import ceil_log2
from allreducers.transports import local_group
from syncbench.opcount import OperationCounter, count_call, count_method, host_syncs

pytestmark = pytest.mark.timeout(120)


def _count(method: str, workers: int, numel: int = 20000, **options) -> dict:
    def gradient(call: int) -> torch.Tensor:
        return torch.randn(numel, generator=torch.Generator().manual_seed(call))

    return local_group(workers).run(
        lambda transport: count_method(transport, method, numel, 0.01, gradient, **options)
    )[0]


def test_spardl_operations_grow_with_rounds_not_workers():
    """ops(P) = a + b * rounds(P): from P = 4 to 16 the count grows at most as the rounds do
    (4 to 8), and each doubling of P adds about the same operations (not twice as many)."""
    counts = {p: _count("spardl", p) for p in (2, 4, 8, 16)}
    ops = {p: counts[p]["ops"] for p in counts}
    rounds = {p: 2 * ceil_log2(p) for p in counts}  # Spar-Reduce-Scatter + the final gather
    assert ops[16] <= ops[4] * rounds[16] / rounds[4], ops
    steps = [ops[8] - ops[4], ops[16] - ops[8]]
    assert max(steps) <= 1.25 * min(steps) + 8, ops
    assert all(counts[p]["data_dependent_ops"] == 0 for p in counts), counts


@pytest.mark.parametrize("method", ["spardl", "zen", "oktopk", "gtopk", "topkdsa", "topk"])
def test_counting_nnz_reads_nothing_in_the_call(method):
    """With ``count_nnz`` (the default) a call reads no more from the device than without it:
    the count stays a tensor until ``stats`` is read, which then holds it as an int."""
    numel = 20000

    def run(transport) -> tuple:
        def gradient(call: int) -> torch.Tensor:
            seed = 10 * call + transport.rank
            return torch.randn(numel, generator=torch.Generator().manual_seed(seed))

        reads = []
        for count in (False, True):
            sync = compressors.create(method, transport, numel=numel, density=0.01)
            sync.count_nnz = count
            sync.allreduce(gradient(0))
            reads.append(count_call(sync, gradient(1), syncs=False)["data_dependent_ops"])
        return reads, sync.stats["nnz"]

    reads, nnz = local_group(3).run(run)[0]
    assert reads[0] == reads[1], reads
    assert type(nnz) is int and 0 < nnz <= numel, nnz


def test_counter_sees_data_dependent_reads():
    with OperationCounter() as counter:
        x = torch.arange(10.0)
        x[x > 4] = 0.0
        int(x.sum())
        torch.nonzero(x)
        x.tolist()
    assert counter.data_dependent == 4 and counter.total >= 5
    repeats = torch.tensor([1, 2, 3])
    with OperationCounter() as counter:  # told its output's size, repeat_interleave reads nothing
        torch.repeat_interleave(torch.arange(3), repeats, output_size=6)
        torch.repeat_interleave(torch.arange(3), repeats)
    assert counter.data_dependent == 1
    x = torch.arange(12.0)
    with OperationCounter() as counter:  # views do no work: they are not counted as working
        x.view(3, 4)[1:].t().unsqueeze(0)
        x.mul(2.0)
    assert counter.total == 5 and counter.working == 1


def test_fp32_rows_codec_sends_the_bytes_of_the_list_codec():
    """At fp32 ``encode_rows`` sends the bytes ``encode`` sends for the same lists, and back."""
    coder = codec("fp32")
    columns = torch.sort(torch.randint(0, 5000, (3, 7)), dim=1).values
    values = torch.randn(3, 7)
    message = coder.encode_rows(columns, values, 5000)
    assert torch.equal(message, coder.encode(list(zip(columns, values)), with_counts=False))
    assert message.numel() == coder.rows_size(3, 7, 5000)
    got_columns, got_values = coder.decode_rows(message, 3, 7, 5000)
    assert torch.equal(got_columns.long(), columns) and torch.equal(got_values, values)
    with pytest.raises(RuntimeError, match="malformed"):
        coder.decode_rows(message[:-4], 3, 7, 5000)


@pytest.mark.parametrize("wire", ["fp16", "bf16"])
@pytest.mark.parametrize("span", [5000, 65536, 65537, 1_000_003])
def test_compact_rows_have_a_fixed_size_and_decode_exactly(wire, span):
    """A compact rows message is of ``rows_size`` whatever the data, and gives back the columns
    (non-decreasing, padded by repeats, across 65,536-wide segments) and each row quantized."""
    coder = codec(wire)
    generator = torch.Generator().manual_seed(span)
    columns = torch.sort(torch.randint(0, span, (5, 40), generator=generator), dim=1).values
    columns[1, 30:] = columns[1, 29]  # a short list, padded by its last entry
    columns[2] = span - 1  # one column, the last
    values = (
        torch.randn(5, 40, generator=generator)
        * torch.tensor([1e-30, 1.0, 0.0, 3e4, 1e30])[:, None]
    )
    message = coder.encode_rows(columns, values, span)
    assert message.numel() == coder.rows_size(5, 40, span)
    assert coder.rows_size(5, 40, span) == 4 * 5 * (1 + (span > 65536) * -(-span // 65536)) + 800
    got_columns, got_values = coder.decode_rows(message, 5, 40, span)
    assert got_columns.dtype == torch.int32 and torch.equal(got_columns.long(), columns)
    assert torch.equal(got_values, coder.quantize_rows(values))
    with pytest.raises(RuntimeError, match="malformed"):
        coder.decode_rows(message[:-4], 5, 40, span)


@pytest.mark.parametrize("wire", ["fp32", "fp16", "bf16"])
def test_quantize_rows_is_quantize_of_each_row_without_a_read(wire):
    """``quantize_rows`` gives each row's ``quantize`` bits, at magnitudes from subnormal to
    near float32's largest, in a fixed number of operations and no data-dependent read."""
    coder = codec(wire)
    scales = [0.0, 1e-45, 1e-40, 2.0**-126, 1e-20, 1.0, 65504.0, 65520.0, 1e20]
    if wire == "fp16":
        scales.append(5e37)
    rows = torch.randn(len(scales), 33, generator=torch.Generator().manual_seed(5))
    rows = rows * torch.tensor(scales)[:, None]
    rows[6, 0] = 65504.0  # exactly fp16's largest
    with OperationCounter() as counter:
        quantized = coder.quantize_rows(rows)
    assert counter.data_dependent == (1 if wire == "bf16" else 0)  # bf16: the overflow check
    expected = torch.stack([coder.quantize(row) for row in rows])
    assert torch.equal(quantized, expected)
    if coder.compact:  # each row's exponent, but -125 for fp16's rows of zeros (alike on the wire)
        zero = -125 if wire == "fp16" else 0
        exponents = [coder.exponent(row) if row.any() else zero for row in rows]
        assert coder.row_exponents(rows).tolist() == exponents


@pytest.mark.parametrize(
    ("setting", "per_rank"),
    [
        ("numel", lambda rank: {"numel": 1000 + rank}),
        ("density", lambda rank: {"density": 0.01 if rank < 2 else 0.02}),
        ("options", lambda rank: {"wire": "fp16" if rank == 3 else "fp32"}),
        ("method", lambda rank: {"name": "topk" if rank == 1 else "spardl"}),
    ],
)
def test_ranks_that_disagree_get_one_clear_error_each(setting, per_rank):
    def body(transport):
        settings = {"name": "spardl", "numel": 1000, "density": 0.01, **per_rank(transport.rank)}
        sync = compressors.create(settings.pop("name"), transport, **settings)  # stays local
        try:
            sync.allreduce(torch.ones(settings["numel"]))
        except ValueError as error:
            return str(error)
        return None

    messages = local_group(4).run(body)
    assert all(m and f"do not agree on {setting}" in m for m in messages), messages
    assert "differ" in messages[0]


def test_ranks_that_agree_build_as_before():
    """NumPy integers and Python ints are the same setting."""
    import numpy as np

    sizes = local_group(3).run(
        lambda t: (
            compressors.create(
                "spardl", t, numel=np.int64(999) if t.rank else 999, density=0.05
            ).numel
        )
    )
    assert sizes == [999, 999, 999]


@pytest.mark.parametrize("method", ["zen", "oktopk", "topk"])
def test_other_methods_grow_at_most_threefold_from_4_to_16_workers(method):
    """Their per-peer loops are batched: from P = 4 to 16 (twice the rounds of a Bruck
    all-gather, four times the peers) the operations at most triple."""
    ops = {p: _count(method, p)["ops"] for p in (4, 16)}
    assert ops[16] <= 3 * ops[4], ops


def test_bench_count_ops_adds_the_counts_to_every_method_row(tmp_path):
    import json

    from entry_points import load_script

    bench = load_script("bench_allreduce")
    path = tmp_path / "rows.json"
    argv = ["--replay", "2", "--numel", "600", "--methods", "spardl,zen", "--iters", "1"]
    bench.main([*argv, "--warmup", "0", "--count-ops", "--json", str(path)])
    rows = {row["method"]: row for row in json.loads(path.read_text())}
    assert rows["spardl"]["ops"] > 0 and rows["spardl"]["data_dependent_ops"] == 0
    assert rows["zen"]["ops"] > 0 and rows["zen"]["data_dependent_ops"] >= 1
    assert "ops" not in rows["floor"]


def test_a_sized_receive_refuses_a_message_of_another_length():
    def body(transport):
        peer = 1 - transport.rank
        handle = transport.isend(torch.ones(3), peer, 0, sized=True)
        try:
            transport.recv(peer, 0, torch.float32, torch.device("cpu"), numel=4)
        except RuntimeError as error:
            return str(error)
        finally:
            transport.waitall([handle])

    messages = local_group(2).run(body)
    assert all("3 elements, expected 4" in m for m in messages), messages


def test_the_operations_table_command_writes_its_rows(tmp_path):
    import json

    from syncbench import opcount

    path = tmp_path / "ops.json"
    argv = ["--methods", "topk", "--workers", "2,4", "--numel", "1000", "--json", str(path)]
    opcount.main(argv)
    rows = json.loads(path.read_text())
    assert [(row["method"], row["workers"]) for row in rows] == [("topk", 2), ("topk", 4)]
    assert all(row["ops"] > 0 for row in rows)


def test_host_syncs_counts_only_its_own_threads_synchronizations(monkeypatch):
    modes = []

    def switch(mode):  # the first switch in a process reports a synchronization of its own
        modes.append(mode)
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)

    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", switch)
    other = threading.Thread(target=warnings.warn, args=("called a synchronizing operation",))
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with host_syncs() as found:
            warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
            other.start()
            other.join()
            warnings.warn("something else", stacklevel=1)
    assert found["count"] == 1 and modes == ["warn", 0]
    assert [str(w.message) for w in shown] == ["something else"]


def test_bf16_quantizing_off_the_host_reads_nothing_back():
    """The overflow check is the host's: on a device (here ``meta``, where a read would fail)
    bf16's ``quantize_rows`` dispatches no data-dependent operation."""
    rows = torch.randn(4, 33, device="meta")
    with OperationCounter() as counter:
        quantized = codec("bf16").quantize_rows(rows)
    assert counter.data_dependent == 0
    assert quantized.shape == rows.shape and quantized.dtype == torch.float32


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_index_add_in_order_takes_int32_indices_without_an_int64_copy(device):
    """Joined lists' int32 indices go to ``index_add_`` as they are: no int64 copy of them (8
    bytes an entry, per call), and the same bits as with int64 indices."""
    from allreducers import index_add_in_order

    generator = torch.Generator().manual_seed(3)
    sizes = [40, 25, 40]
    indices = torch.cat([torch.randperm(64, generator=generator)[:s] for s in sizes])
    values = torch.randn(indices.numel(), generator=generator).to(device)
    expected = torch.zeros(64, device=device)
    index_add_in_order(expected, indices.to(device), values, sizes)  # int64
    result = torch.zeros(64, device=device)
    narrow = indices.to(torch.int32).to(device)
    with OperationCounter() as counter:
        index_add_in_order(result, narrow, values, sizes)
    assert counter.allocated_bytes == 0 and "_to_copy" not in str(counter.counts), counter.counts
    if device == "cpu":
        assert torch.equal(result, expected)
