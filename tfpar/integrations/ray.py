"""tfpar in Ray Train: `TensorflowTrainer`'s ``train_loop_per_worker`` with tfpar inside.

Ray's `TensorflowTrainer` starts the workers and sets ``TF_CONFIG`` in each, so
``tfpar.DataParallel()`` in the loop is the multi-worker strategy as it is under
``tfpar launch``; `tfpar.data` and the callbacks work unchanged. What this module adds is what
every such script would write again:

- `check_resources`: before ``trainer.fit()``, a Ray cluster with fewer CPUs (or GPUs) than the
  workers ask for is refused at once; Ray would otherwise wait for them without end;
- `restore`: in the loop, the model (and optimizer) from Ray's latest checkpoint after a restart
  (``FailureConfig(max_failures=...)``), and the epoch to go on from;
- `ReportCheckpoints`: a callback that gives Ray a checkpoint at every epoch's end, written by
  the chief (the others write theirs aside, as Keras' multi-worker saving wants), with the logs.

Example (README, "More than one machine"):
    >>> def train_loop(config):  # doctest: +SKIP
    ...     strategy = tfpar.DataParallel()
    ...     with strategy.scope():
    ...         model = build_model(); model.compile("adam", "sparse_categorical_crossentropy")
    ...     start = tfpar.integrations.ray.restore(model)
    ...     train = tfpar.data.distribute(make_dataset, strategy, 64)
    ...     model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=10,
    initial_epoch=start,
    ...               callbacks=[tfpar.integrations.ray.ReportCheckpoints()])
"""

import json
import os
import shutil
import tempfile
from typing import Any

from tfpar import _compat
from tfpar._keras import keras, tf

__all__ = ["ReportCheckpoints", "check_resources", "restore"]

_STATE = "state"
_EPOCH = "epoch.json"


def check_resources(scaling_config: Any) -> None:
    """Refuses a ``ScalingConfig`` the connected Ray cluster cannot place, naming what is short.

    Raises:
        ValueError: the workers ask for more of a resource than the cluster has in all.
    """
    import ray

    # What Ray places per worker, defaults included (1 CPU, or 1 GPU with use_gpu=True); Ray
    # computes it in a private property, so the public fields stand in where it is gone.
    per_worker = _compat.ray_resources_per_worker(scaling_config)
    if per_worker is None:
        per_worker = scaling_config.resources_per_worker or (
            {"GPU": 1} if scaling_config.use_gpu else {"CPU": 1}
        )
    per_worker = dict(per_worker)
    available = ray.cluster_resources()
    for resource, amount in per_worker.items():
        needed = amount * scaling_config.num_workers
        if needed > available.get(resource, 0):
            raise ValueError(
                f"The Ray cluster has {available.get(resource, 0):g} {resource} in all, and "
                f"ScalingConfig(num_workers={scaling_config.num_workers}) asks for {amount:g} per "
                f"worker ({needed:g}); Ray would wait for them without end. Received: "
                f"{scaling_config}. Use fewer workers, resources_per_worker={{'{resource}': ...}} "
                "with less, or a larger cluster (ray.init(num_cpus=...), more nodes)."
            )


def _checkpoint(model):
    return tf.train.Checkpoint(model=model, optimizer=model.optimizer)


def restore(model: Any) -> int:
    """Loads the model and its optimizer from Ray's latest checkpoint, if any.

    Returns:
        The epoch to go on from (``fit(initial_epoch=...)``): 0 on a first run.
    """
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as folder:
        _checkpoint(model).read(os.path.join(folder, _STATE)).expect_partial()
        with open(os.path.join(folder, _EPOCH)) as f:
            return json.load(f)["epoch"]


class ReportCheckpoints(keras.callbacks.Callback):
    """At each epoch's end, reports the logs and a checkpoint (model and optimizer) to Ray.

    Every worker saves (Keras' multi-worker saving reads some variables through collectives),
    the chief into the checkpoint it hands to Ray, the others into a folder they delete.
    """

    def on_epoch_end(self, epoch, logs=None):
        import ray.train

        chief = ray.train.get_context().get_world_rank() == 0
        folder = tempfile.mkdtemp(prefix="tfpar-ray-checkpoint-")
        try:
            _checkpoint(self.model).write(os.path.join(folder, _STATE))
            with open(os.path.join(folder, _EPOCH), "w") as f:
                json.dump({"epoch": epoch + 1}, f)
            metrics = {key: float(value) for key, value in (logs or {}).items()} | {
                "epoch": epoch + 1
            }
            ray.train.report(
                metrics, checkpoint=ray.train.Checkpoint.from_directory(folder) if chief else None
            )
        finally:
            shutil.rmtree(folder, ignore_errors=True)
