"""TensorFlow's collective ops and MultiWorkerMirroredStrategy's collective set-up, private parts
tfpar reaches (part of `tfpar._compat`, the one place that touches private TensorFlow/Keras APIs;
it re-exports these)."""


def set_collective_key_base(strategy, base):
    """Gives a MirroredStrategy its own collective keys, read by its __init__: two strategies in one
    process otherwise share group key 1 (TensorFlow's own tests do this; no public option)."""
    strategy._collective_key_base = base


def keep_started_collective_server(extended, resolver):
    """Before a CollectiveAllReduceExtended's __init__: where this process already enabled
    TensorFlow's collective ops as the same task of the same cluster (a MultiWorkerMirroredStrategy
    does at its first construction), the extended neither enables them again (that resets the
    collectives its peers are running) nor, where the coordination service watches the workers,
    starts a health check of its own (as TensorFlow decides where it starts the server). Returns
    whether the server was kept."""
    from tensorflow.python.eager import context

    started = context.context()._collective_ops_server_def
    cluster = resolver.cluster_spec().as_cluster_def()
    if started is None or started.cluster != cluster:
        return False
    if (started.job_name, started.task_index) != (resolver.task_type, resolver.task_id):
        return False
    extended._std_server_started = True
    if context.context().coordination_service:
        extended._enable_check_health = False
    return True


def collective_all_reduce(t, **keys):
    """TensorFlow's collective all-reduce (a sum) of ``t`` among the group's workers (the op
    MultiWorkerMirroredStrategy runs; no public form outside a strategy)."""
    from tensorflow.python.ops import collective_ops

    return collective_ops.all_reduce_v2(t, merge_op="Add", final_op="Id", **keys)


def collective_all_gather(t, **keys):
    """TensorFlow's collective all-gather of ``t`` along its first axis among the group's
    workers."""
    from tensorflow.python.ops import collective_ops

    return collective_ops.all_gather_v2(t, **keys)


def collective_all_to_all(t, **keys):
    """TensorFlow's collective all-to-all among the group's members: ``t``'s first axis, of the
    group's size, is split, and member j receives every member's row j, in member order."""
    from tensorflow.python.ops import collective_ops

    return collective_ops.all_to_all_v2(t, **keys)
