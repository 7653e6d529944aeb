"""A TensorFlow server for one task of TF_CONFIG (a ps or a worker of a PS cluster).

    TF_CONFIG=... python -m tfpar._local.server

Used by `tfpar launch --ps`, `ParameterServer.local()`, and `ParameterServer()` made in a ps or
worker task (a TFJob's pods all run one script). It serves until killed,
or, with TFPAR_SERVER_PARENT_PID set, until that process is gone.
"""

import os
import sys
import time


def main():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfpar.cluster import ClusterInfo

    info = ClusterInfo.from_tf_config()
    if info is None:
        sys.exit("tfpar._local.server needs TF_CONFIG naming this task")
    serve(info)


def serve(info, device_count=None, while_answers=None, wait_seconds=60.0):
    """Serves ``info``'s task (a ps, or a worker of a parameter-server cluster) until killed, or,
    with TFPAR_SERVER_PARENT_PID set, until that process is gone. Its stacks go to stderr on
    SIGUSR1 (as a task's with a heartbeat: ``tfpar launch --heartbeat-timeout``).

    With ``while_answers`` (a ``host:port``: the worker that drives a pipeline spanning the job),
    it waits up to ``wait_seconds`` for that address to answer, then serves while it does, and
    returns. ``device_count`` (e.g. ``{"CPU": 2}``) sets the devices the server offers."""
    import faulthandler

    import tensorflow as tf

    from tfpar._tasks.heartbeat import STACK_SIGNAL

    faulthandler.register(STACK_SIGNAL, all_threads=True)

    server = tf.distribute.Server(
        tf.train.ClusterSpec(info.cluster),
        job_name=info.task_type,
        task_index=info.task_index,
        protocol="grpc",
        start=True,
        config=None
        if device_count is None
        else tf.compat.v1.ConfigProto(device_count=device_count),
    )
    from tfpar._local import loopback as _loopback

    name = f"{info.task_type} {info.task_index}"
    warning = _loopback.warning_unless_active(
        f"tfpar server {name}", [info.address.rsplit(":", 1)[1]]
    )
    print(
        f"tfpar server: {name} serving at {info.address}"
        + (" (loopback only)" if warning is None else f"\n{warning}"),
        flush=True,
    )
    if while_answers is not None:
        _serve_while_answering(while_answers, wait_seconds)
        return
    parent = os.environ.get("TFPAR_SERVER_PARENT_PID")
    if parent is None:
        server.join()
    # Started by ParameterServer.local(): serve while the coordinator lives, so
    # that its TensorFlow runtime can still close its remote contexts at exit.
    while _alive(int(parent)):
        time.sleep(0.5)


def _serve_while_answering(address, wait_seconds):
    from tfpar.cluster.addresses import (
        ClusterUnreachableError,
        accepts,
        wait_for_addresses,
    )

    try:
        wait_for_addresses([address], wait_seconds)
    except ClusterUnreachableError as error:
        sys.exit(f"tfpar server: {error} Stopping.")
    while accepts(address, timeout=5.0):
        time.sleep(0.5)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return os.getppid() == pid


if __name__ == "__main__":
    main()
