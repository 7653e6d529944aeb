"""``tfpar launch --min-workers/--max-workers [--host-discovery-script|--host-discovery-file]``: a
local job that goes on when it loses workers and grows back when capacity returns, as torchrun's
``--nnodes MIN:MAX`` does: every change restarts all workers, on fresh ports, and
`tfpar.callbacks.FaultTolerance` resumes them from its last backup with the new world size
(`tfpar.data.distribute` re-deals the rest of the epoch over them, every example once).

- A worker that fails counts against its slot (`tfpar.launch.elastic.membership.Membership`); the
  job restarts with the slots it has, dropping one that failed more than ``--max-restarts`` times.
- A host that leaves discovery stops the job at once, which restarts without its workers. Discovery
  that fails or prints what does not parse while the job runs is said and asked again: the job goes
  on.
- New capacity is taken at the next backup: the launcher asks for it (`GROW_REQUEST`),
  FaultTolerance's chief marks it and waits to be stopped, so no step is trained twice (the last
  backup of training is not one: the job ends instead); a command that makes no backup is not grown
  (it would start over).
- The global batch: each worker is told the number of workers it was divided for (``--max-workers``,
  else the most the job has had) and ``--elastic-batch``
  (`tfpar._tasks.elastic_batch.ElasticBatch`), by which `DataParallel` computes each replica's batch
  in micro-batches on fewer workers.
- Fewer than ``--min-workers``: the launcher waits for discovery to list enough, up to
  ``elastic_timeout`` seconds, then fails.

Across hosts (``--nnodes MIN:MAX``), each host runs an agent instead
(`tfpar.launch.elastic.agent.run_elastic_nodes`): the rendezvous
(`tfpar.launch.rendezvous.elastic`) decides the rounds, the agent runs its host's workers in each.

Pure Python, as the rest of the launcher.
"""

import dataclasses
import itertools
import tempfile
import time

from tfpar._local.processes import LaunchError
from tfpar._tasks.elastic_batch import ElasticBatch
from tfpar._tasks.env import ELASTIC_VARIABLE, RESTART_VARIABLE, STATE_VARIABLE
from tfpar.launch.api import local_job
from tfpar.launch.elastic.discovery import DISCOVERY_PERIOD_SECONDS, Discovery
from tfpar.launch.elastic.membership import GrowRequest, Membership, MembershipChange
from tfpar.launch.runner import LaunchOptions, run_job, warn_without_backup

__all__ = ["run_elastic"]


def run_elastic(
    command: list,
    options: LaunchOptions,
    discovery: Discovery,
    membership: Membership,
    elastic_timeout: float = 600.0,
    batch: str = "accumulate",
) -> int:
    """Runs ``command`` as an elastic local job until it succeeds; returns 0. ``batch``: one of
    `tfpar._tasks.elastic_batch.ELASTIC_BATCHES`.

    Raises:
        LaunchError: fewer than ``min_workers`` for ``elastic_timeout`` seconds (discovery that kept
            failing or printing what is not ``host:slots`` included), or interrupted.
    """
    start, warned = time.monotonic(), False
    with tempfile.TemporaryDirectory(prefix="tfpar-launch-") as state:
        for attempt in itertools.count():
            slots = _enough_slots(discovery, membership, elastic_timeout, options)
            change = membership.change(slots)
            if change:
                options.say(f"{change} at {time.monotonic() - start:.1f} s")
            cluster, tasks = local_job({"worker": len(slots)})
            watch = _Watch(discovery, membership, state, options)
            told = ElasticBatch(membership.reference, membership.min_workers, batch)
            run = dataclasses.replace(
                options,
                watch=watch,
                env={
                    **(options.env or {}),
                    RESTART_VARIABLE: str(attempt),
                    STATE_VARIABLE: state,
                    ELASTIC_VARIABLE: told.to_env(),
                },
            )
            try:
                return run_job(command, cluster, tasks, run)
            except MembershipChange as reason:
                options.say(f"{reason}; restarting the workers")
            except LaunchError as error:
                if error.task is None:  # interrupted
                    raise
                dropped = membership.failed(error.task.task_index)
                options.say(
                    f"{error}" + (f"; {dropped}" if dropped else "; restarting the workers")
                )
                warned = warned or warn_without_backup(state, options)
    raise AssertionError("itertools.count() ended")


def _enough_slots(discovery, membership, elastic_timeout, options):
    """The slots to run on, once there are at least ``min_workers`` (waiting up to
    ``elastic_timeout``)."""
    deadline, said, error = time.monotonic() + elastic_timeout, False, None
    while True:
        try:
            slots, error = membership.slots(discovery.hosts()), None
        except ValueError as failed:
            # caught half-written, or failing once: asked again until the deadline
            slots, error = [], failed
        if len(slots) >= membership.min_workers:
            return slots
        if time.monotonic() >= deadline:
            raise LaunchError(
                f"{len(slots)} worker slot(s) for {elastic_timeout:g} s, fewer than --min-workers "
                f"{membership.min_workers}: {error or discovery.source + ' lists too few'} (or "
                "their workers failed too often)"
            )
        if not said:
            options.say(
                f"{len(slots)} worker slot(s), fewer than --min-workers {membership.min_workers}; "
                f"waiting up to {elastic_timeout:g} s for {discovery.source} to list more"
            )
            said = True
        time.sleep(DISCOVERY_PERIOD_SECONDS)


class _Watch:
    """Called at each look of the launcher at a running job. Every ``DISCOVERY_PERIOD_SECONDS`` it
    asks discovery: a member's host gone stops the job at once (MembershipChange); more slots ask
    FaultTolerance's chief for a backup to grow from (`GROW_REQUEST`), and the job is stopped as
    soon as that backup is marked."""

    def __init__(self, discovery, membership, state, options):
        self.discovery, self.membership, self.options = discovery, membership, options
        self.next_look = time.monotonic() + DISCOVERY_PERIOD_SECONDS
        self.grow = GrowRequest(state, options.say)  # a new job: nobody waits
        self.said_error = None

    def __call__(self):
        if self.grow.backed_up():
            raise MembershipChange(
                f"{self.more} more worker slot(s) and a backup to start them from"
            )
        if time.monotonic() < self.next_look:
            return
        self.next_look = time.monotonic() + DISCOVERY_PERIOD_SECONDS
        members = self.membership.members
        try:
            hosts = self.discovery.hosts()
        except ValueError as error:
            # a file caught half-written, a script that failed once: the job goes on
            if str(error) != self.said_error:
                self.options.say(
                    f"{error}; the job goes on with its {len(members)} worker(s), asking again"
                )
                self.said_error = str(error)
            return
        self.said_error = None
        slots = self.membership.slots(hosts)
        gone = [s for s in members if s not in slots]
        if gone:
            raise MembershipChange(f"{', '.join(gone)} left {self.discovery.source}")
        self.more = len(slots) - len(members)
        if self.more <= 0:
            self.grow.withdraw()
        else:
            self.grow.ask(f"{self.more} more worker slot(s) in {self.discovery.source}")
