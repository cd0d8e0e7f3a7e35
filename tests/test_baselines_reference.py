"""The baselines against independent plain-numpy references for tiny n and P (float32)."""

import numpy as np
import pytest
import torch

import compressors
from allreducers.transports import local_group
from tests.test_baselines import budget, run

CASES = [(3, 40, 0.1), (5, 40, 0.1), (3, 40, 0.25), (5, 40, 0.05), (4, 37, 0.2), (6, 40, 0.1)]
TINY = np.finfo(np.float32).tiny


def top(values, k, among=None):
    """Indices (ascending) of the k largest |values| (within ``among``), ties to the lower index."""
    among = np.arange(len(values)) if among is None else np.asarray(among)
    order = np.lexsort((among, -np.abs(values[among])))
    return np.sort(among[order[:k]])


def reference_topk(acc, density):
    """Each rank's top-k, every value divided by P, summed in rank order."""
    workers, n = acc.shape
    k = budget(n, density)
    result, residual = np.zeros(n, np.float32), acc.copy()
    for w in range(workers):
        chosen = top(acc[w], k)
        np.add.at(
            result, chosen, acc[w, chosen] / np.float32(workers)
        )  # rank order, ascending index
        residual[w, chosen] = 0
    return result, residual


def reference_gtopk(acc, density):
    """gTop-k with the extra ranks folded in first; also the dropped partial sums that are lost."""
    workers, n = acc.shape
    k = budget(n, density)
    chosen = [top(acc[w], k) for w in range(workers)]
    lists = [{int(j): acc[w, j] for j in chosen[w]} for w in range(workers)]
    drops = []

    def merge(a, b):
        union = dict(a)
        for j, v in b.items():
            union[j] = union[j] + v if j in union else v  # float32 additions
        keys = np.array(sorted(union))
        values = np.array([union[j] for j in keys], np.float32)
        keep = set(keys[top(values, k)].tolist())
        drops.extend((j, v) for j, v in union.items() if j not in keep)
        return {j: v for j, v in union.items() if j in keep}

    power = 1 << (workers.bit_length() - 1)
    for extra in range(power, workers):
        lists[extra - power] = merge(lists[extra - power], lists[extra])
    distance = 1
    while distance < power:
        for r in range(0, power, 2 * distance):
            lists[r] = merge(lists[r], lists[r + distance])
        distance *= 2
    final = lists[0]
    result = np.zeros(n, np.float32)
    for j, v in final.items():
        result[j] = v / np.float32(workers)
    residual = acc.copy()
    for w in range(workers):
        inside = [j for j in chosen[w] if j in final]
        residual[w, inside] = 0
    lost = sum(abs(float(v)) for j, v in drops if j in final)
    return result, residual, lost


@pytest.mark.parametrize("workers,numel,density", CASES)
def test_topk_equals_the_reference_exactly(workers, numel, density):
    for call in run("topk", workers, numel, density, calls=3, seed=numel + workers):
        acc = (call["grads"] + call["before"]).numpy()
        expected, residual = reference_topk(acc, density)
        for result in call["results"]:
            np.testing.assert_array_equal(result.numpy(), expected)
        np.testing.assert_array_equal(call["after"].numpy(), residual)


@pytest.mark.parametrize("workers,numel,density", CASES + [(7, 40, 0.3), (8, 40, 0.2)])
def test_gtopk_equals_the_reference_exactly(workers, numel, density):
    for call in run("gtopk", workers, numel, density, calls=3, seed=numel * workers):
        acc = (call["grads"] + call["before"]).numpy()
        expected, residual, lost = reference_gtopk(acc, density)
        for result in call["results"]:
            np.testing.assert_array_equal(result.numpy(), expected)
        np.testing.assert_array_equal(call["after"].numpy(), residual)
        assert call["stats"][0]["lost_mass"] == pytest.approx(lost, rel=1e-9, abs=1e-12)


def test_gtopk_reference_loses_mass_in_these_cases():
    """Guard against a vacuous lost-mass comparison above."""
    lost = 0.0
    for workers, numel, density in CASES + [(7, 40, 0.3), (8, 40, 0.2)]:
        for call in run("gtopk", workers, numel, density, calls=3, seed=numel * workers):
            lost += call["stats"][0]["lost_mass"]
    assert lost > 0


@pytest.mark.parametrize("workers,numel,density", CASES)
def test_topkdsa_sums_every_selected_entry(workers, numel, density):
    for dense_above in (1.0, 0.01):  # the sparse and the dense all-gather
        for call in run(
            "topkdsa", workers, numel, density, calls=3, seed=numel, dense_above=dense_above
        ):
            acc = (call["grads"] + call["before"]).numpy()
            expected, residual = reference_topk(acc, density)
            np.testing.assert_allclose(call["results"][0].numpy(), expected, rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(call["after"].numpy(), residual)


def oktopk_reference(
    acc, density, local_thresholds, global_threshold, exact, raise_scale=1.03, limit=5
):
    """One Ok-Topk call: per rank S_w (exact top-k, or by the reused threshold with its raises),
    the summed selected values, and the kept set (exact global top-k, or by the global
    threshold)."""
    workers, n = acc.shape
    k = budget(n, density)
    selections = []
    for w in range(workers):
        magnitude = np.abs(acc[w])
        if exact:
            selections.append(top(acc[w], k))
            continue
        threshold = max(local_thresholds[w], TINY)
        count = int((magnitude >= np.float32(threshold)).sum())
        for _ in range(limit):
            if count <= 4 * k // 3:
                break
            threshold *= raise_scale
            count = int((magnitude >= np.float32(threshold)).sum())
        selections.append(np.nonzero(magnitude >= np.float32(threshold))[0])
    summed = np.zeros(n, np.float64)
    for w, chosen in enumerate(selections):
        summed[chosen] += acc[w, chosen]
    union = np.unique(np.concatenate(selections))
    if exact:
        kept = top(summed, k, among=union)
    else:
        kept = union[
            np.abs(summed[union]).astype(np.float32) >= np.float32(max(global_threshold, TINY))
        ]
    residual = acc.copy()
    for w, chosen in enumerate(selections):
        residual[w, np.intersect1d(chosen, kept)] = 0
    return summed, kept, residual


@pytest.mark.parametrize("workers,numel,density", CASES)
def test_oktopk_exact_calls_keep_the_global_top_k_of_the_summed_selections(workers, numel, density):
    intervals = dict(local_interval=2, global_interval=2, region_interval=3)
    grads = torch.from_numpy(
        np.random.default_rng(workers * numel).standard_t(3, (4, workers, numel)).astype(np.float32)
    )

    def body(transport):
        sync = compressors.create("oktopk", transport, numel=numel, density=density, **intervals)
        out = []
        for call in range(4):
            before = sync.state_dict()
            result = sync.allreduce(grads[call, transport.rank].clone())
            out.append((before, result, sync.residual.clone()))
        return out

    per_rank = local_group(workers).run(body)
    for call in range(4):
        befores = [per_rank[w][call][0] for w in range(workers)]
        acc = np.stack([(grads[call, w] + befores[w]["residual"]).numpy() for w in range(workers)])
        exact = call % 2 == 0
        summed, kept, residual = oktopk_reference(
            acc,
            density,
            [b["local_threshold"] for b in befores],
            befores[0]["global_threshold"],
            exact,
        )
        result = per_rank[0][call][1].numpy()
        expected = np.zeros(numel, np.float32)
        expected[kept] = summed[kept] / workers
        np.testing.assert_array_equal(np.nonzero(result)[0], kept[summed[kept] != 0])
        np.testing.assert_allclose(result, expected, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(
            np.stack([per_rank[w][call][2].numpy() for w in range(workers)]), residual
        )
