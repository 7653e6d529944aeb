"""TensorFlow's collective ops and MultiWorkerMirroredStrategy's collective set-up, private parts
tfpar reaches (part of `tfpar._compat`, the one place that touches private TensorFlow/Keras APIs;
it re-exports these)."""


def set_collective_key_base(strategy, base):
    """Gives a MirroredStrategy its own collective keys, read by its __init__: two strategies in one
    process otherwise share group key 1 (TensorFlow's own tests do this; no public option)."""
    strategy._collective_key_base = base


def collective_server_started(cluster_def, job_name, task_index):
    """Whether this process enabled TensorFlow's collective ops as ``job_name`` ``task_index`` of
    ``cluster_def`` (a MultiWorkerMirroredStrategy does at its first construction; no getter)."""
    from tensorflow.python.eager import context

    started = context.context()._collective_ops_server_def
    return (started is not None and started.cluster == cluster_def and started.job_name == job_name
            and started.task_index == task_index)


def keep_collective_server(extended):
    """Before a CollectiveAllReduceExtended's __init__: this process's server is started, so it
    does not enable collective ops again (that resets the collectives its peers are running)."""
    extended._std_server_started = True


def collective_all_reduce(t, **keys):
    """TensorFlow's collective all-reduce (a sum) of ``t`` among the group's workers (the op
    MultiWorkerMirroredStrategy runs; no public form outside a strategy)."""
    from tensorflow.python.ops import collective_ops

    return collective_ops.all_reduce_v2(t, merge_op="Add", final_op="Id", **keys)


def collective_all_gather(t, **keys):
    """TensorFlow's collective all-gather of ``t`` along its first axis among the group's workers."""
    from tensorflow.python.ops import collective_ops

    return collective_ops.all_gather_v2(t, **keys)


def collective_all_to_all(t, **keys):
    """TensorFlow's collective all-to-all among the group's members: ``t``'s first axis, of the
    group's size, is split, and member j receives every member's row j, in member order."""
    from tensorflow.python.ops import collective_ops

    return collective_ops.all_to_all_v2(t, **keys)
