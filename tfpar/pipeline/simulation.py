"""A schedule's run on an ideal clock: each stage runs its instructions in order, each as soon as
the stage is free and its dependency has ended (no TensorFlow). `Schedule.simulate` returns it."""

import dataclasses
from typing import Any

__all__ = ["Timeline", "simulate"]


@dataclasses.dataclass(frozen=True)
class Timeline:
    """The simulated run of a schedule: start and end time of every instruction."""

    spans: dict
    """Instruction -> (start, end)."""
    num_stages: int
    stage_of: object = None
    """Chunk -> the stage it runs on (`Schedule.stage_of`); default: chunk mod num_stages."""

    def _stage(self, chunk):
        return self.stage_of(chunk) if self.stage_of is not None else chunk % self.num_stages

    @property
    def makespan(self) -> float:
        return max(end for _, end in self.spans.values())

    def busy(self, stage: int) -> float:
        """The time stage ``stage`` computes (all its chunks)."""
        return sum(
            end - start for i, (start, end) in self.spans.items() if self._stage(i.stage) == stage
        )

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the stages over the makespan (averaged over stages)."""
        total = self.makespan * self.num_stages
        return 1 - sum(self.busy(s) for s in range(self.num_stages)) / total

    def order(self) -> list:
        """All instructions by start time (then stage): a valid global issue order."""
        return sorted(self.spans, key=lambda i: (self.spans[i][0], i.stage))


def simulate(
    schedule: Any, forward_cost: float = 1.0, backward_cost: float = 1.0, weight_cost: float = 0.0
) -> Timeline:
    """Runs the streams on an ideal clock and returns the `Timeline`.

    Each stage runs its instructions in order, each as soon as the stage
    is free and its dependency (`Instruction.dependency`) has ended. The costs are
    a whole stage's (see `Schedule.cost`).

    Raises:
        RuntimeError: if the streams deadlock (a schedule bug).
    """
    streams = schedule.streams()
    position = [0] * schedule.num_stages
    free_at = [0.0] * schedule.num_stages
    spans: dict = {}
    remaining = sum(len(s) for s in streams)
    while remaining:
        progressed = False
        for stage, stream in enumerate(streams):
            if position[stage] == len(stream):
                continue
            instruction = stream[position[stage]]
            dependency = instruction.dependency(schedule.num_chunks)
            if dependency is not None and dependency not in spans:
                continue
            ready = spans[dependency][1] if dependency is not None else 0.0
            start = max(free_at[stage], ready)
            cost = schedule.cost(instruction, forward_cost, backward_cost, weight_cost)
            spans[instruction] = (start, start + cost)
            free_at[stage] = start + cost
            position[stage] += 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise RuntimeError(f"{schedule.name} deadlocks at {position} (a schedule bug)")
    return Timeline(spans, schedule.num_stages, schedule.stage_of)
