"""Pipeline schedules as plain data: what each stage does, in order (no TensorFlow here).

A schedule for ``p`` stages and ``m`` microbatches yields, per stage, the
stage's instructions: ``Instruction("forward", stage, microbatch)`` and
``Instruction("backward", stage, microbatch)``. The executor (`model.py`)
runs them in that order on each stage's device; the figures below come from
the same objects:

- `Schedule.bubble_fraction`: the theoretical idle share, (p-1)/(m+p-1);
- `Schedule.peak_activations`: the most microbatches whose activations a
  stage holds at once (m for GPipe, min(p-s, m) for 1F1B);
- `Schedule.simulate`: the timeline the instruction streams give with given
  forward and backward costs, and so the simulated bubble.

Example:
    >>> s = make_schedule("1f1b", num_stages=2, num_microbatches=3)
    >>> [str(i) for i in s.stage_instructions(1)]
    ['F0', 'B0', 'F1', 'B1', 'F2', 'B2']
    >>> s.peak_activations(0), round(s.bubble_fraction, 3)
    (2, 0.25)
"""

import dataclasses

from tfpar._checks import check_choice, check_int

__all__ = ["SCHEDULES", "GPipe", "Instruction", "OneFOneB", "Schedule", "Timeline", "make_schedule"]

FORWARD, BACKWARD = "forward", "backward"


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One unit of a stage's work: the forward or backward pass of one microbatch."""

    kind: str
    """"forward" or "backward"."""
    stage: int
    """The stage that runs it."""
    microbatch: int
    """The microbatch it runs on."""

    def __str__(self):
        return f"{self.kind[0].upper()}{self.microbatch}"

    def dependency(self, num_stages):
        """The instruction of another stage that must finish first, or None.

        A forward needs the previous stage's forward of the same microbatch;
        a backward needs the next stage's backward (its output gradient).
        """
        if self.kind == FORWARD:
            return Instruction(FORWARD, self.stage - 1, self.microbatch) if self.stage > 0 else None
        if self.stage < num_stages - 1:
            return Instruction(BACKWARD, self.stage + 1, self.microbatch)
        return None


@dataclasses.dataclass(frozen=True)
class Timeline:
    """The simulated run of a schedule: start and end time of every instruction."""

    spans: dict
    """Instruction -> (start, end)."""
    num_stages: int

    @property
    def makespan(self):
        return max(end for _, end in self.spans.values())

    def busy(self, stage):
        return sum(end - start for i, (start, end) in self.spans.items() if i.stage == stage)

    @property
    def bubble_fraction(self):
        """Idle share of the stages over the makespan (averaged over stages)."""
        total = self.makespan * self.num_stages
        return 1 - sum(self.busy(s) for s in range(self.num_stages)) / total

    def order(self):
        """All instructions by start time (then stage): a valid global issue order."""
        return sorted(self.spans, key=lambda i: (self.spans[i][0], i.stage))


class Schedule:
    """The instruction streams of a pipeline schedule; subclasses define `stage_instructions`."""

    name = None

    def __init__(self, num_stages, num_microbatches):
        check_int("num_stages", num_stages, 1)
        check_int("num_microbatches", num_microbatches, 1)
        self.num_stages = num_stages
        self.num_microbatches = num_microbatches

    def stage_instructions(self, stage):
        """Yields stage ``stage``'s instructions in the order it runs them."""
        raise NotImplementedError

    def streams(self):
        """Per stage, the list of its instructions."""
        return [list(self.stage_instructions(s)) for s in range(self.num_stages)]

    @property
    def bubble_fraction(self):
        """Theoretical idle share with equal stages: (p-1)/(m+p-1)."""
        p, m = self.num_stages, self.num_microbatches
        return (p - 1) / (m + p - 1)

    def peak_activations(self, stage):
        """Most microbatches whose forward ran on ``stage`` and whose backward has not yet."""
        live = peak = 0
        for instruction in self.stage_instructions(stage):
            live += 1 if instruction.kind == FORWARD else -1
            peak = max(peak, live)
        return peak

    def simulate(self, forward_cost=1.0, backward_cost=1.0):
        """Runs the streams on an ideal clock and returns the `Timeline`.

        Each stage runs its instructions in order, each as soon as the stage
        is free and its dependency (`Instruction.dependency`) has ended.

        Raises:
            RuntimeError: if the streams deadlock (a schedule bug).
        """
        streams = self.streams()
        position = [0] * self.num_stages
        free_at = [0.0] * self.num_stages
        spans = {}
        remaining = sum(len(s) for s in streams)
        while remaining:
            progressed = False
            for stage, stream in enumerate(streams):
                if position[stage] == len(stream):
                    continue
                instruction = stream[position[stage]]
                dependency = instruction.dependency(self.num_stages)
                if dependency is not None and dependency not in spans:
                    continue
                ready = spans[dependency][1] if dependency is not None else 0.0
                start = max(free_at[stage], ready)
                cost = forward_cost if instruction.kind == FORWARD else backward_cost
                spans[instruction] = (start, start + cost)
                free_at[stage] = start + cost
                position[stage] += 1
                remaining -= 1
                progressed = True
            if not progressed:
                raise RuntimeError(f"{self.name} deadlocks at {position} (a schedule bug)")
        return Timeline(spans, self.num_stages)

    def __repr__(self):
        return f"{type(self).__name__}(num_stages={self.num_stages}, num_microbatches={self.num_microbatches})"


class GPipe(Schedule):
    """All forwards, then all backwards (Huang et al., 2019): every stage keeps m activations."""

    name = "gpipe"

    def stage_instructions(self, stage):
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

    def stage_instructions(self, stage):
        m = self.num_microbatches
        warmup = min(self.num_stages - stage - 1, m)
        for i in range(warmup):
            yield Instruction(FORWARD, stage, i)
        for i in range(m - warmup):
            yield Instruction(FORWARD, stage, warmup + i)
            yield Instruction(BACKWARD, stage, i)
        for i in range(m - warmup, m):
            yield Instruction(BACKWARD, stage, i)


SCHEDULES = {GPipe.name: GPipe, OneFOneB.name: OneFOneB}
"""Schedule name -> class."""


def make_schedule(name, num_stages, num_microbatches):
    """Returns the schedule called ``name`` ("gpipe" or "1f1b").

    Raises:
        ValueError: an unknown name, or counts below 1.
    """
    check_choice("schedule", name, sorted(SCHEDULES), what="pipeline schedule")
    return SCHEDULES[name](num_stages, num_microbatches)
