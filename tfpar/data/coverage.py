"""`check_coverage`: every worker's shard of one epoch read through the code `distribute` uses,
against the examples of the input: missing, duplicated and padded examples, steps per worker."""

import collections
import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

from tfpar._keras import tf
from tfpar.data.sharding import InputConfig, worker_dataset
from tfpar.data.source import open_source, read_files

__all__ = ["CoverageReport", "check_coverage"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoverageReport:
    """What every worker read in one epoch, against the examples of the input."""

    expected: collections.Counter
    """Example key -> times it occurs in the input."""
    seen: collections.Counter
    """Example key -> times a worker read it (padding excluded)."""
    steps_per_worker: tuple
    """Number of global steps each worker's pipeline yields."""
    padded: int
    """Padding examples (sample weight 0) across all workers."""

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
        return self.seen == self.expected and len(set(self.steps_per_worker)) == 1

    def __str__(self):
        return (
            f"{sum(self.expected.values())} examples, {sum(self.seen.values())} "
            f"seen, {len(self.missing)} missing, {len(self.duplicated)} "
            f"duplicated, {self.padded} padding; steps per worker "
            f"{list(self.steps_per_worker)}"
        )


def _example_key(example):
    return tuple(a.tobytes() for a in tf.nest.flatten(example))


def check_coverage(source: Any, *, num_workers: int, replicas_per_worker: int = 1,
                   key: Callable[[tuple], Hashable] | None = None, **options: Any) -> CoverageReport:
    """Reads every worker's shard for one epoch and reports coverage.

    Builds each worker's pipeline with `worker_dataset`, the code ``fit``
    uses, so the report describes real training input.

    Args:
        source: as for `distribute`.
        num_workers: number of workers to simulate.
        replicas_per_worker: replicas each worker feeds.
        key: function from one example (a tuple of numpy values, without the
            padding weight) to a hashable key; default: its bytes.
        **options: `InputConfig` fields, ``global_batch_size`` included.

    Returns:
        A `CoverageReport`.
    """
    config = InputConfig(**options)
    key = key or _example_key
    whole, files = open_source(source)
    if whole is None:
        whole = read_files(files, config.reader)
    expected = collections.Counter(
        key(tuple(tf.nest.map_structure(lambda t: t.numpy(), e)) if isinstance(e, tuple)
            else (e.numpy(),))
        for e in whole
    )
    seen: collections.Counter = collections.Counter()
    steps, padded = [], 0
    for index in range(num_workers):
        dataset, plan = worker_dataset(
            source, config, num_workers=num_workers, worker_index=index,
            num_replicas=num_workers * replicas_per_worker,
        )
        batches = 0
        for batch in dataset.as_numpy_iterator():
            batches += 1
            parts = batch if isinstance(batch, tuple) else (batch,)
            weights = parts[-1] if plan.padded else None
            if plan.padded and len(whole.element_spec) == 2:
                parts = parts[:-1]
            elif plan.padded:  # the user's own weights, as given: without the padded step's scale
                scale = plan.step_weight((batches - 1) // plan.replicas_per_worker)
                parts = (*parts[:-1], (parts[-1] / scale).astype(parts[-1].dtype))
            for row in range(len(tf.nest.flatten(parts)[0])):
                if weights is not None and weights[row] == 0:
                    padded += 1
                    continue
                seen[key(tuple(tf.nest.map_structure(lambda a: a[row], parts)))] += 1
        steps.append(batches // replicas_per_worker)
    return CoverageReport(expected=expected, seen=seen, steps_per_worker=tuple(steps), padded=padded)
