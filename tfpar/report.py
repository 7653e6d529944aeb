"""`tfpar report RUN_DIR`: PNG plots of a run from its timeline (`tfpar.callbacks.Timeline`).

RUN_DIR is what ``tfpar launch --timeline RUN_DIR`` or ``tfpar demo --report RUN_DIR`` filled
(its ``timeline.json``). Written next to it, when the run has what each needs:

- ``throughput.png``: each worker's steps per second over the run, and the share of each of its
  steps spent waiting for input (a straggling or starved worker stands out); with a `Throughput`
  callback given a one-replica reference, its scaling efficiency at each epoch's end;
- ``pipeline.png``: a pipeline's median step as a Gantt chart, a row per stage, every microbatch's
  F and B, the idle time (the bubble) shaded, measured against the theory (p-1)/(m+p-1);
- ``loss_scale.png``: the loss scale at every step, with the skipped steps (where it halved) marked.

Needs matplotlib: ``pip install ".[report]"`` in the tfpar checkout.
"""

import functools
import json
import os

import numpy as np

__all__ = ["SIZE", "bandwidth_plot", "load_timeline", "report"]

SIZE = (1200, 600)
"""Every plot's size in pixels (width, height)."""
_DPI = 100


def load_timeline(folder: str) -> dict:
    """The trace in ``folder``/timeline.json.

    Raises:
        ValueError: the folder is missing, or holds no timeline (no run in it).
    """
    path = os.path.join(os.fspath(folder), "timeline.json")
    if not os.path.isdir(folder):
        raise ValueError(
            f"tfpar report reads a run's folder. Received: {folder!r}, which is not a folder. "
            "Give the DIR of `tfpar launch --timeline DIR` or `tfpar demo --report DIR`."
        )
    if not os.path.exists(path):
        raise ValueError(
            f"{folder!r} holds no run: no timeline.json in it. Received: {folder!r}. Make one with "
            "`tfpar launch --timeline DIR -- ...`, `tfpar demo --report DIR`, or "
            "tfpar.callbacks.Timeline('DIR/timeline.json') in fit."
        )
    with open(path) as f:
        return json.load(f)


def report(folder: str, out: str | None = None) -> list[str]:
    """Writes the plots the run in ``folder`` allows; returns their paths.

    Args:
        folder: the run's folder (its timeline.json).
        out: where the PNG files go (default: ``folder``).

    Raises:
        ValueError: as `load_timeline`.
        ImportError: matplotlib is not installed, saying how to install it.
    """
    trace = load_timeline(folder)
    out = out or folder
    os.makedirs(out, exist_ok=True)
    tracks, counters = _tracks(trace)
    schedule = trace.get("otherData", {}).get("pipeline_schedule")  # what Timeline recorded
    written = []
    for name, draw in (
        ("throughput", _throughput),
        ("pipeline", functools.partial(_pipeline, schedule=schedule)),
        ("loss_scale", _loss_scale),
    ):
        plt, figure = _figure()
        try:
            if draw(figure, tracks, counters):
                path = os.path.join(out, f"{name}.png")
                figure.savefig(path, dpi=_DPI)
                written.append(path)
        finally:
            plt.close(figure)
    return written


def _figure():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(
            'tfpar report draws with matplotlib: pip install ".[report]" in the tfpar checkout '
            "(or pip install matplotlib)"
        ) from None
    return plt, plt.figure(figsize=(SIZE[0] / _DPI, SIZE[1] / _DPI), dpi=_DPI)


def bandwidth_plot(path: str, busbw: dict, limit: float, workers: int = 2) -> str:
    """Writes ``path``: an all-reduce's bus bandwidth per message size against the link's limit,
    both measured in the same run (``python bench/data_parallel.py --plot DIR``).

    Args:
        busbw: {message bytes: bus bandwidth in bytes/s} (size x 2(n-1)/n ÷ time).
        limit: what one loopback TCP connection carried in the same run, bytes/s.
        workers: how many workers the all-reduce spanned.
    """
    plt, figure = _figure()
    try:
        axes = figure.subplots()
        sizes = sorted(busbw)
        axes.plot(
            [n / 2**20 for n in sizes],
            [busbw[n] / 1e9 for n in sizes],
            "o-",
            label=f"tfpar's all-reduce over {workers} workers (bus bandwidth)",
        )
        axes.axhline(
            limit / 1e9,
            color="red",
            linestyle="--",
            label="loopback TCP, one connection (the limit here)",
        )
        axes.set_xscale("log", base=2)
        axes.set_xlabel("message size (MiB)")
        axes.set_ylabel("GB/s")
        axes.set_ylim(0, max(limit, *busbw.values()) / 1e9 * 1.1)
        axes.set_title("All-reduce bus bandwidth against the loopback limit, measured in one run")
        axes.legend(loc="center right")
        figure.tight_layout()
        figure.savefig(path, dpi=_DPI)
    finally:
        plt.close(figure)
    return path


def _tracks(trace):
    """({(worker, track): [(start s, end s, name)] by start}, {counter: {worker: [(time s,
    value)]}})."""
    names = {
        (e["pid"], e.get("tid")): e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("name") == "thread_name"
    }
    tracks, counters = {}, {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and (e["pid"], e.get("tid")) in names:
            tracks.setdefault((e["pid"], names[e["pid"], e["tid"]]), []).append(
                (e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, e["name"])
            )
        elif e.get("ph") == "C":
            counters.setdefault(e["name"], {}).setdefault(e["pid"], []).append(
                (e["ts"] / 1e6, e["args"][e["name"]])
            )
    return (
        {k: sorted(v) for k, v in tracks.items()},
        {
            name: {w: sorted(v) for w, v in by_worker.items()}
            for name, by_worker in counters.items()
        },
    )


def _throughput(figure, tracks, counters):
    workers = sorted(w for w, name in tracks if name == "step")
    if not workers:
        return False
    origin = min(tracks[w, "step"][0][0] for w in workers)
    efficiency = counters.get("scaling_efficiency")
    rate, wait, *more = figure.subplots(3 if efficiency else 2, 1, sharex=True)
    if efficiency:
        for w, values in sorted(efficiency.items()):
            more[0].plot(
                [t - origin for t, _ in values], [v for _, v in values], "o-", label=f"worker {w}"
            )
        more[0].set_ylabel("scaling efficiency\n(each epoch)")
        more[0].set_ylim(
            0, max(1.05, max(v for values in efficiency.values() for _, v in values) * 1.05)
        )
    for w in workers:
        steps = tracks[w, "step"][1:]  # the first step traces the training function
        if not steps:
            continue
        t = np.array([s[0] - origin for s in steps])
        seconds = np.array([s[1] - s[0] for s in steps])
        window = min(9, len(seconds))
        smooth = np.array(
            [np.median(seconds[max(0, i - window + 1) : i + 1]) for i in range(len(seconds))]
        )
        rate.plot(t, 1 / np.maximum(smooth, 1e-9), label=f"worker {w}")
        waits = dict(((round(a, 6)), b - a) for a, b, _ in tracks.get((w, "input wait"), []))
        share = [waits.get(round(s[0], 6), 0.0) / max(s[1] - s[0], 1e-9) for s in steps]
        wait.plot(t, share, label=f"worker {w}")
    rate.set_ylabel("steps per second\n(median of 9)")
    rate.set_title("Throughput per worker")
    rate.legend(loc="lower right")
    wait.set_ylabel("share of the step\nwaiting for input")
    wait.set_ylim(0, 1)
    (more or [wait])[-1].set_xlabel("seconds since the first step")
    figure.tight_layout()
    return True


def _pipeline(figure, tracks, counters, schedule=None):
    stages = sorted(
        (name for w, name in tracks if w == 0 and name.startswith("stage ")),
        key=lambda n: [
            int(part) for part in n.replace("(", " ").replace(")", " ").split() if part.isdigit()
        ],
    )
    if not stages:
        return False
    steps = tracks[0, "step"]
    spans = [(b - a) for a, b, _ in steps[1:]] or [(b - a) for a, b, _ in steps]
    median = int(np.argsort(spans)[len(spans) // 2]) + (1 if len(steps) > 1 else 0)
    begin, end, _ = steps[median]
    axes = figure.subplots()
    busy = 0.0
    first = min(a for n in stages for a, b, _ in tracks[0, n] if begin <= a <= end)
    last = max(b for n in stages for a, b, _ in tracks[0, n] if begin <= a <= end)
    for row, name in enumerate(stages):
        events = [(a, b, label) for a, b, label in tracks[0, name] if begin <= a <= end]
        axes.broken_barh([(0, last - first)], (row - 0.4, 0.8), color="#f2c4c4", zorder=0)  # idle
        for a, b, label in events:
            color = {"F": "#4c72b0", "W": "#55a868"}.get(label[0], "#dd8452")
            axes.broken_barh(
                [(a - first, b - a)], (row - 0.4, 0.8), color=color, edgecolor="white", zorder=1
            )
            if b - a > (last - first) / 60:
                axes.text(
                    (a + b) / 2 - first,
                    row,
                    label,
                    ha="center",
                    va="center",
                    color="white",
                    fontsize=8,
                )
            busy += b - a
    p = len(stages)
    if schedule is None:
        return False  # a trace without its schedule (tfpar before 0.1.0's Timeline recorded it)
    theory, formula, m = _bubble_theory(schedule)
    measured = 1 - busy / (p * (last - first))
    axes.set_yticks(range(p), stages)
    axes.invert_yaxis()
    axes.set_xlabel("seconds since the step's first instruction (median step)")
    axes.set_title(
        "Pipeline schedule of the median step: F forward (blue), B backward (orange), W weights "
        f"(green)\nbubble (shaded): measured {measured:.3f}, theory {formula} = {theory:.3f} for "
        f"p={p} stages, m={m} microbatches"
    )
    figure.tight_layout()
    return True


def _bubble_theory(recorded):
    """The theoretical bubble of the schedule a Timeline recorded (``{"name", "num_stages",
    "num_microbatches", "virtual_stages"}``): (theory, its formula, microbatches), as the schedule
    itself computes them."""
    from tfpar.pipeline.schedule import SCHEDULES, make_schedule

    v = recorded.get("virtual_stages", 1)
    schedule = make_schedule(
        recorded["name"],
        recorded["num_stages"],
        recorded["num_microbatches"],
        virtual_stages=v if SCHEDULES[recorded["name"]].default_virtual_stages else None,
    )
    # at F = B = W, as drawn
    formula = schedule.bubble_formula.split(" with ")[0].replace("v·m", f"{v}m")
    return schedule.bubble_fraction, formula, schedule.num_microbatches


def _loss_scale(figure, tracks, counters):
    counters = counters.get("loss scale")
    if not counters:
        return False
    axes = figure.subplots()
    origin = min(t for values in counters.values() for t, _ in values)
    for w, values in sorted(counters.items()):
        t = np.array([a - origin for a, _ in values])
        scale = np.array([v for _, v in values])
        axes.step(t, scale, where="post", label=f"worker {w}")
        skipped = np.flatnonzero(scale[1:] < scale[:-1]) + 1
        if len(skipped):
            axes.plot(
                t[skipped],
                scale[skipped],
                "rv",
                label=f"worker {w}: skipped steps ({len(skipped)})",
            )
    axes.set_yscale("log", base=2)
    axes.set_xlabel("seconds since the first step")
    axes.set_ylabel("loss scale")
    axes.set_title("Loss scale over the run (it halves on a skipped step)")
    axes.legend(loc="lower right")
    figure.tight_layout()
    return True
