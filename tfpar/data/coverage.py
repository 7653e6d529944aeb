"""`check_coverage`: every worker's shard of one epoch read through the code `distribute` uses,
against the examples of the input: missing, duplicated and padded examples, steps per worker."""

import collections
import dataclasses
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from tfpar._checks import check_int
from tfpar._keras import tf
from tfpar.data.source import open_source, read_files
from tfpar.data.worker_input import InputConfig, worker_dataset

__all__ = ["CoverageReport", "check_coverage"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoverageReport:
    """What every worker read in one epoch, against the examples of the input."""

    expected: collections.Counter
    """Example key -> times it occurs in the input."""
    seen: collections.Counter
    """Example key -> times a worker read it (padding excluded)."""
    steps_per_worker: tuple
    """Number of global steps each worker's pipeline yields (with ``resize``: in its phase, the
    phases' workers one after the other)."""
    padded: int
    """Padding examples (sample weight 0) across all workers."""
    phases: tuple = ()
    """With ``resize``: ``(first step, number of workers)`` of each phase of the epoch."""

    @property
    def missing(self):
        """Keys seen fewer times than they occur in the input."""
        return sorted(k for k in self.expected if self.seen[k] < self.expected[k])

    @property
    def duplicated(self):
        """Keys seen more often than they occur in the input (or not in it)."""
        return sorted(k for k in self.seen if self.seen[k] > self.expected[k])

    @property
    def exactly_once(self):
        """Every example seen exactly once and every worker ran the same steps."""
        steps, same = list(self.steps_per_worker), True
        # the workers of a phase ran the same steps
        for _, workers in self.phases or ((0, len(steps)),):
            same, steps = same and len(set(steps[:workers])) == 1, steps[workers:]
        return self.seen == self.expected and same

    def __str__(self):
        return (
            f"{sum(self.expected.values())} examples, {sum(self.seen.values())} "
            f"seen, {len(self.missing)} missing, {len(self.duplicated)} "
            f"duplicated, {self.padded} padding; steps per worker "
            f"{list(self.steps_per_worker)}"
        )


def _example_key(example):
    return tuple(a.tobytes() for a in tf.nest.flatten(example))


def check_coverage(
    source: Any,
    *,
    num_workers: int,
    replicas_per_worker: int = 1,
    key: Callable[[tuple], Hashable] | None = None,
    epoch: int = 0,
    resize: Mapping[int, int] | None = None,
    **options: Any,
) -> CoverageReport:
    """Reads every worker's shard for one epoch and reports coverage.

    Builds each worker's pipeline with `worker_dataset`, the code ``fit``
    uses, so the report describes real training input. With ``resize``, the
    epoch runs as an elastic job resumed with other numbers of workers runs
    it: from each of its steps on, the given number of workers read the rest
    of the epoch, as a resume there does (the steps before it skipped).

    Args:
        source: as for `distribute`.
        num_workers: number of workers to simulate (from step 0).
        replicas_per_worker: replicas each worker feeds.
        key: function from one example (a tuple of numpy values, without the
            padding weight) to a hashable key; default: its bytes.
        epoch: which epoch (its shuffled order).
        resize: global step -> number of workers from that step on.
        **options: `InputConfig` fields, ``global_batch_size`` included.

    Returns:
        A `CoverageReport`.

    Examples:
        >>> report = check_coverage(ds, num_workers=3, resize={7: 2},  # doctest: +SKIP
        ...                         global_batch_size=48, shuffle_buffer=480, seed=3)
        >>> report.exactly_once
        True
    """
    config = InputConfig(**options)
    phases = _phases(num_workers, resize)
    key = key or _example_key
    whole, files = open_source(source)
    if whole is None:
        whole = read_files(files, config.reader)
    expected = collections.Counter(
        key(
            tuple(tf.nest.map_structure(lambda t: t.numpy(), e))
            if isinstance(e, tuple)
            else (e.numpy(),)
        )
        for e in whole
    )
    seen: collections.Counter = collections.Counter()
    steps, padded = [], 0
    for number, (first, workers) in enumerate(phases):
        end = phases[number + 1][0] if number + 1 < len(phases) else None
        for index in range(workers):
            dataset, plan = worker_dataset(
                source,
                config,
                num_workers=workers,
                worker_index=index,
                num_replicas=workers * replicas_per_worker,
                epoch=epoch,
            )
            dataset = dataset.skip(first * replicas_per_worker)
            if end is not None:
                dataset = dataset.take((end - first) * replicas_per_worker)
            batches = 0
            for batch in dataset.as_numpy_iterator():
                step = first + batches // replicas_per_worker
                batches += 1
                padded += _count(batch, plan, step, len(whole.element_spec), key, seen)
            steps.append(batches // replicas_per_worker)
    return CoverageReport(
        expected=expected,
        seen=seen,
        steps_per_worker=tuple(steps),
        padded=padded,
        phases=tuple(phases) if resize else (),
    )


def _phases(num_workers, resize):
    """``[(first step, workers), ...]``, checked."""
    check_int("num_workers", num_workers, 1)
    if resize is None:
        return [(0, num_workers)]
    if not isinstance(resize, Mapping):
        raise TypeError(
            f"resize must be a dict from a global step to a number of workers. Received: "
            f"resize={resize!r}. For example resize={{7: 2}}: 2 workers from step 7 on."
        )
    for step, workers in resize.items():
        check_int("resize step", step, 1)
        check_int(f"resize[{step}]", workers, 1)
    return [(0, num_workers), *sorted(resize.items())]


def _count(batch, plan, step, fields, key, seen):
    """Adds one per-replica batch's real examples to ``seen``; returns its padding rows."""
    parts = batch if isinstance(batch, tuple) else (batch,)
    weights = parts[-1] if plan.padded else None
    if plan.padded and fields == 2:
        parts = parts[:-1]
    elif plan.padded:  # the user's own weights, as given: without the padded step's scale
        scale = plan.step_weight(step)
        parts = (*parts[:-1], (parts[-1] / scale).astype(parts[-1].dtype))
    padded = 0
    for row in range(len(tf.nest.flatten(parts)[0])):
        if weights is not None and weights[row] == 0:
            padded += 1
            continue
        seen[key(tuple(tf.nest.map_structure(lambda a: a[row], parts)))] += 1
    return padded
