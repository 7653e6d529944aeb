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

import dataclasses
from collections.abc import Iterable
from typing import Any

from tfpar._checks import check_choice, check_int
from tfpar.pipeline.simulation import Timeline, simulate

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

FORWARD, BACKWARD, WEIGHT = "forward", "backward", "weight"


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One unit of a stage's work: the forward, backward or (zero-bubble) weight-gradient pass
    of one microbatch through one chunk of the model."""

    kind: str
    """"forward", "backward" (with "weight": the input gradient only) or "weight"."""
    stage: int
    """The chunk it runs (the stage, without virtual stages; it runs on stage chunk mod p)."""
    microbatch: int
    """The microbatch it runs on."""

    def __str__(self):
        return f"{self.kind[0].upper()}{self.microbatch}"

    def dependency(self, num_chunks: int) -> "Instruction | None":
        """The instruction of another chunk that must finish first, or None.

        A forward needs the previous chunk's forward of the same microbatch; a backward
        needs the next chunk's backward (its output gradient); a weight pass needs only its
        own backward, which comes first in its stage's stream.
        """
        if self.kind == FORWARD:
            return Instruction(FORWARD, self.stage - 1, self.microbatch) if self.stage > 0 else None
        if self.kind == BACKWARD and self.stage < num_chunks - 1:
            return Instruction(BACKWARD, self.stage + 1, self.microbatch)
        return None


class Schedule:
    """The instruction streams of a pipeline schedule; subclasses define `stage_instructions`.

    A schedule declares what it can do, and everything else reads it from here: the executor,
    ``Pipeline``, ``tfpar tune``'s search space and ``tfpar report``'s figures. Adding one is a
    subclass in this module (its streams, `stage_of` if it places chunks otherwise, the class
    attributes below) registered in `SCHEDULES`, and its test.
    """

    name: str | None = None
    bubble_formula = "(p-1)/(m+p-1)"
    """`bubble_fraction` as a formula, for summaries."""
    splits_backward = False
    """Whether the backward pass is split into "backward" (input gradient) and "weight"."""
    default_virtual_stages: int | None = None
    """The virtual stages it runs with by default; None: it takes none (one chunk per stage)."""

    # virtual_stages: Interleaved1F1B's
    def __init__(self, num_stages: int, num_microbatches: int, virtual_stages: int = 1) -> None:
        check_int("num_stages", num_stages, 1)
        check_int("num_microbatches", num_microbatches, 1)
        check_int("virtual_stages", virtual_stages, 1)
        self.num_stages = num_stages
        self.num_microbatches = num_microbatches
        self.virtual_stages = virtual_stages

    @property
    def num_chunks(self):
        """The pieces the model is cut into: p·v."""
        return self.num_stages * self.virtual_stages

    def stage_of(self, chunk: int) -> int:
        """The stage (device) chunk ``chunk`` runs on: chunk mod p, so that stage s holds chunks s,
        s+p, ... (a schedule with another placement overrides this)."""
        return chunk % self.num_stages

    def stage_instructions(self, stage: int) -> Iterable[Instruction]:
        """Yields stage ``stage``'s instructions in the order it runs them."""
        raise NotImplementedError

    def streams(self) -> list[list[Instruction]]:
        """Per stage, the list of its instructions."""
        return [list(self.stage_instructions(s)) for s in range(self.num_stages)]

    def bubble(
        self, forward_cost: float = 1.0, backward_cost: float = 1.0, weight_cost: float = 1.0
    ) -> float:
        """Theoretical idle share of the stages with these costs of a whole stage's forward,
        input-gradient and weight-gradient passes (equal stages): (p-1)/(m+p-1) here."""
        p, m = self.num_stages, self.num_microbatches
        return (p - 1) / (m + p - 1)

    @property
    def bubble_fraction(self) -> float:
        """`bubble` with the forward, input-gradient and weight-gradient passes equally costly."""
        return self.bubble()

    def peak_activations(self, stage: int) -> int:
        """Most (chunk, microbatch) pairs whose forward ran on ``stage`` and whose backward (the
        weight pass, where it is split) has not yet: each holds its chunk's activations."""
        release = WEIGHT if self.splits_backward else BACKWARD
        live = peak = 0
        for instruction in self.stage_instructions(stage):
            live += 1 if instruction.kind == FORWARD else -1 if instruction.kind == release else 0
            peak = max(peak, live)
        return peak

    def cost(
        self,
        instruction: Instruction,
        forward_cost: float = 1.0,
        backward_cost: float = 1.0,
        weight_cost: float = 0.0,
    ) -> float:
        """The time of one instruction: a chunk is 1/v of a stage; an unsplit backward pass
        computes both gradients."""
        if instruction.kind == FORWARD:
            cost = forward_cost
        elif instruction.kind == WEIGHT:
            cost = weight_cost
        else:
            cost = backward_cost + (0.0 if self.splits_backward else weight_cost)
        return cost / self.virtual_stages

    def simulate(
        self, forward_cost: float = 1.0, backward_cost: float = 1.0, weight_cost: float = 0.0
    ) -> Timeline:
        """Runs the streams on an ideal clock and returns the `Timeline` (`simulation.simulate`)."""
        return simulate(self, forward_cost, backward_cost, weight_cost)

    def __repr__(self):
        virtual = f", virtual_stages={self.virtual_stages}" if self.virtual_stages > 1 else ""
        return (
            f"{type(self).__name__}(num_stages={self.num_stages}, "
            f"num_microbatches={self.num_microbatches}{virtual})"
        )


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
