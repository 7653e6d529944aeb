"""Pipeline schedules as plain data: exhaustive checks over p in 1..8, m in 1..32."""

import itertools

import pytest

from tfpar.pipeline.schedule import (
    GPipe,
    Instruction,
    Interleaved1F1B,
    OneFOneB,
    ZeroBubbleH1,
    make_schedule,
)

GRID = list(itertools.product(range(1, 9), range(1, 33)))
# F, B, W of a whole stage
COSTS = [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 0.5), (1.0, 1.5, 0.25)]


def _new_schedules():
    """Every valid interleaved (v = 2, 3) and ZB-H1 schedule over p in 1..6, m in 1..24."""
    for p, m in itertools.product(range(1, 7), range(1, 25)):
        if m % p == 0:
            for v in (2, 3):
                yield Interleaved1F1B(p, m, v)
        if m >= p:
            yield ZeroBubbleH1(p, m)


def test_new_schedules_run_every_instruction_once_each_after_what_it_needs():
    for schedule in _new_schedules():
        p, m, kinds = schedule.num_stages, schedule.num_microbatches, ["forward", "backward"]
        if schedule.splits_backward:
            kinds.append("weight")
        everything = []
        for stage, stream in enumerate(schedule.streams()):
            assert all(i.stage % p == stage for i in stream)  # a chunk runs on its stage
            everything += stream
            for position, instruction in enumerate(stream):  # on a stage: F before B before W
                before = {(i.kind, i.stage, i.microbatch) for i in stream[:position]}
                if instruction.kind == "backward":
                    assert ("forward", instruction.stage, instruction.microbatch) in before
                if instruction.kind == "weight":
                    assert ("backward", instruction.stage, instruction.microbatch) in before
        assert sorted((i.kind, i.stage, i.microbatch) for i in everything) == sorted(
            (kind, c, i) for kind in kinds for c in range(schedule.num_chunks) for i in range(m)
        )
        order = schedule.simulate().order()  # raises on a deadlock
        done = set()
        for instruction in order:
            dependency = instruction.dependency(schedule.num_chunks)
            assert dependency is None or dependency in done
            done.add(instruction)


def test_new_schedules_simulated_bubble_equals_their_formula_for_equal_and_unequal_costs():
    for schedule in _new_schedules():
        p, m, v = schedule.num_stages, schedule.num_microbatches, schedule.virtual_stages
        for forward, backward, weight in COSTS:
            timeline = schedule.simulate(forward, backward, weight)
            work = m * (forward + backward + weight)
            if schedule.splits_backward:
                assert timeline.makespan == pytest.approx(
                    work + (p - 1) * (forward + backward - weight)
                ), schedule
            else:
                assert timeline.makespan == pytest.approx(
                    work + (p - 1) * (forward + backward + weight) / v
                ), schedule
            assert timeline.bubble_fraction == pytest.approx(
                schedule.bubble(forward, backward, weight)
            ), schedule
        assert schedule.bubble_fraction == pytest.approx(
            (p - 1) / (3 * m + p - 1) if schedule.splits_backward else (p - 1) / (v * m + p - 1)
        )


def test_zb_h1_holds_no_more_activations_than_1f1b_at_a_third_of_its_bubble():
    for p, m in GRID:
        if m < p:
            continue
        zb, one = ZeroBubbleH1(p, m), OneFOneB(p, m)
        assert [zb.peak_activations(s) for s in range(p)] == [p] * p
        assert max(zb.peak_activations(s) for s in range(p)) == max(
            one.peak_activations(s) for s in range(p)
        )
        # F = B = W: 1F1B's bubble is (p-1)·3 units, ZB-H1's (p-1)·1
        assert zb.simulate(1, 1, 1).makespan - 3 * m == pytest.approx((p - 1))
        assert one.simulate(1, 1, 1).makespan - 3 * m == pytest.approx(3 * (p - 1))


def test_interleaved_streams_follow_megatron():
    """p = 2, v = 2, m = 4: chunks 0 and 2 on stage 0, 1 and 3 on stage 1; p microbatches per
    chunk at a time; stage 0 warms up with 2(p-1) + (v-1)p = 4 forwards."""
    streams = [
        [f"{i}c{i.stage}" for i in stream]
        for stream in make_schedule("interleaved", 2, 4).streams()
    ]
    assert streams[0] == [
        "F0c0",
        "F1c0",
        "F0c2",
        "F1c2",
        "F2c0",
        "B0c2",
        "F3c0",
        "B1c2",
        "F2c2",
        "B0c0",
        "F3c2",
        "B1c0",
        "B2c2",
        "B3c2",
        "B2c0",
        "B3c0",
    ]
    assert make_schedule("interleaved", 2, 4, virtual_stages=3).num_chunks == 6
    assert make_schedule("zb-h1", 3, 4).streams()[2][:6] == [
        Instruction("forward", 2, 0),
        Instruction("backward", 2, 0),
        Instruction("forward", 2, 1),
        Instruction("backward", 2, 1),
        Instruction("forward", 2, 2),
        Instruction("backward", 2, 2),
    ]


@pytest.mark.parametrize("cls", [GPipe, OneFOneB])
def test_every_stage_runs_each_forward_and_backward_once_forward_first(cls):
    for p, m in GRID:
        schedule = cls(p, m)
        for stage, stream in enumerate(schedule.streams()):
            assert sorted((i.kind, i.microbatch) for i in stream) == sorted(
                [("forward", k) for k in range(m)] + [("backward", k) for k in range(m)]
            )
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


@pytest.mark.parametrize(
    "args, match",
    [
        (
            ("zigzag", 2, 4),
            r"Unknown pipeline schedule 'zigzag'. Received: schedule='zigzag'. "
            r"Use one of \['1f1b', 'gpipe', 'interleaved', 'zb-h1'\]",
        ),
        (("gpipe", 0, 4), r"num_stages must be an int >= 1. Received: num_stages=0"),
        (("1f1b", 2, 0), r"num_microbatches must be an int >= 1. Received: num_microbatches=0"),
        (
            ("interleaved", 4, 6),
            r"'interleaved' schedule needs num_microbatches a multiple of the 4 stages. "
            r"Received: num_microbatches=6 with num_stages=4. Use e.g. \[4, 8, 12\]",
        ),
        (("interleaved", 4, 2), r"a multiple of the 4 stages. Received: num_microbatches=2"),
        (
            ("zb-h1", 4, 3),
            r"'zb-h1' schedule needs num_microbatches at least the 4 stages. Received: "
            r"num_microbatches=3 with num_stages=4. Use e.g. \[4, 5, 6\]",
        ),
        (
            ("1f1b", 2, 4, 2),
            r"virtual_stages applies to schedule='interleaved'. Received: schedule='1f1b', "
            r"virtual_stages=2",
        ),
        (
            ("interleaved", 2, 4, 0),
            r"virtual_stages must be an int >= 1. Received: virtual_stages=0",
        ),
    ],
)
def test_bad_schedule_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        make_schedule(*args)
