"""The GPU-cluster projection: NCCL's cost form, PowerSGD's sizes, the local work, the verdicts."""

import math

import pytest

from syncbench import gpu_projection as gp
from syncbench.network import parse_rate
from trainreport.projection import fastest, projection_tables


def test_one_node_is_an_nvlink_ring_and_many_nodes_are_bound_by_their_links():
    nbytes = 4 * 14_728_266
    seconds, algorithm = gp.nccl_allreduce(nbytes, 8, parse_rate("25gbit"))
    assert algorithm == "ring"
    latency = gp.RING_BASE + 14 * gp.RING_NVLINK
    assert seconds == pytest.approx(latency + nbytes * 2 * 7 / 8 / gp.NVLINK_RATE)
    # Between nodes the link sets the bandwidth: 2 (P-1) / P of the bytes cross each link.
    for rate in gp.RATES:
        link = parse_rate(rate)
        seconds, _ = gp.nccl_allreduce(nbytes, 64, link)
        assert nbytes * 2 * 63 / 64 / link < seconds < nbytes * 2 * 63 / 64 / link + 0.005
    # Small messages at large P take the tree: its latency grows with log2 of the nodes.
    assert gp.nccl_allreduce(4096, 1024, parse_rate("100gbit"))[1] == "tree"
    assert gp.nccl_allreduce(4096, 1, parse_rate("100gbit")) == (0.0, "none")


def test_powersgd_compresses_matrices_as_torch_decides():
    # A matrix is compressed where rows * cols > (rows + cols) * rank * 2: the 512 x 4608 conv
    # and the 10 x 512 classifier (5120 > 4176), not a 3 x 4 matrix (12 < 42 at rank 3).
    p, q, whole = gp.powersgd_sizes([(512, 512, 3, 3), (512,), (10, 512), (3, 4)], rank=4)
    assert (p, q) == (512 * 4 + 10 * 4, 4608 * 4 + 512 * 4)
    assert whole == 512 + 12  # the bias, and a 3x4 matrix too small to compress
    assert sum(math.prod(s) for s in gp.model_shapes("vgg16")) == gp.MODELS["vgg16"]
    assert sum(math.prod(s) for s in gp.model_shapes("bert-large")) == gp.MODELS["bert-large"]


def test_the_local_work_fit_reads_its_rows_and_checks_beyond_its_sizes():
    replays = [
        {"label": "floor+ef", "median_ms": 0.6},
        {"label": "floor+ef", "median_ms": 0.62},
        {"label": "floor", "median_ms": 0.5},
        {"label": "spardl", "median_ms": 3.6},
    ]
    counts = [
        {"method": "spardl", "wire": "fp32", "workers": p, "ops": 5 + 42 * int(math.log2(p))}
        for p in (2, 4, 8, 16, 32)
    ]
    local = gp.GpuLocalWork.from_rows(replays, counts)
    assert local.per_entry == pytest.approx(0.61e-3 / 14_728_266)
    assert local.overhead == {"spardl": pytest.approx(2.99e-3)}
    ((label, workers, counted, predicted),) = local.checks
    assert (label, workers, counted) == ("spardl", 32, 215) and predicted == pytest.approx(215)
    low, high = local.bounds("spardl", 4, 14_728_266)
    assert low == pytest.approx(3.6e-3) and high == pytest.approx(low)
    low, high = local.bounds("spardl", 16, 2 * 14_728_266)
    grown = 2.99e-3 * (5 + 42 * 4) / (5 + 42 * 2)
    assert low == pytest.approx(1.22e-3 + grown) and high == pytest.approx(1.22e-3 + 2 * grown)


def test_sparse_rows_cross_the_links_their_rounds_cross():
    local = gp.GpuLocalWork(1e-12, {"spardl": 0.0}, {"spardl": gp.OpsFit((1.0, 0.0, 0.0))})
    rows = gp.sparse_rows("spardl", "spardl", {}, 16, 0.01, local)
    assert {row["rate"] for row in rows} == set(gp.RATES) and len(rows) == 2 * len(gp.RATES)
    vgg = {row["rate"]: row["network_ms"] for row in rows if row["model"] == "vgg16"}
    # Two nodes: a slower link takes longer, but less than in proportion (NVLink rounds stay).
    assert vgg["25gbit"] > vgg["100gbit"] > vgg["400gbit"] > 0
    assert vgg["25gbit"] < 16 * vgg["400gbit"]


def _row(label, low, high=None, rate="25gbit", workers=16):
    return {
        "model": "m",
        "numel": 10,
        "label": label,
        "rate": rate,
        "workers": workers,
        "low_ms": low,
        "high_ms": low if high is None else high,
    }


def test_the_verdict_ranks_only_what_both_bounds_separate():
    assert fastest([_row("dense", 10), _row("spardl", 2, 4), _row("powersgd", 5)]) == (
        "**SparDL**, >= 2.50x"
    )
    assert fastest([_row("dense", 3), _row("spardl", 2, 4), _row("powersgd", 1)]) == (
        "no ranking: NCCL dense, SparDL; not ruled out: PowerSGD r4"
    )
    table = projection_tables([_row("dense", 10), _row("spardl", 2, 4), _row("topk", 1)])
    assert "| 25gbit | 16 | 10 | - | - | >= 1 | - | 2-4 | - |" in table
