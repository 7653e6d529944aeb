"""What a task started by ``tfpar launch --heartbeat-timeout`` or ``--timeline`` adds to the ``fit``
(``evaluate``, ``predict``) of a model tfpar owns: a `Heartbeat`, and a `Timeline` for ``fit``.

``import tfpar`` registers `add_launch_callbacks` (`tfpar._owned.add_process_check`) in such a
task only, so the script itself changes nothing. A model tfpar does not own is left as Keras
made it: give its ``fit`` ``tfpar.callbacks.Heartbeat()`` (or ``Timeline()``) by hand.
"""

import os

from tfpar._tasks.heartbeat import HEARTBEAT_VARIABLE
from tfpar._tasks.timeline_files import TIMELINE_VARIABLE
from tfpar.callbacks.heartbeat import Heartbeat
from tfpar.callbacks.timeline import Timeline

__all__ = ["add_launch_callbacks"]


def add_launch_callbacks(model, arguments, method="fit"):
    """Adds to the call's callbacks a `Heartbeat` (``$TFPAR_HEARTBEAT_FILE`` set) and, for ``fit``,
    a `Timeline` (``$TFPAR_TIMELINE`` set), unless one is there."""
    callbacks = arguments.get("callbacks")
    if not (callbacks is None or isinstance(callbacks, (list, tuple))):
        return
    wanted = [(Heartbeat, HEARTBEAT_VARIABLE)] + (
        [(Timeline, TIMELINE_VARIABLE)] if method == "fit" else []
    )
    added = [
        kind()
        for kind, variable in wanted
        if os.environ.get(variable) and not any(isinstance(c, kind) for c in callbacks or ())
    ]
    if added:
        arguments["callbacks"] = [*(callbacks or ()), *added]
