"""Every registered method on the in-process group: invariants for P = 1..12, state, warm-up and
input checks (a newly registered name runs them with no new test code); the baselines'
accounting and options."""

import math

import numpy as np
import pytest
import torch

import compressors
from allreducers import ceil_log2
from allreducers.transports import local_group
from allreducers.transports.recording import RecordingTransport
from tests.ranks import heavy_tailed, mass_error, measuring

#: Every registered method: the invariant tests below are parametrized over the registry.
METHODS = compressors.available()
#: Those with an error-feedback residual (dense has none).
SPARSE = [name for name in METHODS if compressors.resolve(name).uses_residual]
# Short intervals so that a few calls cover every Ok-Topk path: exact and reused local and global
# thresholds, with and without a region re-split.
OKTOPK_SHORT = dict(local_interval=2, global_interval=3, region_interval=2)
OPTIONS = {"oktopk": OKTOPK_SHORT}


def budget(numel, density):
    return min(numel, max(1, int(numel * density)))


def run(method, workers, numel, density, calls, seed=0, record=False, grads=None, **options):
    """Run ``calls`` synchronizations on ``workers`` in-process ranks; per call the gradients,
    residuals before/after, results, stats and (``record``) each rank's received bytes.
    A method that measures its lost mass on request (``measure_loss``: gTop-k) measures it after
    every call unless told otherwise."""
    options = measuring(method, options)
    grads = heavy_tailed((calls, workers, numel), seed) if grads is None else grads

    def body(transport):
        transport = RecordingTransport(transport) if record else transport
        sync = compressors.create(method, transport, numel=numel, density=density, **options)
        history = []
        for call in range(calls):
            before = sync.residual.clone()
            result = sync.allreduce(grads[call, transport.rank].clone())
            received = (
                sum(e.nbytes for e in transport.take() if e.kind == "recv") if record else None
            )
            if getattr(sync, "measure_loss", False):
                sync.measure_lost_mass()  # after the call's events were taken: not in `received`
            history.append((before, result, sync.residual.clone(), dict(sync.stats), received))
        return history

    per_rank = local_group(workers).run(body)
    return [
        {
            "grads": grads[c],
            "before": torch.stack([h[c][0] for h in per_rank]),
            "results": [h[c][1] for h in per_rank],
            "after": torch.stack([h[c][2] for h in per_rank]),
            "stats": [h[c][3] for h in per_rank],
            "received": [h[c][4] for h in per_rank],
        }
        for c in range(calls)
    ]


def expected_rounds(method, workers, call):
    """Rounds of call number ``call`` where the method's count is known in closed form (with
    this file's options), else ``None``: a new method's count is checked once added here."""
    log = ceil_log2(workers)
    if workers == 1:
        return 0
    if method in ("topk", "gaussiank"):
        return log
    if method in ("gtopk", "dense", "spardl"):  # SparDL: SRS and the final all-gather at d = 1
        return 2 * log
    if method == "topkdsa":
        return workers - 1 + 3 * log
    if method == "zen":  # the hash-partitioned push, then the Bruck pull
        return workers - 1 + log
    if method == "oktopk":
        repartition = call % OKTOPK_SHORT["region_interval"] == 0
        return workers - 1 + log + (2 * log if repartition else 0)
    return None


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("workers", range(1, 13))
@pytest.mark.parametrize("numel,density", [(3, 0.5), (101, 0.05), (2003, 0.01), (257, 1.0)])
def test_invariants(method, workers, numel, density):
    """Same bits on every rank; mass conserved (or, for a method that loses some, exactly the
    loss it measures); density 1 is the dense average with nothing left over; ``stats``
    consistent with the result."""
    calls = run(
        method,
        workers,
        numel,
        density,
        calls=4,
        seed=workers * 7 + numel,
        **OPTIONS.get(method, {}),
    )
    conserves = compressors.resolve(method).conserves_mass
    k = budget(numel, density)
    for number, call in enumerate(calls):
        first = call["results"][0]
        assert all(torch.equal(first, other) for other in call["results"]), "ranks disagree"
        error, scale = mass_error(call, workers)
        if conserves or workers <= 2:  # a tree merge of two ranks drops nothing
            assert error <= 1e-5 * scale, f"mass not conserved: {error}"
        elif "lost_sum" in call["stats"][0]:  # what is missing is what the method says it lost
            missing = (
                (call["grads"] + call["before"]).double().sum(0)
                - workers * first.double()
                - call["after"].double().sum(0)
            )
            assert abs(
                float(missing.sum()) - call["stats"][0]["lost_sum"]
            ) <= 1e-5 * scale * math.sqrt(numel)
        nnz = int(torch.count_nonzero(first))
        rounds = expected_rounds(method, workers, number)
        for stats in call["stats"]:
            assert stats["nnz"] == nnz
            assert rounds is None or stats["rounds"] == rounds, stats
            assert set(stats["seconds"]) >= {"select", "comm", "accumulate", "total"}
            assert stats["bytes_sent"] >= 0 and stats["messages"] >= 0
        if workers == 1:
            assert all(s["bytes_sent"] == 0 for s in call["stats"]), "one rank has nothing to send"
        if method in ("gtopk", "oktopk"):
            assert nnz <= k or method == "oktopk" and number % OKTOPK_SHORT["global_interval"]
        if method == "topk":
            assert nnz <= workers * k
            assert all(s["bytes_sent"] == 8 * k * (workers - 1) for s in call["stats"])
        if method == "gtopk":  # every non-root rank sends k entries up once and receives k once
            assert sum(s["bytes_sent"] for s in call["stats"]) == 16 * k * (workers - 1)
            assert all(s["bytes_sent"] <= 8 * k * (ceil_log2(workers) + 1) for s in call["stats"])
        if method == "gaussiank":  # all-gatherv: each list (count + entries) reaches P-1 ranks
            selected = int((call["after"] == 0).sum())
            total = sum(s["bytes_sent"] for s in call["stats"])
            assert total == (workers - 1) * (4 * workers + 8 * selected)
        if density == 1.0:
            dense = (call["grads"] + call["before"]).double().mean(0)
            np.testing.assert_allclose(first.double().numpy(), dense.numpy(), rtol=1e-5, atol=1e-5)
            assert float(call["after"].abs().max()) == 0.0


@pytest.mark.parametrize("workers", [1, 2, 3, 5, 6, 8, 11])
def test_topk_receives_exactly_2k_words_from_each_other_rank(workers):
    numel, density = 5000, 0.01
    k = budget(numel, density)
    for call in run("topk", workers, numel, density, calls=2, record=True):
        assert call["received"] == [8 * k * (workers - 1)] * workers


@pytest.mark.parametrize("workers", [3, 4, 5, 7, 8, 12])
def test_gtopk_lost_mass_is_exactly_what_the_residuals_miss(workers):
    numel, density = 3000, 0.2  # dense enough that the ranks' selections overlap
    lost_somewhere = False
    for call in run("gtopk", workers, numel, density, calls=3, seed=workers):
        lhs = (call["grads"].double() + call["before"].double()).sum(0)
        missing = lhs - workers * call["results"][0].double() - call["after"].double().sum(0)
        stats = call["stats"][0]
        assert all(s["lost_mass"] == stats["lost_mass"] for s in call["stats"])
        tolerance = 1e-5 * (float(lhs.abs().max()) + 1) * math.sqrt(numel)
        assert abs(float(missing.sum()) - stats["lost_sum"]) <= tolerance
        assert float(missing.abs().sum()) <= stats["lost_mass"] + tolerance
        # The loss sits only on coordinates of the result.
        assert float(missing[call["results"][0] == 0].abs().max()) <= 1e-5 * (
            float(lhs.abs().max()) + 1
        )
        assert 0.0 <= stats["lost_fraction"] <= 1.0
        lost_somewhere |= stats["lost_mass"] > 0
    assert lost_somewhere, "with 3+ ranks gTop-k drops contributions that reach the final set"


def test_gtopk_loss_is_measured_only_on_request_and_outside_the_call():
    """Off by default; when on, the call's own stats are those of a call without it, and the
    measurement's all-reduce is counted nowhere."""
    grads = heavy_tailed((2, 4, 800), 7)

    def body(transport, measure):
        recorder = RecordingTransport(transport)
        options = {"measure_loss": True} if measure else {}
        sync = compressors.create("gtopk", recorder, numel=800, density=0.2, **options)
        out = []
        for call in range(2):
            result = sync.allreduce(grads[call, transport.rank].clone())
            counted = {key: sync.stats[key] for key in ("bytes_sent", "messages", "rounds", "nnz")}
            events = recorder.take()
            loss = sync.measure_lost_mass() if measure else None
            out.append((result, counted, dict(sync.stats), events, recorder.take(), loss))
        if not measure:
            with pytest.raises(ValueError, match="measure_loss=True"):
                sync.measure_lost_mass()
        return out

    plain, measured = local_group(4).run(body, False), local_group(4).run(body, True)
    assert compressors.option_defaults("gtopk")["measure_loss"] is False
    for rank in range(4):
        for call in range(2):
            result, counted, stats, events, after, _ = plain[rank][call]
            m_result, m_counted, m_stats, m_events, m_after, loss = measured[rank][call]
            assert torch.equal(result, m_result) and counted == m_counted and events == m_events
            assert "lost_mass" not in stats and after == []
            assert {key: m_stats[key] for key in loss} == loss == measured[0][call][5]
            # The measurement's one all-reduce, logged after the call and counted in no stats.
            assert [e.kind for e in m_after] == ["allreduce"] and m_stats["rounds"] == counted[
                "rounds"
            ]
    assert any(measured[0][call][5]["lost_mass"] > 0 for call in range(2))


def persistent_gradients(calls, workers, numel, spikes, seed):
    """Gradients whose large entries sit on the same ``spikes`` coordinates on every rank and
    call (as in training, where the same weights keep large gradients): thresholds can track k."""
    generator = torch.Generator().manual_seed(seed)
    grads = 1e-3 * torch.randn(calls, workers, numel, generator=generator)
    where = torch.randperm(numel, generator=generator)[:spikes]
    grads[:, :, where] += 10 + torch.randn(calls, workers, spikes, generator=generator)
    return grads


@pytest.mark.parametrize("workers", [2, 3, 4, 6, 8])
def test_oktopk_words_are_within_6k_p_minus_1_over_p(workers):
    numel, density, calls = 40000, 0.01, 5
    k = budget(numel, density)
    grads = persistent_gradients(calls, workers, numel, k, workers)
    for number, call in enumerate(run("oktopk", workers, numel, density, calls, grads=grads)):
        stats = call["stats"]
        assert all(s["selected"] <= 4 * k / 3 for s in stats) and stats[0]["kept"] <= 4 * k / 3
        boundary = 2 * (workers - 1) * 8 * (workers - 1) // workers if number == 0 else 0
        counts = 4 * (workers - 1)  # the all-gatherv's one count per list
        mean_bytes = sum(s["bytes_sent"] for s in stats) / workers
        assert (mean_bytes - boundary - counts) / 4 <= 6 * k * (workers - 1) / workers, (
            number,
            mean_bytes,
        )


@pytest.mark.parametrize("workers", [2, 3, 5, 8])
def test_oktopk_words_follow_the_selected_and_kept_counts(workers):
    """Whatever the thresholds do: each rank sends its selected entries to their owners once,
    and each kept entry reaches P-1 ranks once (plus one count per list, and the boundaries)."""
    numel, density, calls = 40000, 0.01, 4
    for number, call in enumerate(run("oktopk", workers, numel, density, calls, seed=workers)):
        stats = call["stats"]
        total = sum(s["bytes_sent"] for s in stats)
        boundary = (
            workers * (2 * (workers - 1) * 8 * (workers - 1) // workers) if number == 0 else 0
        )
        gathered = (workers - 1) * (4 * workers + 8 * stats[0]["kept"]) if number else None
        if number:  # on reuse calls the gathered entries are exactly the kept ones
            split = total - boundary - gathered
            assert 0 <= split <= 8 * sum(s["selected"] for s in stats)
        else:  # exact global threshold: the whole union is gathered, at most P k entries
            assert total - boundary <= 8 * sum(s["selected"] for s in stats) + (workers - 1) * (
                4 * workers + 8 * workers * budget(numel, density)
            )


def test_oktopk_recomputes_and_reuses_on_schedule():
    numel, density, workers = 20000, 0.01, 4
    intervals = dict(local_interval=3, global_interval=2, region_interval=4)
    grads = heavy_tailed((7, workers, numel), 11)

    def body(transport):
        sync = compressors.create("oktopk", transport, numel=numel, density=density, **intervals)
        states = []
        for call in range(7):
            sync.allreduce(grads[call, transport.rank])
            states.append(sync.state_dict())
        return states

    states = local_group(workers).run(body)
    for call in range(7):
        boundaries = {tuple(s[call]["boundaries"]) for s in states}
        assert len(boundaries) == 1, "every rank uses the same regions"
        assert len({s[call]["global_threshold"] for s in states}) == 1
        cuts = boundaries.pop()
        assert cuts[0] == 0 and cuts[-1] == numel and list(cuts) == sorted(cuts)
        if call % 4:
            assert cuts == tuple(states[0][call - 1]["boundaries"]), (
                "regions change only every 4 calls"
            )
    assert states[0][3]["boundaries"] != states[0][4]["boundaries"]


def test_topkdsa_switches_to_the_dense_all_gather_by_fill_in():
    numel, workers = 3000, 4
    grads = heavy_tailed((1, workers, numel), 5)
    results = {}
    for dense_above in (1.0, 0.01):

        def body(transport, dense_above=dense_above):
            sync = compressors.create(
                "topkdsa", transport, numel=numel, density=0.02, dense_above=dense_above
            )
            return sync.allreduce(grads[0, transport.rank]), sync.went_dense, sync.stats

        outcome = local_group(workers).run(body)
        assert all(went == (dense_above < 1.0) for _, went, _ in outcome)
        results[dense_above] = outcome[0][0]
        if dense_above < 1.0:  # dense regions: 4 bytes per element, each reaching P-1 ranks
            total = sum(stats["bytes_sent"] for _, _, stats in outcome)
            assert total >= 4 * numel * (workers - 1)
    assert torch.equal(results[1.0], results[0.01])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("workers", [3, 4])
def test_state_dict_round_trip_continues_bit_identically(method, workers):
    numel, density = 3000, 0.01
    options = (
        dict(local_interval=3, global_interval=2, region_interval=2) if method == "oktopk" else {}
    )
    grads = heavy_tailed((6, workers, numel), 9)

    def body(transport):
        first = compressors.create(method, transport, numel=numel, density=density, **options)
        for call in range(3):
            first.allreduce(grads[call, transport.rank])
        state = first.state_dict()
        expected = [
            (first.allreduce(grads[c, transport.rank]), first.residual.clone()) for c in range(3, 6)
        ]
        second = compressors.create(method, transport, numel=numel, density=density, **options)
        second.load_state_dict(state)
        again = [
            (second.allreduce(grads[c, transport.rank]), second.residual.clone())
            for c in range(3, 6)
        ]
        return all(
            torch.equal(a, b) and torch.equal(r, s) for (a, r), (b, s) in zip(expected, again)
        )

    assert all(local_group(workers).run(body))


@pytest.mark.parametrize("method", SPARSE)
def test_dense_warmup_runs_the_dense_average_first(method):
    workers, numel = 3, 400
    grads = heavy_tailed((3, workers, numel), 4)

    def body(transport):
        sync = compressors.create(method, transport, numel=numel, density=0.05, dense_warmup=2)
        out = [sync.allreduce(grads[c, transport.rank]) for c in range(3)]
        return out, sync.residual

    for results, residual in local_group(workers).run(body):
        for call in range(2):
            np.testing.assert_allclose(
                results[call].numpy(), grads[call].double().mean(0).numpy(), rtol=1e-5, atol=1e-6
            )
        assert int(torch.count_nonzero(results[2])) < numel
        assert float(residual.abs().max()) > 0


BAD_OPTIONS = [
    ("topk", {"teams": 2}),
    ("topk", {"dense_warmup": -1}),
    ("gtopk", {"measure_loss": "yes"}),
    ("oktopk", {"local_interval": 0}),
    ("oktopk", {"global_interval": 1.5}),
    ("oktopk", {"region_interval": -1}),
    ("oktopk", {"raise_scale": 1.0}),
    ("oktopk", {"raise_scale": float("inf")}),
    ("oktopk", {"raise_limit": -1}),
    ("oktopk", {"local_scale": "x"}),
    ("oktopk", {"global_scale": 0.9}),
    ("gaussiank", {"scale": 1}),
    ("gaussiank", {"max_loops": -2}),
    ("topkdsa", {"dense_above": 0}),
    ("topkdsa", {"dense_above": 1.5}),
]


@pytest.mark.parametrize("method,options", BAD_OPTIONS)
def test_bad_options_raise_value_error(method, options):
    def body(transport):
        with pytest.raises(ValueError) as error:
            compressors.create(method, transport, numel=100, density=0.1, **options)
        return str(error.value)

    message = local_group(1).run(body)[0]
    assert next(iter(options)) in message


@pytest.mark.parametrize("method", METHODS + ["topkA"])
def test_registry_density_and_numel_checks(method):
    assert {"dense", "spardl", "topk", "gtopk", "oktopk", "gaussiank", "topkdsa"} <= set(METHODS)
    assert compressors.resolve("topkA") is compressors.resolve("topk")

    def body(transport):
        for bad in (
            dict(numel=100, density=0.0),
            dict(numel=100, density=1.5),
            dict(numel=0, density=0.1),
        ):
            with pytest.raises(ValueError):
                compressors.create(method, transport, **bad)
        sync = compressors.create(method, transport, numel=100, density=0.1)
        with pytest.raises(ValueError):
            sync.allreduce(torch.zeros(99))
        grad = heavy_tailed(100, transport.rank)
        copy = grad.clone()
        sync.allreduce(grad)
        return torch.equal(grad, copy)

    assert all(local_group(2).run(body))


def test_gaussiank_selects_between_3k_4_and_5k_4_on_gaussian_gradients():
    numel, density, workers = 200000, 0.01, 2
    k = budget(numel, density)
    grads = torch.randn(2, workers, numel, generator=torch.Generator().manual_seed(3))
    for call in run("gaussiank", workers, numel, density, calls=2, grads=grads):
        selected = ((call["after"] == 0) & (call["grads"] + call["before"] != 0)).sum(1)
        assert all(3 * k // 4 <= int(count) <= 5 * k // 4 for count in selected), selected


def test_gaussiank_lower_bound_rounds_up_so_k_1_selects_something():
    """The count must reach 3k/4: at k = 1 that is 1, not 0 (3 * 1 // 4)."""
    grads = heavy_tailed((20, 1, 100), 4)

    def body(transport):
        sync = compressors.create("gaussiank", transport, numel=100, density=0.01)
        return [int(torch.count_nonzero(sync.allreduce(grads[call, 0]))) for call in range(20)]

    assert min(local_group(1).run(body)[0]) >= 1


def test_gaussiank_refuses_a_non_finite_gradient():
    grad = torch.ones(100)
    grad[3] = float("nan")
    sync = compressors.create("gaussiank", local_group(1).rank(0), numel=100, density=0.05)
    with pytest.raises(ValueError, match="NaN or inf"):
        sync.allreduce(grad)
