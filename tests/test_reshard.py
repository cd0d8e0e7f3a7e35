"""``compressors.reshard``: the pending update conserved from P to P' ranks, the next calls
agreeing bit for bit and conserving mass, the same P unchanged, the DDP hook's and the bucket
pipeline's states per layout, and what it refuses (tests/reshard_check.py runs the whole grid)."""

import pytest
import torch

import compressors
from allreducers.transports import local_group
from compressors.ddp import SparDLState
from compressors.fsdp import SparseReduceScatter
from compressors.fsdp_layout import padded, padded_numel, unpadded
from compressors.reshard import pending_update
from tests.reshard_check import check

PAIRS = [(4, 3), (2, 4), (1, 5), (8, 1), (3, 7), (6, 2)]


@pytest.mark.parametrize("wire", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("method", compressors.available())
def test_reshard_conserves_the_pending_update_and_the_next_calls_agree(method, wire):
    problems = [
        (workers, size, check(method, wire, workers, size, momentum=index % 2 == 0))
        for index, (workers, size) in enumerate(PAIRS)
    ]
    assert [problem for problem in problems if problem[2]] == []


def _states(workers, **options):
    def body(transport):
        sync = compressors.create("oktopk", transport, numel=300, density=0.05, **options)
        for call in range(3):
            sync.allreduce(torch.randn(300, generator=torch.Generator().manual_seed(call)))
        return sync.state_dict()

    return local_group(workers).run(body)


def test_the_same_world_size_is_returned_unchanged():
    states = _states(3)
    again = compressors.reshard(states, 3)
    assert again is not states and all(
        torch.equal(a["residual"], b["residual"]) and a["step"] == b["step"]
        for a, b in zip(states, again)
    )


def test_world_state_is_dropped_to_be_re_derived_and_the_calls_carry_over():
    new = compressors.reshard(_states(4), 2)
    assert all("local_threshold" not in state and state["calls"] == 3 for state in new)
    assert [state["config"]["rank"] for state in new] == [0, 1]
    assert {state["config"]["workers"] for state in new} == {2}


def test_each_entry_is_held_by_one_new_rank():
    new = compressors.reshard(_states(4), 3)
    held = torch.stack([(state["residual"] != 0) for state in new]).sum(0)
    assert held.max() <= 1


def test_the_ddp_hook_state_reshards_per_bucket_layout():
    def body(transport):
        model = torch.nn.Linear(20, 5)
        state = SparDLState(transport, density=0.1, method="topk", model=model)
        keys = [name for name, _ in model.named_parameters()]
        sizes = [p.numel() for p in model.parameters()]
        for call in range(2):
            flat = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(call))
            state.pipeline.synchronize(keys, sizes, flat)
        saved = state.state_dict()
        state.pipeline.close()
        return saved

    states = local_group(4).run(body)
    new = compressors.reshard(states, 2)
    assert [state["rank"] for state in new] == [0, 1] and {s["size"] for s in new} == {2}
    (name,) = states[0]["buckets"]
    old = [state["buckets"][name]["state"] for state in states]
    mapped = [state["buckets"][name]["state"] for state in new]
    assert torch.allclose(pending_update(old), pending_update(mapped), rtol=0, atol=1e-6)

    def load(transport):
        state = SparDLState(transport, density=0.1, method="topk", model=torch.nn.Linear(20, 5))
        state.load_state_dict(new[transport.rank])
        state.pipeline.close()
        return True

    assert all(local_group(2).run(load))


def test_refused_inputs():
    with pytest.raises(ValueError, match="at least one rank"):
        compressors.reshard([], 2)
    with pytest.raises(ValueError, match="size must be an integer"):
        compressors.reshard(_states(2), 0)
    mixed = _states(2)
    mixed[1] = dict(mixed[1], numel=7, residual=torch.zeros(7))
    with pytest.raises(ValueError, match="rank 1's state is of another synchronizer"):
        compressors.reshard(mixed, 3)
    with pytest.raises(ValueError, match="replica hook"):
        compressors.reshard([{"synchronizers": {}}] * 2, 3)


def test_a_state_of_format_version_1_still_loads_and_an_unknown_one_is_refused():
    (saved,) = _states(1)
    assert saved["version"] == compressors.state.STATE_VERSION and saved["dtype"] == "fp32"
    old = {key: value for key, value in saved.items() if key not in ("version", "dtype")}
    sync = compressors.create("oktopk", local_group(1).rank(0), numel=300, density=0.05)
    sync.load_state_dict(old)
    assert torch.equal(sync.residual, saved["residual"]) and sync.calls == 3
    with pytest.raises(ValueError, match="format version 99"):
        sync.load_state_dict(dict(saved, version=99))


def test_feedback_state_is_the_one_way_in_and_out():
    sync = compressors.create("topk", local_group(1).rank(0), numel=50, density=0.1, momentum=0.9)
    sync.allreduce(torch.arange(50.0))
    state = sync.feedback_state()
    assert state.residual is sync.residual and state.velocity is sync.velocity
    other = compressors.create("topk", local_group(1).rank(0), numel=50, density=0.1, momentum=0.9)
    other.load_feedback(
        compressors.FeedbackState.zeros(50, momentum=True, dtype="bf16").copy_(state)
    )
    assert other.calls == 1 and torch.equal(other.velocity, sync.velocity)
    assert torch.allclose(other.residual, sync.residual, rtol=2**-8)


# FSDP's sparse reduce-scatter: residuals in FSDP2's layout, which depends on P ----------------

SHAPES = [(7, 3), (5,), (2, 2, 2)]  # no dim 0 divisible by 3 or 4: padding rows at both


def test_the_layout_is_fsdp2s_chunked_concatenation_at_every_world_size():
    for workers in range(1, 7):
        grads = [torch.randn(shape) for shape in SHAPES]
        fsdp = torch.empty(padded_numel(SHAPES, workers))
        torch._chunk_cat(grads, 0, workers, out=fsdp.view(workers, -1))  # FSDP2's copy-in
        joined = torch.cat([g.reshape(-1) for g in grads])
        assert torch.equal(padded(joined, SHAPES, workers), fsdp)
        assert torch.equal(unpadded(fsdp, SHAPES, workers), joined)
    laid = padded(torch.cat([torch.randn(shape).reshape(-1) for shape in SHAPES]), SHAPES, 4)
    laid[-1] = 1.0  # rank 3's chunk of the (2, 2, 2) parameter is a padding row
    with pytest.raises(ValueError, match="padding row"):
        unpadded(laid, SHAPES, 4)


def _fsdp_run(workers, residual_dtype, state=None, calls=2, seed=0):
    """Each rank's (state after, shards) of SparDL's reduce-scatter of FSDP's layout."""
    numel = padded_numel(SHAPES, workers)

    def body(transport):
        comm = SparseReduceScatter("spardl", transport, 0.2, residual_dtype)
        comm.shapes = SHAPES
        if state is not None:
            comm.load_state_dict(state[transport.rank])
        shards = []
        for call in range(calls):
            draws = torch.Generator().manual_seed(seed + 100 * call + transport.rank)
            grads = [torch.randn(shape, generator=draws) for shape in SHAPES]
            joined = padded(torch.cat([g.reshape(-1) for g in grads]), SHAPES, workers)
            shard = torch.empty(numel // workers)
            comm(shard, joined, None, torch.distributed.ReduceOp.AVG)
            shards.append((joined, shard))
        return comm.state_dict(), shards

    return local_group(workers, timeout=60.0).run(body)


def _pending(states, workers):
    """The pending update of one parameter group, per parameter entry (float64)."""
    numel = padded_numel(SHAPES, workers)
    group = [state["synchronizers"][numel] for state in states]
    return unpadded(pending_update(group).float(), SHAPES, workers).double()


@pytest.mark.parametrize("residual_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("workers,size", [(4, 3), (2, 5)])
def test_fsdp_residuals_reshard_per_parameter_with_the_pending_update_kept(
    workers, size, residual_dtype
):
    saved = [state for state, _ in _fsdp_run(workers, residual_dtype)]
    new = compressors.reshard(saved, size)
    target = padded_numel(SHAPES, size)
    assert all(list(state["synchronizers"]) == [target] for state in new)
    assert all(state["layouts"][target] == [list(shape) for shape in SHAPES] for state in new)
    rounding = 2.0**-8 if residual_dtype == "bf16" else 0.0  # each new residual stored in bf16
    pending = _pending(saved, workers)
    torch.testing.assert_close(_pending(new, size), pending, rtol=rounding, atol=1e-6)
    # The next calls on the new ranks run and conserve mass: what they return plus what they
    # still owe is what they were given plus what was owed.
    runs = _fsdp_run(size, residual_dtype, state=new, calls=1, seed=7)
    given = sum(unpadded(run[1][0][0], SHAPES, size).double() for run in runs) / size
    returned = unpadded(torch.cat([run[1][0][1] for run in runs]), SHAPES, size).double()
    owed, owed_before = _pending([run[0] for run in runs], size), _pending(new, size)
    loss = 2.0**-8 if residual_dtype == "bf16" else 1e-5  # bf16 storage rounds the residual
    torch.testing.assert_close(returned + owed, given + owed_before, rtol=loss, atol=loss)


def test_an_fsdp_state_without_its_layout_is_refused():
    saved = [state for state, _ in _fsdp_run(2, "fp32")]
    unknown = [dict(state, layouts={}) for state in saved]
    with pytest.raises(ValueError, match="layout of the parameter group of 38 entries"):
        compressors.reshard(unknown, 3)
