"""What tfpar's callbacks share: batch-level hooks that fall back to epoch level where Keras
refuses them (ParameterServer), and printing once, on the chief, the way Keras prints."""

from tfpar import _compat
from tfpar._topology import topology_of


def chief_print(model, message):
    """Prints ``message`` on the chief only, through Keras' printer (quiet where Keras is)."""
    if model.distribute_strategy.extended.should_checkpoint:
        _compat.print_msg(message)


def coordinator_strategy():
    """Whether ``fit`` runs through a ClusterCoordinator (ParameterServer): no batch hooks there."""
    return topology_of().coordinator


class EpochLevelUnderCoordinator:
    """Mixin for a Keras callback: under a ParameterServer its batch hooks are not called (Keras
    would refuse the callback), so it must do at epoch boundaries what it can."""

    def _implements_train_batch_hooks(self):  # a Keras hook: _compat.KERAS_CALLBACK_HOOKS
        return not coordinator_strategy() and super()._implements_train_batch_hooks()
