"""Checkpoints of a sharded optimizer state (`tfpar.strategies._zero`) in the unsharded optimizer's
layout: tf_keras' TF format and Keras 3's ``.weights.h5`` and ``.keras`` hold the whole state, so
that a checkpoint written by N replicas restores on M replicas, or with no sharding, and back.

Writing one gathers each slot from the replicas that hold its chunks: under Horovod, every rank
writes (a rank writing alone waits for the others' pieces; Horovod's stall warning names the
``tfpar_zero_checkpoint_...`` tensors it waits for). Reading one needs no other replica: each takes
its own chunks of the whole values."""

from tfpar import _compat
from tfpar._keras import is_keras3, tf

__all__ = ["checkpoint_whole"]


class _SlotView(_compat.Trackable):
    """One of the unsharded optimizer's slots as a tf_keras checkpoint sees it (in the optimizer's
    ``_variables``, where the slot itself would be): written whole from the chunks, read back into
    them, so that a checkpoint moves between N replicas, M replicas and no sharding."""

    def __init__(self, sharded, name, index):
        self._sharded, self._slot, self._index = sharded, name, index
        variable = sharded.variables[index]
        self.shape, self.dtype = variable.shape, tf.float32
        self.name = f"tfpar_zero/{name}/{variable.name}"

    def value(self):
        return self._sharded.whole_slot(self._slot, self._index)

    def numpy(self):
        return self.value().numpy()

    def _serialize_to_tensors(self):
        return {"VARIABLE_VALUE": self.value()}

    def _restore_from_tensors(self, restored_tensors):
        return self._sharded.set_whole_slot(
            self._slot, self._index, restored_tensors["VARIABLE_VALUE"]
        )


def checkpoint_whole(optimizer, sharded):
    """Checkpoints (tf_keras' TF format; Keras 3's ``.weights.h5`` and ``.keras``) hold the whole
    optimizer state, laid out as the unsharded optimizer's."""
    if not is_keras3(optimizer):
        for name, i in sharded.plain_slots():  # tf_keras: where its own slots would be tracked
            optimizer._variables.append(_SlotView(sharded, name, i))
        return
    own = list(optimizer.variables)  # Keras 3, unbuilt: its step and learning rate

    def save_own_variables(store):
        for i, variable in enumerate(own):
            store[str(i)] = variable.numpy()
        for k, (name, i) in enumerate(sharded.plain_slots()):
            store[str(len(own) + k)] = sharded.whole_slot(name, i).numpy()

    def load_own_variables(store):
        slots = sharded.plain_slots()
        if len(store.keys()) != len(own) + len(slots):
            raise ValueError(
                f"This checkpoint holds {len(store.keys())} optimizer variables; the optimizer, "
                f"with its sharded state, has {len(own) + len(slots)}. Received: a checkpoint of "
                "another model or optimizer. Load it into the model and optimizer that wrote it."
            )
        for i, variable in enumerate(own):
            variable.assign(store[str(i)])
        for k, (name, i) in enumerate(slots):
            sharded.set_whole_slot(name, i, store[str(len(own) + k)])

    object.__setattr__(optimizer, "save_own_variables", save_own_variables)
    object.__setattr__(optimizer, "load_own_variables", load_own_variables)
