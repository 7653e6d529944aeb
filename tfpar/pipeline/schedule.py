"""Pipeline schedules as plain data: what each stage does, in order (no TensorFlow here).

A schedule for ``p`` stages (devices) and ``m`` microbatches yields, per stage, the
stage's instructions: ``Instruction("forward", chunk, microbatch)``,
``Instruction("backward", chunk, microbatch)`` and, for the zero-bubble schedules, which
split the backward pass into its input-gradient part (``"backward"``, B) and its
weight-gradient part, ``Instruction("weight", chunk, microbatch)`` (W). A *chunk* is a
piece of the model: with ``virtual_stages=v`` the model is cut into p·v chunks, and the
schedule places each (`Schedule.stage_of`: chunk c on stage c mod p for interleaved 1F1B);
otherwise chunk = stage. The executor (`executor.py`) runs them in that order on each stage's
device, dispatching on the instruction's kind; the figures below come from the same objects:

- `Schedule.bubble`: the theoretical idle share for given F, B and W costs (GPipe and
  1F1B: (p-1)/(m+p-1); interleaved 1F1B: (p-1)/(v·m+p-1); ZB-H1:
  (p-1)(F+B-W) / (m(F+B+W) + (p-1)(F+B-W))), and `Schedule.bubble_fraction`, the same
  with F = B = W;
- `Schedule.peak_activations`: the most (chunk, microbatch) activations a stage holds at
  once (m for GPipe, min(p-s, m) for 1F1B, p on every stage for ZB-H1);
- `Schedule.simulate`: the timeline the instruction streams give with given
  forward, backward and weight costs, and so the simulated bubble.

Examples:
    >>> s = make_schedule("1f1b", num_stages=2, num_microbatches=3)
    >>> [str(i) for i in s.stage_instructions(1)]
    ['F0', 'B0', 'F1', 'B1', 'F2', 'B2']
    >>> s.peak_activations(0), round(s.bubble_fraction, 3)
    (2, 0.25)
"""

from collections.abc import Iterable
from typing import Any

from tfpar._checks import check_choice
from tfpar.pipeline.simulation import Timeline
from tfpar.pipeline.streams import BACKWARD, FORWARD, WEIGHT, Instruction, Schedule

__all__ = [
    "SCHEDULES",
    "GPipe",
    "Instruction",
    "Interleaved1F1B",
    "OneFOneB",
    "Schedule",
    "Timeline",
    "ZeroBubbleH1",
    "make_schedule",
    "virtual_schedules",
]


class GPipe(Schedule):
    """All forwards, then all backwards (Huang et al., 2019): every stage keeps m activations."""

    name = "gpipe"

    def stage_instructions(self, stage: int) -> Iterable[Instruction]:
        for i in range(self.num_microbatches):
            yield Instruction(FORWARD, stage, i)
        for i in range(self.num_microbatches):
            yield Instruction(BACKWARD, stage, i)


class OneFOneB(Schedule):
    """1F1B, PipeDream-Flush (Narayanan et al., 2021): same bubble as GPipe, fewer activations.

    Stage s runs min(p-s-1, m) warm-up forwards, then alternates one forward
    and one backward, then drains the remaining backwards.
    """

    name = "1f1b"

    def stage_instructions(self, stage: int) -> Iterable[Instruction]:
        m = self.num_microbatches
        warmup = min(self.num_stages - stage - 1, m)
        for i in range(warmup):
            yield Instruction(FORWARD, stage, i)
        for i in range(m - warmup):
            yield Instruction(FORWARD, stage, warmup + i)
            yield Instruction(BACKWARD, stage, i)
        for i in range(m - warmup, m):
            yield Instruction(BACKWARD, stage, i)


class Interleaved1F1B(Schedule):
    """Interleaved 1F1B (Narayanan et al., 2021, as in Megatron-LM): stage s holds v chunks,
    s, s+p, ..., s+(v-1)p, and runs 1F1B over (chunk, microbatch) pairs, p microbatches at a
    time per chunk; the bubble shrinks v-fold to (p-1)/(v·m+p-1), at the cost of v times the
    stage-to-stage transfers and more activations held.

    Stage s warms up with min(2(p-s-1) + (v-1)p, v·m) forwards. Needs m a multiple of p.
    """

    name = "interleaved"
    bubble_formula = "(p-1)/(v·m+p-1)"
    default_virtual_stages = 2

    def __init__(self, num_stages: int, num_microbatches: int, virtual_stages: int = 2) -> None:
        super().__init__(num_stages, num_microbatches, virtual_stages)
        check_microbatches(self.name, num_stages, num_microbatches, multiple=True)

    def _pair(self, stage, index, backward):
        p, v = self.num_stages, self.virtual_stages
        local = (index // p) % v
        chunk = (v - 1 - local if backward else local) * p + stage
        return Instruction(
            BACKWARD if backward else FORWARD, chunk, (index // (p * v)) * p + index % p
        )

    def stage_instructions(self, stage: int) -> Iterable[Instruction]:
        p, v, total = (
            self.num_stages,
            self.virtual_stages,
            self.num_microbatches * self.virtual_stages,
        )
        warmup = min(2 * (p - stage - 1) + (v - 1) * p, total)
        for i in range(warmup):
            yield self._pair(stage, i, backward=False)
        for i in range(total - warmup):
            yield self._pair(stage, warmup + i, backward=False)
            yield self._pair(stage, i, backward=True)
        for i in range(total - warmup, total):
            yield self._pair(stage, i, backward=True)

    def bubble(
        self, forward_cost: float = 1.0, backward_cost: float = 1.0, weight_cost: float = 1.0
    ) -> float:
        p, m, v = self.num_stages, self.num_microbatches, self.virtual_stages
        return (p - 1) / (v * m + p - 1)


class ZeroBubbleH1(Schedule):
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with the backward
    pass split into B (input gradient, on the critical path) and W (weight gradient, which
    nothing waits for). Stage s runs each W s microbatches after its B, so the W passes fill
    the drain's idle time: the bubble is (p-1)(F+B-W) instead of 1F1B's (p-1)(F+B+W), about
    a third with equal costs, while no stage holds more than p microbatches' activations
    (1F1B's most, on its first stage). Needs m >= p.
    """

    name = "zb-h1"
    bubble_formula = "(p-1)/(3m+p-1) with F = B = W"
    splits_backward = True

    def __init__(self, num_stages: int, num_microbatches: int) -> None:
        super().__init__(num_stages, num_microbatches)
        check_microbatches(self.name, num_stages, num_microbatches)

    def stage_instructions(self, stage: int) -> Iterable[Instruction]:
        m = self.num_microbatches
        warmup = min(self.num_stages - stage - 1, m)
        pending = []  # microbatches whose B ran and whose W has not

        def backward(i):
            yield Instruction(BACKWARD, stage, i)
            pending.append(i)
            while len(pending) > stage:
                yield Instruction(WEIGHT, stage, pending.pop(0))

        for i in range(warmup):
            yield Instruction(FORWARD, stage, i)
        for i in range(m - warmup):
            yield Instruction(FORWARD, stage, warmup + i)
            yield from backward(i)
        for i in range(m - warmup, m):
            yield from backward(i)
        for i in list(pending):
            yield Instruction(WEIGHT, stage, i)

    def bubble(
        self, forward_cost: float = 1.0, backward_cost: float = 1.0, weight_cost: float = 1.0
    ) -> float:
        p, m = self.num_stages, self.num_microbatches
        idle = (p - 1) * (forward_cost + backward_cost - weight_cost)
        return idle / (m * (forward_cost + backward_cost + weight_cost) + idle)


def check_microbatches(name, num_stages, num_microbatches, multiple=False):
    """Raises ValueError unless the schedule ``name`` has the microbatches it needs: at least
    one per stage (and, ``multiple``, a multiple of the stages)."""
    if num_microbatches < num_stages or (multiple and num_microbatches % num_stages):
        need = (
            f"a multiple of the {num_stages} stages"
            if multiple
            else f"at least the {num_stages} stages"
        )
        valid = (
            [k * num_stages for k in range(1, 4)]
            if multiple
            else list(range(num_stages, num_stages + 3))
        )
        raise ValueError(
            f"The {name!r} schedule needs num_microbatches {need}. Received: num_microbatches="
            f"{num_microbatches} with num_stages={num_stages}. Use e.g. {valid} "
            "(more microbatches: a smaller bubble)."
        )


SCHEDULES = {cls.name: cls for cls in (GPipe, OneFOneB, Interleaved1F1B, ZeroBubbleH1)}
"""Schedule name -> class."""


def make_schedule(
    name: str, num_stages: int, num_microbatches: int, virtual_stages: int | None = None
) -> Schedule:
    """Returns the schedule called ``name`` (one of `SCHEDULES`); ``virtual_stages`` applies to
    "interleaved" (default 2).

    Raises:
        ValueError: an unknown name, counts below 1, virtual stages for a schedule without
            them, or fewer microbatches than the schedule needs.
    """
    check_choice("schedule", name, sorted(SCHEDULES), what="pipeline schedule")
    cls: Any = SCHEDULES[name]  # each takes (p, m) or, with virtual stages, (p, m, v)
    if cls.default_virtual_stages is not None:
        return cls(
            num_stages,
            num_microbatches,
            cls.default_virtual_stages if virtual_stages is None else virtual_stages,
        )
    if virtual_stages not in (None, 1):
        virtual = " or ".join(f"schedule={n!r}" for n in virtual_schedules())
        raise ValueError(
            f"virtual_stages applies to {virtual}. Received: schedule={name!r}, "
            f"virtual_stages={virtual_stages}. Use {virtual}, or virtual_stages=1."
        )
    return cls(num_stages, num_microbatches)


def virtual_schedules() -> list[str]:
    """The names of the schedules that take virtual stages."""
    return [name for name, cls in SCHEDULES.items() if cls.default_virtual_stages is not None]
