"""``compressors.diloco.DiLoCo``: H = 1 local SGD is per-step data parallelism, every rank holds
the same parameters after every outer step for every method and wire, error feedback conserves
the pseudo-gradient's mass across outer steps, a checkpoint between outer steps resumes
bit-identically, a reshard keeps the pending update, and bad settings are refused."""

import pytest
import torch

import compressors
from allreducers.transports import local_group
from compressors.diloco import DiLoCo, outer_update
from compressors.reshard import pending_update

SIZES = (7, 5)  # a 7 x 5 linear layer and its bias: 40 entries, not divisible by P


def _model(seed=0):
    """A linear layer with weights from its own generator: the in-process ranks are threads,
    which would race for torch's global one."""
    return _seeded(torch.nn.Linear(*SIZES), seed)


def _seeded(model, seed):
    draws = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=draws) * 0.3)
    return model


def _loss(model, rank, step):
    data = torch.Generator().manual_seed(1000 * rank + step)
    inputs = torch.randn(4, SIZES[0], generator=data)
    targets = torch.randn(4, SIZES[1], generator=data)
    return torch.nn.functional.mse_loss(model(inputs), targets)


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _inner(model, optimizer, rank, step):
    optimizer.zero_grad()
    _loss(model, rank, step).backward()
    optimizer.step()


def test_one_local_step_with_plain_outer_sgd_is_per_step_data_parallelism():
    def body(transport):
        rank = transport.rank
        local, reference = _model(rank), _model(rank)  # each rank its own start: rank 0's wins
        outer = DiLoCo(local, comm=transport, local_steps=1, outer_lr=1.0, outer_momentum=0.0)
        dense = compressors.create("dense", transport, numel=40, density=1.0)
        reference.load_state_dict(local.state_dict())
        inner = torch.optim.SGD(local.parameters(), lr=0.1)
        plain = torch.optim.SGD(reference.parameters(), lr=0.1)
        for step in range(5):
            _inner(local, inner, rank, step)
            assert outer.step()
            plain.zero_grad()
            _loss(reference, rank, step).backward()
            flat = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
            average, offset = dense.allreduce(flat), 0
            for p in reference.parameters():
                p.grad.copy_(average[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
            plain.step()
        return _flat(local), _flat(reference)

    results = local_group(3).run(body)
    for local, reference in results:
        torch.testing.assert_close(local, reference, rtol=1e-5, atol=1e-6)
        assert torch.equal(local, results[0][0])


@pytest.mark.parametrize("wire", ["fp32", "fp16"])
@pytest.mark.parametrize("method", compressors.available())
def test_every_rank_holds_the_same_parameters_after_every_outer_step(method, wire):
    def body(transport):
        model = _model(transport.rank)
        outer = DiLoCo(model, comm=transport, method=method, density=0.2, local_steps=2, wire=wire)
        inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        after = []
        for step in range(6):
            _inner(model, inner, transport.rank, step)
            if outer.step():
                after.append(_flat(model))
        assert outer.outer_steps == 3 and outer.steps == 6
        return after

    results = local_group(3).run(body)
    for rank in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(rank, results[0]))
    assert not torch.equal(results[0][0], results[0][-1])


FEEDBACK = [m for m in compressors.available() if m not in ("dense", "gtopk")]


@pytest.mark.parametrize("method", FEEDBACK)
def test_error_feedback_conserves_the_pseudo_gradients_mass_across_outer_steps(method):
    """Summed over the ranks and the outer steps, every Δ_r sent equals P x every average plus
    what the residuals still hold (gTop-k's tree drops values by design; dense keeps none).
    Local SGD (outer lr 1, no momentum) moves θ_0 by the average itself."""
    workers = 3

    def body(transport):
        model = _model(transport.rank)
        outer = DiLoCo(
            model,
            comm=transport,
            method=method,
            density=0.1,
            local_steps=3,
            outer_lr=1.0,
            outer_momentum=0.0,
        )
        inner = torch.optim.SGD(model.parameters(), lr=0.05)
        sent = torch.zeros(40, dtype=torch.float64)
        averaged = torch.zeros(40, dtype=torch.float64)
        for step in range(9):
            _inner(model, inner, transport.rank, step)
            delta, before = outer.start - _flat(model), outer.start.clone()
            if outer.step():
                sent += delta.double()
                averaged += (before - outer.start).double()
        return sent, averaged, outer.synchronizer.state_dict()

    results = local_group(workers).run(body)
    sent = sum(result[0] for result in results)
    averaged = results[0][1] * workers
    residual = pending_update([result[2] for result in results]) * workers
    assert residual.abs().sum() > 0  # something was held back
    torch.testing.assert_close(sent, averaged + residual, rtol=0, atol=1e-5)


def test_nesterov_and_heavy_ball_outer_steps_follow_the_formula():
    delta, momentum = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.5])
    nesterov = outer_update(delta, momentum.clone(), 0.7, 0.9, True)
    torch.testing.assert_close(nesterov, 0.7 * (delta + 0.9 * (0.9 * momentum + delta)))
    heavy = outer_update(delta, momentum.clone(), 0.7, 0.9, False)
    torch.testing.assert_close(heavy, 0.7 * (0.9 * momentum + delta))
    torch.testing.assert_close(outer_update(delta, None, 0.7, 0.0, True), 0.7 * delta)


def test_a_checkpoint_between_outer_steps_resumes_bit_identically():
    def run(transport, stop=None, state=None):
        rank = transport.rank
        model = _model(rank)
        outer = DiLoCo(model, comm=transport, method="spardl", density=0.2, local_steps=3)
        inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        first = 0
        if state is not None:
            model.load_state_dict(state["model"])
            inner.load_state_dict(state["inner"])
            outer.load_state_dict(state["outer"])
            first = outer.steps
        for step in range(first, 8):
            if step == stop:
                return {
                    "model": model.state_dict(),
                    "inner": inner.state_dict(),
                    "outer": outer.state_dict(),
                }
            _inner(model, inner, rank, step)
            outer.step()
        return _flat(model)

    straight = local_group(2).run(run)
    saved = local_group(2).run(run, stop=4)
    resumed = local_group(2).run(lambda t: run(t, state=saved[t.rank]))
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))


def test_a_start_already_the_same_is_not_sent_again():
    """``same_start=True``: no all-reduce of the parameters at construction (the trainer has
    broadcast them); each rank keeps what it holds, where the default takes rank 0's."""

    def body(transport):
        kept, taken = _model(transport.rank), _model(transport.rank)
        DiLoCo(kept, comm=transport, local_steps=2, same_start=True)
        DiLoCo(taken, comm=transport, local_steps=2)
        return _flat(kept), _flat(taken), _flat(_model(transport.rank)), _flat(_model(0))

    for kept, taken, own, first in local_group(3).run(body):
        assert torch.equal(kept, own) and torch.equal(taken, first)


def test_a_reshard_keeps_the_pending_update_and_restarts_the_round():
    def body(transport, steps):
        model = _model(transport.rank)
        outer = DiLoCo(model, comm=transport, method="topk", density=0.1, local_steps=2)
        inner = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(steps):
            _inner(model, inner, transport.rank, step)
            outer.step()
        return outer.state_dict()

    states = local_group(4).run(body, 5)  # 2 outer steps and one inner step of the third round
    mapped = compressors.reshard(states, 3)
    assert len(mapped) == 3
    before = pending_update([s["synchronizer"] for s in states])
    after = pending_update([s["synchronizer"] for s in mapped])
    torch.testing.assert_close(before, after, rtol=0, atol=1e-6)

    def load(transport):
        model = _model(10 + transport.rank)
        outer = DiLoCo(model, comm=transport, method="topk", density=0.1, local_steps=2)
        outer.load_state_dict(mapped[transport.rank])
        return outer.steps, _flat(model)

    for steps, params in local_group(3).run(load):
        assert steps == 4 and torch.equal(params, states[0]["start"])


@pytest.mark.parametrize(
    "options, message",
    [
        ({"local_steps": 0}, "local_steps must be an integer >= 1"),
        ({"outer_lr": 0.0}, "outer_lr must be a number > 0"),
        ({"outer_lr": float("inf")}, "outer_lr must be a number > 0"),
        ({"outer_momentum": 1.0}, "outer_momentum must lie in [0, 1)"),
        ({"method": "nosuch"}, "nosuch"),
    ],
)
def test_bad_settings_are_refused(options, message):
    group = local_group(1)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(")", r"\)")):
        group.run(lambda transport: DiLoCo(_model(), comm=transport, **options))


def test_a_state_of_another_model_is_refused():
    def body(transport):
        small = DiLoCo(_model(), comm=transport, local_steps=2).state_dict()
        other = DiLoCo(_seeded(torch.nn.Linear(3, 2), 0), comm=transport, local_steps=2)
        with pytest.raises(ValueError, match="does not fit"):
            other.load_state_dict(small)

    local_group(1).run(body)


@pytest.mark.mpi
def test_over_torch_distributed_the_ranks_agree_and_match_the_in_process_bits():
    from tests.mpirun import torchrun

    run = torchrun(2, "tests/diloco_torchrun_check.py", timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "diloco over torch.distributed: ok" in run.stdout


def test_a_state_of_other_local_steps_or_of_a_plain_synchronizer_is_refused():
    def body(transport):
        outer = DiLoCo(_model(), comm=transport, local_steps=2)
        other = DiLoCo(_model(), comm=transport, local_steps=3)
        plain = compressors.create("dense", transport, numel=40, density=1.0)
        return (
            other.state_mismatch(outer.state_dict()),
            outer.state_mismatch(plain.state_dict()),
        )

    steps, plain = local_group(1).run(body)[0]
    assert steps == "local_steps 2 (here 3)"
    assert "without local steps?" in plain


# overlap: each round's average applied one round late ----------------------------------------


def _delayed_reference(transport, method, steps, local_steps, options):
    """The overlapped schedule written out, blocking: at round t's end Δ_t is averaged at once
    and θ_0 takes the outer step of Δ_{t-1}."""
    model = _model(transport.rank)
    sync = compressors.create(method, transport, numel=40, density=0.2, **options)
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if transport.rank:
        start.zero_()
    transport.allreduce_sum_(start)
    momentum, held, starts = torch.zeros(40), None, []

    def write(flat):
        with torch.no_grad():
            offset = 0
            for p in model.parameters():
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    write(start)
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        _inner(model, inner, transport.rank, step)
        if (step + 1) % local_steps:
            continue
        delta = start - _flat(model)
        average = sync.allreduce(delta).clone()
        if held is not None:
            start -= outer_update(held, momentum, 0.7, 0.9, True)
            starts.append(start.clone())
        held = average
        write(start)
    return starts


@pytest.mark.parametrize("method,options", [("dense", {}), ("spardl", {"wire": "fp16"})])
def test_overlapped_rounds_give_the_bits_of_the_blocking_one_round_late_schedule(method, options):
    def body(transport):
        model = _model(transport.rank)
        outer = DiLoCo(
            model, comm=transport, method=method, density=0.2, local_steps=3, overlap=True,
            **options,
        )  # fmt: skip
        inner, starts = torch.optim.SGD(model.parameters(), lr=0.1), []
        for step in range(12):
            _inner(model, inner, transport.rank, step)
            if outer.step() and outer.outer_steps:
                starts.append(outer.start.clone())
        assert outer.outer_steps == 3  # four rounds ended; the last average is in flight
        outer.wait()
        return starts, _delayed_reference(transport, method, 12, 3, options)

    results = local_group(3).run(body)
    for starts, reference in results:
        assert len(starts) == len(reference) == 3
        for mine, theirs, first in zip(starts, reference, results[0][0]):
            assert torch.equal(mine, theirs) and torch.equal(mine, first)


def test_an_overlapped_checkpoint_keeps_the_average_in_flight_and_resumes_bit_identically():
    def run(transport, stop=None, state=None):
        model = _model(transport.rank)
        outer = DiLoCo(model, comm=transport, method="topk", density=0.2, local_steps=2,
                       overlap=True)  # fmt: skip
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        first = 0
        if state is not None:
            model.load_state_dict(state["model"])
            inner.load_state_dict(state["inner"])
            outer.load_state_dict(state["outer"])
            first = state["step"]
        for step in range(first, 9):
            _inner(model, inner, transport.rank, step)
            outer.step()
            if step + 1 == stop:
                saved = {"model": model.state_dict(), "inner": inner.state_dict()}
                return {**saved, "outer": outer.state_dict(), "step": stop}
        outer.wait()
        return _flat(model), outer.start.clone(), outer.outer_steps

    def body(transport):
        whole = run(transport)
        state = run(transport, stop=4)  # a round's end: Δ of round 2 in flight
        assert state["outer"]["pending"] is not None
        again = run(transport, state=state)
        return whole, again

    for whole, again in local_group(2).run(body):
        assert torch.equal(whole[0], again[0]) and torch.equal(whole[1], again[1])
        assert whole[2] == again[2] == 3


def test_an_overlapped_state_does_not_load_into_a_blocking_one():
    def body(transport):
        outer = DiLoCo(_model(), comm=transport, local_steps=2, overlap=True)
        plain = DiLoCo(_model(), comm=transport, local_steps=2)
        return plain.state_mismatch(outer.state_dict())

    assert "outer_overlap True (here False)" in local_group(1).run(body)[0]
