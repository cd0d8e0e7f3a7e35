"""The baselines' schedules (gTop-k tree, Ok-Topk rotation), checked symbolically for many sizes."""

import pytest

from allreducers import (
    Step,
    binomial_broadcast_schedule,
    binomial_reduce_schedule,
    ceil_log2,
    rotation_schedule,
)

SIZES = range(1, 41)


def check_pairing(schedules):
    """Every send of step t has the matching receive at step t on the destination, with the
    same items, and nobody talks to itself."""
    m = len(schedules)
    steps = {len(s) for s in schedules}
    assert len(steps) == 1, "every position runs the same number of steps"
    for t in range(steps.pop()):
        for r in range(m):
            step = schedules[r][t]
            assert step.send_to != r and step.recv_from != r
            if step.send_to is not None:
                partner = schedules[step.send_to][t]
                assert partner.recv_from == r
                assert partner.recv_items == step.send_items
            if step.recv_from is not None:
                assert schedules[step.recv_from][t].send_to == r


@pytest.mark.parametrize("m", SIZES)
def test_tree_reduce_merges_every_contribution_once_into_position_0(m):
    members = list(range(m))
    schedules = [binomial_reduce_schedule(r, members) for r in members]
    check_pairing(schedules)
    assert all(len(s) == ceil_log2(m) for s in schedules)
    holds = [{r: 1} for r in members]
    done = [False] * m
    for t in range(ceil_log2(m)):
        messages = {}
        for r in members:
            step = schedules[r][t]
            if step.send_to is not None:
                assert not done[r], "a position sends twice"
                assert sorted(holds[r]) == list(step.send_items), "items label the contributions"
                messages[step.send_to] = holds[r]
                done[r] = True
        for destination, contributions in messages.items():
            assert not done[destination], "a position receives after it has sent"
            for worker, times in contributions.items():
                holds[destination][worker] = holds[destination].get(worker, 0) + times
    assert holds[0] == {w: 1 for w in members}
    assert done == [False] + [True] * (m - 1), "every position but 0 sends exactly once"


@pytest.mark.parametrize("m", SIZES)
def test_tree_broadcast_reaches_every_position_once(m):
    members = list(range(m))
    schedules = [binomial_broadcast_schedule(r, members) for r in members]
    check_pairing(schedules)
    assert all(len(s) == ceil_log2(m) for s in schedules)
    has = [r == 0 for r in members]
    received = [0] * m
    for t in range(ceil_log2(m)):
        arriving = []
        for r in members:
            step = schedules[r][t]
            if step.send_to is not None:
                assert has[r], "a position forwards the result before it has it"
                assert step.send_items == (0,)
                arriving.append(step.send_to)
        for destination in arriving:
            has[destination] = True
            received[destination] += 1
    assert all(has)
    assert received == [0] + [1] * (m - 1)


def test_tree_table_of_the_docstring():
    members = list(range(6))
    reduce_steps = [binomial_reduce_schedule(r, members) for r in members]
    assert [
        (r, s.send_to) for r in members for s in reduce_steps[r][:1] if s.send_to is not None
    ] == [(4, 0), (5, 1)]
    assert reduce_steps[1][1] == Step(send_to=0, recv_from=None, send_items=(1, 5))
    assert reduce_steps[2][2] == Step(send_to=0, recv_from=None, send_items=(2, 3))
    broadcast = [binomial_broadcast_schedule(r, members) for r in members]
    assert [(r, s.send_to) for r in members for s in broadcast[r][2:] if s.send_to is not None] == [
        (0, 4),
        (1, 5),
    ]
    assert binomial_reduce_schedule(0, [7]) == [] and binomial_broadcast_schedule(0, [7]) == []


def test_tree_uses_global_ranks():
    steps = binomial_reduce_schedule(1, [10, 11, 12])
    assert [(s.send_to, s.recv_from) for s in steps] == [(None, None), (10, None)]
    assert [(s.send_to, s.recv_from) for s in binomial_broadcast_schedule(2, [10, 11, 12])] == [
        (None, None),
        (None, 10),
    ]


@pytest.mark.parametrize("m", SIZES)
def test_rotation_delivers_every_region_part_to_its_owner_once(m):
    members = list(range(m))
    schedules = [rotation_schedule(r, members) for r in members]
    check_pairing(schedules)
    assert all(len(s) == m - 1 for s in schedules)
    received = [{r} for r in members]  # the owner's own part needs no message
    for t in range(m - 1):
        for r in members:
            step = schedules[r][t]
            region = step.send_items[0]
            assert step.send_to == region and step.recv_items == (r,)
            assert r not in received[region]
            received[region].add(r)
    assert received == [set(members) for _ in members]


def test_rotation_table_of_the_docstring():
    table = [
        [(s.send_to, s.recv_from) for s in rotation_schedule(r, list(range(4)))] for r in range(4)
    ]
    assert table[0] == [(1, 3), (2, 2), (3, 1)]
    assert [row[0][0] for row in table] == [1, 2, 3, 0]
    assert [s.send_to for s in rotation_schedule(1, [5, 6, 7])] == [7, 5]


@pytest.mark.parametrize(
    "schedule", [binomial_reduce_schedule, binomial_broadcast_schedule, rotation_schedule]
)
def test_bad_groups_are_rejected(schedule):
    with pytest.raises(ValueError):
        schedule(0, [])
    with pytest.raises(ValueError):
        schedule(3, [0, 1, 2])
    with pytest.raises(ValueError):
        schedule(0, [1, 1])
