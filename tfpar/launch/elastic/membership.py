"""Which workers an elastic job has: its slots, less those dropped for failing, the line that says
who left and joined, and the request to grow the job at its next backup (the launcher's side of
`tfpar._tasks.env.GROW_REQUEST`). Pure Python."""

import os
from collections import Counter

from tfpar._checks import check_int, check_number
from tfpar._tasks.env import BACKUP_MARK, FAULT_TOLERANCE_MARK, GROW_REQUEST

__all__ = ["GrowRequest", "Membership", "MembershipChange", "change_line"]


class MembershipChange(Exception):
    """Raised inside the launcher to stop a running job whose workers must change."""


class Membership:
    """Which slots the job has: the discovered ones, less those dropped, at most ``max_workers``."""

    def __init__(self, min_workers: int, max_workers: int | None, max_restarts: int) -> None:
        check_int("min_workers", min_workers, 1, " (the fewest workers the job trains with)")
        check_number(
            "max_workers",
            max_workers,
            minimum=1,
            integer=True,
            allow_none=True,
            hint=" (the most workers the job trains with)",
        )
        if max_workers is not None and min_workers > max_workers:
            raise ValueError(
                f"min_workers must not exceed max_workers. Received: --min-workers {min_workers} "
                f"--max-workers {max_workers}."
            )
        check_int(
            "max_restarts", max_restarts, 0, " (failures of one worker's slot before it is dropped)"
        )
        self.min_workers, self.max_workers, self.max_restarts = (
            min_workers,
            max_workers,
            max_restarts,
        )
        self.failures: Counter = Counter()
        self.dropped: set = set()
        self.members: list = []
        """The slots of the running (or last) job, worker i on slot i."""
        self.largest = 0
        """The most workers the job has run with."""

    @property
    def reference(self) -> int:
        """The number of workers the global batch is divided for (`ElasticBatch`): ``max_workers``,
        else the most the job has run with."""
        return self.max_workers if self.max_workers is not None else max(self.largest, 1)

    def slots(self, hosts: dict[str, int]) -> list[str]:
        """The slots a job would have with ``hosts``; forgets the drops of hosts no longer
        listed."""
        listed = [f"{host} slot {i}" for host, count in hosts.items() for i in range(count)]
        self.dropped &= set(listed)
        self.failures = Counter({s: n for s, n in self.failures.items() if s in listed})
        usable = [s for s in listed if s not in self.dropped]
        return usable[: self.max_workers] if self.max_workers is not None else usable

    def failed(self, worker: int) -> str | None:
        """Counts a failure of worker ``worker``; returns a message if its slot is dropped for
        it."""
        slot = self.members[worker]
        self.failures[slot] += 1
        if self.failures[slot] > self.max_restarts:
            self.dropped.add(slot)
            return (
                f"{slot} dropped: its worker failed {self.failures[slot]} time(s), more than "
                f"--max-restarts {self.max_restarts}"
            )
        return None

    def change(self, slots: list[str]) -> str | None:
        """Adopts ``slots``; returns the line that says who left and joined, or None if the same."""
        before, self.members = self.members, list(slots)
        self.largest = max(self.largest, len(slots))
        return change_line(before, slots, len(slots))


def change_line(before: list, after: list, world_size: int, unit: str = "workers") -> str | None:
    """The line that says a job's members went from ``before`` to ``after`` (``unit``: what they
    are), who left and joined, and the new world size; None if they are the same."""
    if before == after:
        return None
    left = [s for s in before if s not in after]
    joined = [s for s in after if s not in before]
    parts = [f"left: {', '.join(left)}"] if left else []
    parts += [f"joined: {', '.join(joined)}"] if joined and before else []
    return (
        (
            f"{unit} {len(before)} -> {len(after)}"
            if before
            else f"{len(after)} {unit.rstrip('s')}(s)"
        )
        + (f" ({'; '.join(parts)})" if parts else "")
        + f"; world size {world_size}"
    )


class GrowRequest:
    """An elastic launch's request to FaultTolerance's chief, whose launch folder is ``state``, for
    a backup to grow the job from (`GROW_REQUEST`): after its next backup the chief marks it
    (`BACKUP_MARK`) and waits to be stopped. Made with none standing; ``say`` prints the launcher's
    lines."""

    def __init__(self, state: str, say) -> None:
        self.state, self.say = state, say
        self.requested: float | None = None
        """The request's time, once written."""
        self.said_no_backup = False
        self.withdraw()

    def ask(self, what: str) -> None:
        """Asks for the backup, once, saying ``what`` came; a command that makes no FaultTolerance
        backup is not asked (a restart would start training over), which is said once."""
        if self.requested is not None:
            return
        if not os.path.exists(os.path.join(self.state, FAULT_TOLERANCE_MARK)):
            if not self.said_no_backup:
                self.say(
                    "not growing: the command makes no tfpar.callbacks.FaultTolerance backup, so "
                    "a restart would start training over"
                )
                self.said_no_backup = True
            return
        request = os.path.join(self.state, GROW_REQUEST)
        with open(request, "w"):
            pass
        self.requested = os.path.getmtime(request)
        self.say(f"{what}; growing the job after its next backup")

    def backed_up(self) -> bool:
        """Whether the chief has marked a backup since the request (False with none standing)."""
        mark = os.path.join(self.state, BACKUP_MARK)
        return (
            self.requested is not None
            and os.path.exists(mark)
            and os.path.getmtime(mark) >= self.requested
        )

    def withdraw(self) -> None:
        """Removes the request: the chief stops waiting."""
        try:
            os.remove(os.path.join(self.state, GROW_REQUEST))
        except FileNotFoundError:
            pass
        self.requested = None
