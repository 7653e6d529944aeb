"""Pipeline schedules as plain data: exhaustive checks over p in 1..8, m in 1..32."""

import itertools

import pytest

from tfpar.pipeline.schedule import GPipe, Instruction, OneFOneB, make_schedule

GRID = list(itertools.product(range(1, 9), range(1, 33)))


@pytest.mark.parametrize("cls", [GPipe, OneFOneB])
def test_every_stage_runs_each_forward_and_backward_once_forward_first(cls):
    for p, m in GRID:
        schedule = cls(p, m)
        for stage, stream in enumerate(schedule.streams()):
            assert sorted((i.kind, i.microbatch) for i in stream) == sorted(
                [("forward", k) for k in range(m)] + [("backward", k) for k in range(m)])
            assert all(i.stage == stage for i in stream)
            seen = set()
            for instruction in stream:
                if instruction.kind == "backward":
                    assert instruction.microbatch in seen
                seen.add(instruction.microbatch)


@pytest.mark.parametrize("cls", [GPipe, OneFOneB])
def test_simulated_bubble_equals_the_theory_with_equal_stages(cls):
    for p, m in GRID:
        schedule = cls(p, m)
        assert schedule.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
        for forward, backward in ((1.0, 1.0), (1.0, 2.0)):
            timeline = schedule.simulate(forward, backward)  # raises on a deadlock
            assert timeline.makespan == pytest.approx((m + p - 1) * (forward + backward)), (p, m)
            assert timeline.bubble_fraction == pytest.approx(schedule.bubble_fraction)


def test_peak_activations_m_for_gpipe_and_min_p_minus_s_m_for_1f1b():
    for p, m in GRID:
        for s in range(p):
            assert GPipe(p, m).peak_activations(s) == m
            assert OneFOneB(p, m).peak_activations(s) == min(p - s, m)


def test_timeline_order_respects_every_dependency():
    for p, m in [(2, 8), (3, 5), (4, 2), (8, 32)]:
        for cls in (GPipe, OneFOneB):
            order = cls(p, m).simulate().order()
            done = set()
            for instruction in order:
                dependency = instruction.dependency(p)
                assert dependency is None or dependency in done
                done.add(instruction)


def test_1f1b_streams_look_like_pipedream_flush():
    streams = [[str(i) for i in stream] for stream in make_schedule("1f1b", 3, 4).streams()]
    assert streams[0] == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    assert streams[2] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    assert str(Instruction("backward", 1, 7)) == "B7"


@pytest.mark.parametrize("args, match", [
    (("zigzag", 2, 4), r"Unknown pipeline schedule 'zigzag'. Received: schedule='zigzag'. Use one of \['1f1b', 'gpipe'\]"),
    (("gpipe", 0, 4), r"num_stages must be an int >= 1. Received: num_stages=0"),
    (("1f1b", 2, 0), r"num_microbatches must be an int >= 1. Received: num_microbatches=0"),
])
def test_bad_schedule_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        make_schedule(*args)
