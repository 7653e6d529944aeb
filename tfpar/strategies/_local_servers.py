"""The ps and worker servers of `ParameterServer.local()`: child processes on 127.0.0.1."""

import logging
import os
import subprocess
import sys

from tfpar._local import loopback
from tfpar._local.processes import stop_groups
from tfpar.cluster import ClusterInfo

__all__ = [
    "RESTART_NOTICE",
    "refuse_open_ports",
    "start_server",
    "stop_servers",
    "warn_if_the_chief_listens_on_all_interfaces",
]

RESTART_NOTICE = (
    "tfpar: ParameterServer.local() starts this script again with tfpar's loopback library, so "
    "that this process' TensorFlow server (the chief's) listens on 127.0.0.1 only; run it under "
    "`tfpar launch -n 1 -- python ...` to start it with the library at once"
)

_log = logging.getLogger("tfpar.parameter_server")


def start_server(cluster, role, index, **popen_kwargs):
    """One ``python -m tfpar._local.server`` child for a task of ``cluster``; it exits with this
    process."""
    info = ClusterInfo(cluster=cluster, task_type=role, task_index=index)
    popen_kwargs.setdefault("stdout", subprocess.DEVNULL)
    popen_kwargs.setdefault("stderr", subprocess.DEVNULL)
    return subprocess.Popen(
        [sys.executable, "-m", "tfpar._local.server"],
        # loopback-only servers
        env=loopback.child_env(
            {
                **os.environ,
                "TF_CONFIG": info.to_tf_config(),
                "TFPAR_SERVER_PARENT_PID": str(os.getpid()),
            }
        ),
        start_new_session=True,
        **popen_kwargs,
    )


def stop_servers(servers, grace_seconds=5.0):
    """SIGTERM to each server's process group, SIGKILL to what is left after ``grace_seconds``."""
    stop_groups([proc.pid for proc in servers.values() if proc.poll() is None], grace_seconds)
    for proc in servers.values():
        proc.wait()


def refuse_open_ports(reason):
    """The error for a `ParameterServer.local()` whose servers could only listen on every
    interface."""
    raise ValueError(
        "ParameterServer.local() keeps every server on 127.0.0.1, and this process' own (the "
        "chief's, which TensorFlow starts inside it and binds to every interface) can only be kept "
        "there by starting the process with tfpar's loopback library, which is not possible here: "
        f"{reason}. Received: listen_on_all_interfaces=False. Run the script under "
        "`tfpar launch -n 1 -- python train.py`, or pass listen_on_all_interfaces=True to accept "
        "TensorFlow servers that anyone who reaches this machine can use, without authentication."
    )


def warn_if_the_chief_listens_on_all_interfaces(cluster):
    """This process serves the chief task: its own binds are kept to loopback only when it runs
    with the loopback library (``tfpar launch -n 1 -- python train.py``, ``tfpar demo``, or after
    `ParameterServer.local()` started it again); else the servers' too when there is no library."""
    names = ("chief",) if loopback.library() else ("chief", "ps", "worker")
    ports = [address.rsplit(":", 1)[1] for name in names for address in cluster.get(name, ())]
    warning = loopback.warning_unless_active(
        "this process (the chief)" if len(names) == 1 else "this job", ports
    )
    if warning:
        _log.warning(
            "%s Start it with `tfpar launch -n 1 -- python %s` to keep it to loopback.",
            warning,
            os.path.basename(sys.argv[0]) or "train.py",
        )
