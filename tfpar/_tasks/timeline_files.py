"""The files of `tfpar.callbacks.Timeline` that the launcher handles too, without TensorFlow:
``tfpar launch --timeline DIR`` checks the folder before any task starts and merges Horovod's own
timeline after the job, and the launcher never imports TensorFlow (`tfpar.launch`)."""

import json
import os

from tfpar._files import write_atomically
from tfpar._tasks.env import TIMELINE_VARIABLE

__all__ = ["TIMELINE_VARIABLE", "check_writable", "merge_horovod_timeline", "timeline_in"]


def check_writable(path: str | os.PathLike | None, parameter: str) -> str | os.PathLike:
    """``path`` as given, once its folder is known to exist and take a new file; else ValueError."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(
            f"Timeline needs a file to write. Received: {parameter}={path!r}. Pass a path, or "
            f"start the job with `tfpar launch --timeline DIR` (it sets ${TIMELINE_VARIABLE})."
        )
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(
            f"{parameter} is a folder. Received: {parameter}={path!r}. Name a file in it, e.g. "
            f"{os.path.join(path, 'timeline.json')!r}."
        )
    try:
        probe = os.path.join(folder, f".tfpar-timeline-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise ValueError(
            f"{parameter} cannot be written ({e.strerror}: {folder}). Received: "
            f"{parameter}={path!r}. Create the folder, or choose one this process may write to."
        ) from None
    return path


def timeline_in(folder: str | os.PathLike, parameter: str) -> str:
    """FOLDER/timeline.json, once FOLDER is made (if missing) and known to take a new file; else
    ValueError naming ``parameter``."""
    folder = os.path.abspath(folder)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise ValueError(
            f"{parameter} cannot make {folder} ({e.strerror}). Received: {parameter}={folder!r}. "
            "Choose a folder this user may write to."
        ) from None
    return str(check_writable(os.path.join(folder, "timeline.json"), parameter))


def merge_horovod_timeline(folder: str) -> bool:
    """Adds Horovod's own timeline (``HOROVOD_TIMELINE``: FOLDER/horovod_timeline.json, one process
    per tensor, times from its start) to FOLDER/timeline.json, on the same clock: after the job
    (``tfpar launch --horovod --timeline``). Returns whether it merged."""
    ours, theirs = (
        os.path.join(folder, "timeline.json"),
        os.path.join(folder, "horovod_timeline.json"),
    )
    if not (os.path.exists(ours) and os.path.exists(theirs)):
        return False
    with open(theirs) as f:
        text = f.read().strip().rstrip(",")
    if not text.endswith("]"):  # a job cut short leaves the array open
        text += "]"
    horovod = json.loads(text)
    start = next(
        (
            e["args"]["start_time_since_epoch_in_micros"]
            for e in horovod
            if "start_time_since_epoch_in_micros" in e.get("args", {})
        ),
        None,
    )
    if start is None:
        return False
    with open(ours) as f:
        trace = json.load(f)
    offset = 1 + max((e["pid"] for e in trace["traceEvents"]), default=0)
    for event in horovod:
        event = dict(event, pid=offset + event.get("pid", 0))
        if "ts" in event:
            event["ts"] = event["ts"] + start
        if event.get("name") == "process_name" and "name" in event.get("args", {}):
            event["args"] = {"name": f"Horovod {event['args']['name']}"}
        elif event.get("name") == "process_name":
            event["args"] = {"name": "Horovod"}
        trace["traceEvents"].append(event)
    write_atomically(ours, json.dumps(trace))
    return True
