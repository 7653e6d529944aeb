"""The Timeline's events and the file they become: each worker's events gathered over the strategy
onto every worker, then written as one Chrome trace (Perfetto), a process per worker and a thread
per track."""

import numpy as np

from tfpar._parallelism import sum_over_workers
from tfpar._topology import topology_of

__all__ = [
    "COMPUTE",
    "COUNTER",
    "EPOCH",
    "EXCHANGE",
    "FORWARD",
    "INPUT",
    "STEP",
    "TRACKS",
    "chrome_trace",
    "gather",
]

TRACKS = (
    "step",
    "input wait",
    "forward+backward",
    "exchange+apply",
    "epoch",
    "compute",
    "counter",
)
"""The host's tracks, by index; a model's device tracks follow them."""
STEP, INPUT, FORWARD, EXCHANGE, EPOCH, COMPUTE, COUNTER = range(len(TRACKS))
"""The tracks' indices. An event is (start, end, track, label); a COUNTER event is (time, value,
COUNTER, its name's label)."""


def gather(strategy, events):
    """Every worker's events, on every worker (one SUM collective of a table a worker fills its row
    of)."""
    topology = topology_of(strategy)
    count = 1 if topology.coordinator else topology.num_workers
    if count == 1:
        return [events]
    index = topology.worker_index
    lengths = np.zeros(count, np.float64)
    lengths[index] = len(events)
    lengths = sum_over_workers(strategy, lengths)
    table = np.zeros((count, lengths.max(), 4), np.float64)
    table[index, : len(events)] = events
    table = sum_over_workers(strategy, table, whole=False)
    return [table[w, :n] for w, n in enumerate(lengths)]


def chrome_trace(workers, tracks, labels, schedule=None):
    """The Chrome trace: a process per worker, a thread per track, times in microseconds; a
    pipeline's schedule (name and sizes) in its ``otherData``."""
    events = []
    for worker, rows in enumerate(workers):
        events.append(
            {"ph": "M", "name": "process_name", "pid": worker, "args": {"name": f"worker {worker}"}}
        )
        for track in sorted({int(t) for t in rows[:, 2]} - {COUNTER}):
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": worker,
                    "tid": track,
                    "args": {"name": tracks[track]},
                }
            )
            events.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": worker,
                    "tid": track,
                    "args": {"sort_index": track},
                }
            )
        for begin, end, track, label in rows:
            if int(track) == COUNTER:  # its value in place of an end
                name = labels[int(label)]
                events.append(
                    {
                        "ph": "C",
                        "pid": worker,
                        "name": name,
                        "ts": round(begin * 1e6, 1),
                        "args": {name: float(end)},
                    }
                )
                continue
            events.append(
                {
                    "ph": "X",
                    "pid": worker,
                    "tid": int(track),
                    "name": labels[int(label)],
                    "cat": "tfpar",
                    "ts": round(begin * 1e6, 1),
                    "dur": round(max(0.0, end - begin) * 1e6, 1),
                }
            )
    other = {
        "producer": "tfpar.callbacks.Timeline",
        "clock": "wall clock, microseconds since the epoch",
    }
    if schedule is not None:
        other["pipeline_schedule"] = schedule
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}
