"""Schedules are pure functions: check them exhaustively with no communication at all."""

import pytest

from allreducers import (
    bruck_allgather_schedule,
    ceil_log2,
    recursive_halving_schedule,
    srs_block_schedule,
    srs_round_shapes,
    srs_schedule,
)

SRS_EXECUTIONS = [srs_schedule, srs_block_schedule]


def simulate_reduce_scatter(m, schedule_fn=srs_schedule):
    """Play SRS symbolically: each worker's copy of each block is a multiset of contributors."""
    holds = [[{w: 1} for _ in range(m)] for w in range(m)]
    schedules = [schedule_fn(r, list(range(m))) for r in range(m)]
    sent_blocks = [0] * m
    for step_no in range(len(schedules[0])):
        outgoing = {}
        for r in range(m):
            step = schedules[r][step_no]
            outgoing[(r, step.send_to)] = [(b, dict(holds[r][b])) for b in step.send_items]
            sent_blocks[r] += len(step.send_items)
        for r in range(m):
            step = schedules[r][step_no]
            message = outgoing[(step.recv_from, r)]
            assert [b for b, _ in message] == list(step.recv_items)
            for block, contributors in message:
                for worker, times in contributors.items():
                    holds[r][block][worker] = holds[r][block].get(worker, 0) + times
    return holds, sent_blocks


@pytest.mark.parametrize("schedule_fn", SRS_EXECUTIONS)
@pytest.mark.parametrize("m", range(1, 65))
def test_srs_reduces_every_block_exactly_once(m, schedule_fn):
    holds, sent_blocks = simulate_reduce_scatter(m, schedule_fn)
    for r in range(m):
        assert holds[r][r] == {w: 1 for w in range(m)}, f"block {r} on worker {r}"
        assert sent_blocks[r] == m - 1


@pytest.mark.parametrize("schedule_fn", SRS_EXECUTIONS)
@pytest.mark.parametrize("m", range(1, 65))
def test_srs_never_sends_own_block_and_blocks_are_frozen_after_sending(m, schedule_fn):
    for r in range(m):
        sent = set()
        for step in schedule_fn(r, list(range(m))):
            assert r not in step.send_items
            assert not sent & set(step.send_items), "a block is sent twice"
            assert not sent & set(step.recv_items), "a block is changed after it was sent"
            sent |= set(step.send_items)


def test_srs_round_table_matches_spec():
    assert srs_round_shapes(5) == [(4, 1), (2, 2), (1, 1)]
    assert srs_round_shapes(6) == [(4, 2), (2, 2), (1, 1)]
    assert srs_round_shapes(7) == [(4, 3), (2, 2), (1, 1)]
    assert srs_round_shapes(8) == [(4, 4), (2, 2), (1, 1)]
    assert srs_round_shapes(1) == []


@pytest.mark.parametrize("m", range(1, 33))
def test_srs_blocks_play_the_round_table_one_block_per_step(m):
    """m-1 steps of one block each; concatenated in order they are the rounds' messages, with
    the rounds' partners."""
    for r in range(m):
        rounds = srs_schedule(r, list(range(m)))
        blocks = srs_block_schedule(r, list(range(m)))
        assert len(blocks) == m - 1
        assert all(len(step.send_items) == len(step.recv_items) == 1 for step in blocks)
        flattened = [
            (step.send_to, step.recv_from, sent, received)
            for step in rounds
            for sent, received in zip(step.send_items, step.recv_items)
        ]
        assert flattened == [
            (step.send_to, step.recv_from, *step.send_items, *step.recv_items) for step in blocks
        ]


def test_srs_blocks_table_for_six_workers():
    steps = srs_block_schedule(0, list(range(6)))
    assert [(s.send_to, s.send_items, s.recv_from, s.recv_items) for s in steps] == [
        (4, (4,), 2, (0,)),
        (4, (5,), 2, (1,)),
        (2, (2,), 4, (0,)),
        (2, (3,), 4, (1,)),
        (1, (1,), 5, (0,)),
    ]


def test_srs_uses_global_ranks():
    steps = srs_schedule(1, [10, 11, 12])
    assert [(s.send_to, s.recv_from) for s in steps] == [(10, 12), (12, 10)]


def play_allgather(schedule_fn, m):
    schedules = [schedule_fn(r, list(range(m))) for r in range(m)]
    held = [{r} for r in range(m)]
    sent = [0] * m
    for step_no in range(len(schedules[0])):
        outgoing = {}
        for r in range(m):
            step = schedules[r][step_no]
            assert set(step.send_items) <= held[r], "sends an item it does not hold"
            outgoing[(r, step.send_to)] = step.send_items
            sent[r] += len(step.send_items)
        for r in range(m):
            step = schedules[r][step_no]
            assert outgoing[(step.recv_from, r)] == step.recv_items
            held[r] |= set(step.recv_items)
    return held, sent, len(schedules[0])


@pytest.mark.parametrize("m", range(1, 65))
def test_bruck_gathers_everything_in_ceil_log2_steps(m):
    held, sent, steps = play_allgather(bruck_allgather_schedule, m)
    assert all(h == set(range(m)) for h in held)
    assert sent == [m - 1] * m
    assert steps == ceil_log2(m)


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 32, 64])
def test_recursive_halving_merges_every_position_once(m):
    """Play the pair exchanges as a reduction: each position's sum is a multiset of
    contributors; partners add theirs, so everyone must end with each position exactly once,
    and a message's items must name exactly the contributors it carries."""
    schedules = [recursive_halving_schedule(r, list(range(m))) for r in range(m)]
    sums = [{r: 1} for r in range(m)]
    for step_no in range(ceil_log2(m)):
        steps = [schedules[r][step_no] for r in range(m)]
        for r, step in enumerate(steps):
            partner = step.send_to
            assert step.recv_from == partner and steps[partner].send_to == r
            assert step.send_items == tuple(sorted(sums[r])) and step.recv_items == tuple(
                sorted(sums[partner])
            )
            assert abs(r - partner) == m >> (step_no + 1), "distance m/2 first"
        sums = [
            {
                q: sums[r].get(q, 0) + sums[steps[r].send_to].get(q, 0)
                for q in set(sums[r]) | set(sums[steps[r].send_to])
            }
            for r in range(m)
        ]
    assert all(total == {q: 1 for q in range(m)} for total in sums)
    assert all(len(schedule) == ceil_log2(m) for schedule in schedules)


def test_recursive_halving_table_for_eight():
    steps = recursive_halving_schedule(0, list(range(8)))
    assert [(s.send_to, s.send_items, s.recv_items) for s in steps] == [
        (4, (0,), (4,)),
        (2, (0, 4), (2, 6)),
        (1, (0, 2, 4, 6), (1, 3, 5, 7)),
    ]


@pytest.mark.parametrize("m", [3, 6, 12])
def test_recursive_halving_rejects_non_powers_of_two(m):
    with pytest.raises(ValueError, match="power-of-two"):
        recursive_halving_schedule(0, list(range(m)))


def test_schedules_reject_bad_groups():
    with pytest.raises(ValueError):
        srs_schedule(3, [0, 1, 2])
    with pytest.raises(ValueError):
        bruck_allgather_schedule(0, [1, 1])
