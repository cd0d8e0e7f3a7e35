"""``residual_dtype="bf16"`` of the FSDP reduce-scatter: bf16 residuals, shared float32 work.

In-process ranks (threads over ``local_group``, each with a timeout) stand in for FSDP's shard
group: ``SparseReduceScatter`` takes a transport as its group. tests/fsdp_check.py runs it
under FSDP2 itself.
"""

import io

import pytest
import torch
import torch.distributed as dist

from allreducers.transports import local_group
from compressors.fsdp import SparseReduceScatter, sparse_replica_hook
from tests.ranks import heavy_tailed

TIMEOUT = 60.0  # seconds a rank waits for a message before the group fails
#: bf16's unit roundoff: round to nearest keeps |r - bf16(r)| <= 2^-8 |bf16(r)|.
BF16_UNIT = 2.0**-8


def comms_of(transport, method, density, groups, shared, residual_dtype="bf16", **options):
    """``groups`` reduce-scatters of one rank: siblings (``shared``) or independent ones."""
    first = SparseReduceScatter(method, transport, density, residual_dtype, **options)
    if shared:
        return [first] + [first.sibling() for _ in range(groups - 1)]
    return [first] + [
        SparseReduceScatter(method, transport, density, residual_dtype, **options)
        for _ in range(groups - 1)
    ]


def step(comm, grad, workers):
    """One reduce-scatter of ``grad``: (stored residual before, shard, stored residual after)."""
    numel = grad.numel()
    before = comm.residuals.get(numel, torch.zeros(numel)).float().clone()
    shard = torch.empty(numel // workers)
    comm(shard, grad.clone(), None, dist.ReduceOp.AVG)
    return before, shard, comm.residuals[numel].float().clone()


def run(grads, method="spardl", density=0.1, shared=True, residual_dtype="bf16", **options):
    """Every rank's rows[call][group] for ``grads`` (calls, groups, P, n), groups interleaved."""
    calls, groups, workers, _ = grads.shape

    def body(transport):
        comms = comms_of(transport, method, density, groups, shared, residual_dtype, **options)
        return [
            [step(comms[g], grads[c, g, transport.rank], workers) for g in range(groups)]
            for c in range(calls)
        ]

    return local_group(workers, timeout=TIMEOUT).run(body)


@pytest.mark.parametrize("method", ["spardl", "topk"])
@pytest.mark.parametrize("workers", [1, 3])
def test_density_one_is_fsdps_reduce_scatter_and_leaves_no_residual(method, workers):
    grads = heavy_tailed((2, 2, workers, 6 * workers), seed=workers)
    per_rank = run(grads, method, density=1.0)
    for call in range(2):
        for group in range(2):
            shards = torch.cat([rows[call][group][1] for rows in per_rank])
            torch.testing.assert_close(shards, grads[call, group].mean(0), rtol=1e-6, atol=1e-6)
            assert all(not rows[call][group][2].any() for rows in per_rank)


@pytest.mark.parametrize("workers", [2, 3, 5])
def test_mass_is_conserved_up_to_the_bf16_rounding_of_the_residual(workers):
    """sum_w (grad_w + stored_w) = P * shards + sum_w stored_w after, each entry within
    2^-8 * sum_w |stored_w after| (what rounding the float32 residual to bf16 may lose)."""
    grads = heavy_tailed((3, 2, workers, 31 * workers), seed=workers)
    per_rank = run(grads)
    lost = 0.0
    for call in range(3):
        for group in range(2):
            rows = [ranks[call][group] for ranks in per_rank]
            before = grads[call, group].double().sum(0) + sum(r[0].double() for r in rows)
            after = workers * torch.cat([r[1].double() for r in rows])
            after = after + sum(r[2].double() for r in rows)
            bound = BF16_UNIT * sum(r[2].double().abs() for r in rows) + 1e-5
            assert ((after - before).abs() <= bound).all(), (call, group)
            lost = max(lost, float((after - before).abs().max()))
    assert lost > 1e-5  # bf16 storage does lose mass (float32 keeps it to ~1e-6)


def test_the_first_call_is_fp32s_and_stores_its_residual_rounded():
    grads = heavy_tailed((1, 1, 3, 60), seed=4)
    bf16 = run(grads)
    fp32 = run(grads, residual_dtype="fp32")
    for low, full in zip(bf16, fp32):
        assert torch.equal(low[0][0][1], full[0][0][1])
        assert full[0][0][2].abs().sum() > 0
        assert torch.equal(low[0][0][2], full[0][0][2].bfloat16().float())


def test_residuals_are_bf16_and_siblings_share_one_float32_synchronizer():
    def body(transport):
        first = SparseReduceScatter("spardl", transport, 0.1, "bf16")
        second, other = first.sibling(), first.sibling()
        for comm, numel in ((first, 40), (second, 40), (other, 20)):
            comm(torch.empty(numel // 2), heavy_tailed((numel,), seed=numel), None)
        independent = SparseReduceScatter("spardl", transport, 0.1).sibling()
        return first, second, other, independent

    for first, second, other, independent in local_group(2, timeout=TIMEOUT).run(body):
        assert first.residuals[40].dtype == torch.bfloat16
        assert first.residuals[40].data_ptr() != second.residuals[40].data_ptr()
        assert first.synchronizers is second.synchronizers is other.synchronizers
        assert sorted(first.synchronizers) == [20, 40]  # one float32 synchronizer per size
        assert first.synchronizers[40].residual.dtype == torch.float32
        assert sorted(other.residuals) == [20]
        assert independent.synchronizers is not SparseReduceScatter("topk").synchronizers


@pytest.mark.parametrize(
    "method, options",
    [
        ("spardl", {}),
        ("spardl", {"teams": 2}),
        ("spardl", {"dense_warmup": 2}),
        ("oktopk", {}),
        ("topk", {"momentum": 0.9}),
    ],
)
def test_shared_synchronizers_give_each_group_what_its_own_would(method, options):
    """Call counts, extra state (SparDL's height, Ok-Topk's thresholds) and momentum's velocity
    are per group: interleaved groups sharing synchronizers equal groups with their own."""
    grads = heavy_tailed((4, 3, 4, 32), seed=7)
    shared = run(grads, method, density=0.2, **options)
    alone = run(grads, method, density=0.2, shared=False, **options)
    for mine, theirs in zip(shared, alone):
        for call in range(4):
            for group in range(3):
                for a, b in zip(mine[call][group], theirs[call][group]):
                    assert torch.equal(a, b), (call, group)


def test_a_bad_residual_dtype_is_refused():
    with pytest.raises(ValueError, match=r"residual_dtype='fp16' is invalid; valid: fp32, bf16"):
        SparseReduceScatter("spardl", None, 0.1, residual_dtype="fp16")
    with pytest.raises(ValueError, match="residual_dtype"):
        sparse_replica_hook("spardl", None, 0.1, residual_dtype=torch.bfloat16)
    bf16_state = {"method": "spardl", "density": 0.1, "residual_dtype": "bf16"}
    with pytest.raises(ValueError, match="residual_dtype='bf16'"):
        SparseReduceScatter("spardl", None, 0.1).load_state_dict(dict(bf16_state, synchronizers={}))


@pytest.mark.parametrize("method", ["spardl", "oktopk"])
def test_a_saved_state_resumes_exactly(method):
    grads = heavy_tailed((3, 2, 2, 48), seed=11)

    def body(transport):
        straight = comms_of(transport, method, 0.1, 2, shared=True)
        resumed = comms_of(transport, method, 0.1, 2, shared=True)
        rank = transport.rank
        for call in range(2):
            for group in range(2):
                step(straight[group], grads[call, group, rank], 2)
        for comm, source in zip(resumed, straight):
            buffer = io.BytesIO()
            torch.save(source.state_dict(), buffer)
            buffer.seek(0)
            state = torch.load(buffer, weights_only=True)
            assert state["residual_dtype"] == "bf16"
            assert state["synchronizers"][48]["residual"].dtype == torch.bfloat16
            comm.load_state_dict(state)
        return [
            (step(straight[g], grads[2, g, rank], 2), step(resumed[g], grads[2, g, rank], 2))
            for g in range(2)
        ]

    for rows in local_group(2, timeout=TIMEOUT).run(body):
        for continued, loaded in rows:
            for a, b in zip(continued, loaded):
                assert torch.equal(a, b)


def test_the_replica_hook_keeps_bf16_residuals():
    grads = heavy_tailed((3, 12), seed=3)

    def body(transport):
        hook = sparse_replica_hook("spardl", transport, 1.0, residual_dtype="bf16")
        shard = grads[transport.rank].clone()
        hook(shard)
        return shard, hook.residuals[12]

    for shard, residual in local_group(3, timeout=TIMEOUT).run(body):
        torch.testing.assert_close(shard, grads.mean(0), rtol=1e-6, atol=1e-6)
        assert residual.dtype == torch.bfloat16 and not residual.any()
