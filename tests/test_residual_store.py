"""ResidualStore: each parameter keeps its residual and warm-up count across bucket layouts."""

import io

import pytest
import torch

import compressors
from allreducers.transports import local_group
from compressors.residuals import ResidualStore, layout_key

TRANSPORT = local_group(1).rank(0)


def build(numel):
    return compressors.create("topk", TRANSPORT, numel=numel, density=0.1, dense_warmup=3)


def filled(store, keys, sizes, values, calls=0):
    """Build the layout of ``keys``; parameter i's residual holds ``values[i]``."""
    live = store.layout(keys, sizes, build)
    offset = 0
    for size, value in zip(sizes, values):
        live.sync.residual[offset : offset + size] = value
        offset += size
    live.sync.calls = calls
    return live


def test_a_new_layout_takes_its_parameters_residuals_and_the_largest_warmup_count():
    store = ResidualStore()
    filled(store, [1, 2], [3, 4], [1.0, 2.0], calls=5)
    filled(store, [3], [2], [3.0], calls=7)
    regrouped = store.layout([3, 2, 1], [2, 4, 3], build)
    assert regrouped.sync.residual.tolist() == [3.0] * 2 + [2.0] * 4 + [1.0] * 3
    assert regrouped.sync.calls == 7
    assert list(store.layouts) == ["3,2,1"] == [layout_key([3, 2, 1])]  # replaced ones gone
    assert store.residual(2).tolist() == [2.0] * 4 and store.calls(1) == 7
    assert store.residual(9) is None and store.calls(9) == 0
    assert store.layout([3, 2, 1], [2, 4, 3], build) is regrouped  # built once
    assert regrouped.out.shape == (9,)
    assert store.keys() == {1, 2, 3}


def test_a_residual_moves_rather_than_being_copied_so_that_it_counts_once():
    store = ResidualStore()
    old = filled(store, ["a.weight", "a.bias"], [2, 2], [5.0, 6.0])
    old_residual = old.sync.residual
    part = store.layout(["a.bias"], [2], build)
    assert part.sync.residual.tolist() == [6.0, 6.0]
    assert old_residual[2:].tolist() == [0.0, 0.0]  # left behind as zeros
    assert store.residual("a.weight").tolist() == [5.0, 5.0]  # still in its old layout
    assert set(store.layouts) == {"a.weight,a.bias", "a.bias"}


def test_state_dict_round_trip_restores_each_parameter_where_it_next_lives():
    store = ResidualStore()
    filled(store, [0, 1], [3, 2], [1.0, 2.0], calls=4)
    buffer = io.BytesIO()
    torch.save(store.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert saved["0,1"]["numbers"] == [0, 1] and saved["0,1"]["sizes"] == [3, 2]

    same = ResidualStore()
    same.load_state_dict(saved)
    assert same.residual(1).tolist() == [2.0, 2.0] and same.calls(0) == 4  # before any build
    again = same.layout([0, 1], [3, 2], build)  # the saved layout's full state loads
    assert again.sync.residual.tolist() == [1.0] * 3 + [2.0] * 2 and again.sync.calls == 4

    other = ResidualStore()
    other.load_state_dict(saved)
    swapped = other.layout([1, 0], [2, 3], build)  # another layout gathers the pieces
    assert swapped.sync.residual.tolist() == [2.0] * 2 + [1.0] * 3 and swapped.sync.calls == 4
    assert saved["0,1"]["state"]["residual"].tolist() == [1.0] * 3 + [2.0] * 2  # not consumed


def test_loading_replaces_what_the_store_held():
    store = ResidualStore()
    filled(store, [0], [2], [9.0])
    store.load_state_dict({})
    assert store.layouts == {} and store.residual(0) is None


def test_a_residual_of_another_size_is_refused_before_anything_moves():
    store = ResidualStore()
    filled(store, [0, 1], [3, 2], [1.0, 2.0])
    with pytest.raises(ValueError, match="saved for another set of trainable parameters"):
        store.layout([1], [4], build)
    assert store.residual(1).tolist() == [2.0, 2.0]


@pytest.mark.parametrize(
    "bucket",
    [
        {"numbers": [0], "sizes": [3]},
        {"numbers": [0], "sizes": [3], "state": {"residual": torch.zeros(2), "calls": 0}},
        {"numbers": [0, 1], "sizes": [3], "state": {"residual": torch.zeros(3), "calls": 0}},
    ],
)
def test_a_malformed_saved_bucket_is_refused(bucket):
    with pytest.raises(ValueError, match="saved bucket"):
        ResidualStore().load_state_dict({"0": bucket})
