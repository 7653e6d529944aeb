"""A schedule's instructions and what its streams give (no TensorFlow): `Instruction`, one unit
of a stage's work, and `Schedule`, the base of every schedule in `schedule.py` (their table,
`SCHEDULES`): the streams, where each chunk runs, and the figures read from them (the bubble,
the activations a stage holds, an instruction's cost, the simulated run)."""

import dataclasses
from collections.abc import Iterable

from tfpar._checks import check_int
from tfpar.pipeline.simulation import Timeline, simulate

__all__ = ["BACKWARD", "FORWARD", "WEIGHT", "Instruction", "Schedule"]

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
    subclass in `schedule.py` (its streams, `stage_of` if it places chunks otherwise, the class
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
