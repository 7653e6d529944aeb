"""The lines every strategy's ``describe()`` ends with: batch split and model size."""

from tfpar._keras import check_keras_model
from tfpar.data.batching import per_replica_batch_size


def batch_and_model_lines(num_replicas, global_batch_size=None, model=None):
    """Returns the "batch:" and "model:" lines (each only when its argument is given).

    Raises:
        ValueError: if ``global_batch_size`` does not divide by ``num_replicas``.
        TypeError: if ``model`` is not a Keras model (of either Keras).
    """
    lines = []
    if global_batch_size is not None:
        per_replica = per_replica_batch_size(global_batch_size, num_replicas)
        lines.append(f"  batch:      {per_replica} per replica, {global_batch_size} global")
    if model is not None:
        check_keras_model(model)
        lines.append(f"  model:      {model.name}, {model.count_params():,} parameters")
    return lines
