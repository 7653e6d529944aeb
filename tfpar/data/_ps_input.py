"""Keras-facing shim for parameter-server input: a DatasetCreator that knows its steps.

Keras' ``DatasetCreatorAdapter`` refuses a ``DatasetCreator`` without
``steps_per_epoch`` with a generic message. `ParameterServerInput` carries the
steps tfpar planned, and importing this module registers, once, a subclass of
that adapter in Keras' adapter list (in place of the original, so that exactly
one adapter still handles a DatasetCreator) that says why the steps are needed
and which value to pass. Every other input goes through the original code
unchanged. (`tfpar.data.distribute` imports this module when it first builds
parameter-server input.)
"""

from tfpar import _compat
from tfpar._keras import keras

__all__ = ["ParameterServerInput"]


# The second base is chosen when the module loads (a Keras 3 data adapter, or object): mypy cannot
# see it.
class ParameterServerInput(
    keras.utils.experimental.DatasetCreator,
    _compat.keras3_data_adapter_class(),  # type: ignore[misc]
):
    """A `DatasetCreator` for `tfpar.data.distribute` under a ParameterServer.

    tf_keras' ``fit`` drives it through the ClusterCoordinator. It is also a Keras 3 data
    adapter, so that Keras 3's ``fit``, which has no parameter-server training, hands it to
    tfpar and gets the reason and the fix instead of "Unrecognized data type".
    """

    def __init__(self, dataset_fn, steps_per_epoch):
        super().__init__(dataset_fn)
        self.steps_per_epoch = steps_per_epoch

    @property
    def num_batches(self):  # the first thing Keras 3's fit, evaluate and predict ask an adapter
        raise TypeError(
            "Parameter-server training in fit needs a tf_keras (Keras 2) model: Keras 3's fit has "
            "no ClusterCoordinator, which runs the steps on the workers. Received: a Keras 3 "
            "model's fit/evaluate/predict on tfpar.data input for a ParameterServer. Build the "
            "model with tfpar.keras (tf_keras), or train a Keras 3 model with DataParallel or "
            "HorovodStrategy."
        )


class _StepsExplainingAdapter(_compat.DatasetCreatorAdapter):
    def __init__(self, x, y, steps=None, **kwargs):
        if (
            steps is None
            and isinstance(x, ParameterServerInput)
            and not kwargs.get("pss_evaluation_shards")
        ):
            raise ValueError(
                "Parameter-server training needs the number of steps: pass "
                f"steps_per_epoch={x.steps_per_epoch} to fit (validation_steps= for "
                "validation_data, steps= for evaluate/predict), i.e. "
                "steps_per_epoch=train.steps_per_epoch from tfpar.data.distribute. Received: "
                "steps=None. Every worker reads its own endless copy of the input and each step "
                "runs on whichever worker is free, so no end of data can end an epoch: the "
                "coordinator schedules exactly the steps it is told."
            )
        super().__init__(x, y, steps=steps, **kwargs)


# once, at import
_compat.replace_data_adapter(_compat.DatasetCreatorAdapter, _StepsExplainingAdapter)
