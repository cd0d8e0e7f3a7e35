"""Schedules are pure functions: check them exhaustively with no communication at all."""
import pytest

from allreducers import (bruck_allgather_schedule, ceil_log2, recursive_doubling_schedule,
                         srs_round_shapes, srs_schedule)


def simulate_reduce_scatter(m):
    """Play SRS symbolically: each worker's copy of each block is a multiset of contributors."""
    holds = [[{w: 1} for _ in range(m)] for w in range(m)]
    schedules = [srs_schedule(r, list(range(m))) for r in range(m)]
    sent_blocks = [0] * m
    for step_no in range(ceil_log2(m)):
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


@pytest.mark.parametrize("m", range(1, 65))
def test_srs_reduces_every_block_exactly_once(m):
    holds, sent_blocks = simulate_reduce_scatter(m)
    for r in range(m):
        assert holds[r][r] == {w: 1 for w in range(m)}, f"block {r} on worker {r}"
        assert sent_blocks[r] == m - 1


@pytest.mark.parametrize("m", range(1, 65))
def test_srs_never_sends_own_block_and_blocks_are_frozen_after_sending(m):
    for r in range(m):
        sent = set()
        for step in srs_schedule(r, list(range(m))):
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
def test_recursive_doubling_gathers_everything(m):
    held, sent, steps = play_allgather(recursive_doubling_schedule, m)
    assert all(h == set(range(m)) for h in held)
    assert sent == [m - 1] * m
    assert steps == ceil_log2(m)


@pytest.mark.parametrize("m", [3, 6, 12])
def test_recursive_doubling_rejects_non_powers_of_two(m):
    with pytest.raises(ValueError, match="power-of-two"):
        recursive_doubling_schedule(0, list(range(m)))


def test_schedules_reject_bad_groups():
    with pytest.raises(ValueError):
        srs_schedule(3, [0, 1, 2])
    with pytest.raises(ValueError):
        bruck_allgather_schedule(0, [1, 1])
