"""Where examples come from: a dataset, a function returning one, or files; and how many there are.

Files are counted once per job: with several workers (processes) each counts its share of the
files and the counts are summed over the workers in one collective, so start-up does not grow
with the number of workers and every worker plans with the same counts.
"""

import dataclasses
import logging
import os
from typing import Any

import numpy as np

from tfpar._keras import tf
from tfpar._parallelism import sum_over_workers
from tfpar._topology import topology_of

__all__ = ["Sizes", "as_files", "count", "measure", "open_source", "read_files"]

_log = logging.getLogger("tfpar.data")


def as_files(source: Any) -> list[str] | None:
    if isinstance(source, (str, os.PathLike)):
        return [os.fspath(source)]
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("The list of input files is empty. Received: [].")
        if all(isinstance(f, (str, os.PathLike)) for f in source):
            return [os.fspath(f) for f in source]
    return None


def open_source(source: Any) -> tuple[Any, list[str] | None]:
    """Returns (dataset or None, files or None)."""
    files = as_files(source)
    if files is not None:
        missing = [f for f in files if not tf.io.gfile.exists(f)]
        if missing:
            raise ValueError(
                f"{len(missing)} of the {len(files)} input files do not exist: {missing[:5]}"
                f"{' ...' if len(missing) > 5 else ''}. Received: source={files[:5]}"
                f"{' ...' if len(files) > 5 else ''}. Check the paths (every worker reads them)."
            )
        return None, files
    if isinstance(source, tf.data.Dataset):
        return source, None
    if callable(source):
        dataset = source()
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(
                "A dataset function must return a tf.data.Dataset. Received: "
                f"{type(dataset).__name__} from {source!r}."
            )
        return dataset, None
    raise TypeError(
        "The input must be a tf.data.Dataset, a function returning one, or a "
        f"list of file names. Received: {type(source).__name__}."
    )


def read_files(files: Any, reader: Any) -> Any:
    reader = reader or tf.data.TFRecordDataset
    names = tf.data.Dataset.from_tensor_slices(list(files))
    return names.interleave(
        reader,
        cycle_length=min(len(files), 4),
        deterministic=True,
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def count(dataset: Any) -> int | None:
    """Number of examples; None if infinite. Reads the data once if tf.data can't tell."""
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        return None
    if cardinality >= 0:
        return cardinality
    return int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


@dataclasses.dataclass(frozen=True)
class Sizes:
    num_elements: int | None  # None: infinite
    file_sizes: tuple | None  # per file, for file inputs


def measure(source: Any, config: Any, strategy: Any = None) -> "Sizes":
    dataset, files = open_source(source)
    if files is None:
        return Sizes(count(dataset), None)
    share = _worker_share(strategy)
    if share is None:
        sizes = tuple(count(read_files([f], config.reader)) for f in files)
    else:
        sizes = _count_shared(strategy, files, config.reader, *share)
    if None in sizes:
        return Sizes(None, None)
    return Sizes(sum(s for s in sizes if s is not None), sizes)  # (none is None here)


def _worker_share(strategy):
    """(this worker's index, number of workers) where several processes read the input, else
    None."""
    if strategy is None:
        return None
    topology = topology_of(strategy)
    if topology.coordinator or topology.num_workers == 1:
        return None
    return topology.worker_index, topology.num_workers


def _count_shared(strategy, files, reader, index, workers):
    """Counts files index, index + workers, ... here and sums every worker's counts (-1:
    infinite)."""
    mine = np.zeros(len(files), np.float64)
    for i in range(index, len(files), workers):
        n = count(read_files([files[i]], reader))
        mine[i] = -1 if n is None else n
    totals = sum_over_workers(strategy, mine)
    _log.info(
        "counted %d of the %d input files here; the other worker(s) counted the rest and the %d "
        "workers summed the counts",
        len(range(index, len(files), workers)),
        len(files),
        workers,
    )
    return tuple(None if n < 0 else int(n) for n in totals)
