"""Batch-level hooks that fall back to epoch level where Keras refuses them (ParameterServer)."""

from tfpar._keras import tf


def coordinator_strategy():
    """Whether ``fit`` runs through a ClusterCoordinator (ParameterServer): no batch hooks there."""
    return getattr(tf.distribute.get_strategy(), "_should_use_with_coordinator", False)


class EpochLevelUnderCoordinator:
    """Mixin for a Keras callback: under a ParameterServer its batch hooks are not called (Keras
    would refuse the callback), so it must do at epoch boundaries what it can."""

    def _implements_train_batch_hooks(self):
        return not coordinator_strategy() and super()._implements_train_batch_hooks()
