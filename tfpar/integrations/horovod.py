"""tfpar's input under Horovod's elastic API: every example once per epoch across resets and
resizes.

Horovod Elastic (``hvd.elastic.run``, ``hvd.elastic.KerasState``, ``state.commit()``) re-forms its
ring in memory when a rank is lost or a host joins, and rolls every rank back to the last commit.
Its examples leave the data to the user ("care needs to be taken when partitioning the data"):
each rank reads its own ``dataset.repeat().shuffle()``, and ``UpdateBatchStateCallback`` counts
the epoch's progress as the index of the last finished batch, in steps of the old world's size,
then shortens the resumed epoch through ``params['steps']``, which Keras 3 does not read. After a
reset some examples train twice and others never.

`ElasticInput` keeps tfpar.data's promise there. An epoch is one order of the whole input (the
seed's and the epoch's alone), cut into steps of ``global_batch_size`` examples, and each rank
trains the ``hvd.rank()``-th part of every step. ``state.batch`` counts the global steps of
``state.epoch`` already trained, so the state Horovod rolls back to names an example, not a
batch of some world size: `ElasticInput.dataset` starts there, with the ranks there are now.

Example (Horovod's elastic Keras example, its ``dataset`` and its two state callbacks replaced):
    >>> state = hvd.elastic.KerasState(model, batch=0, epoch=0)  # doctest: +SKIP
    >>> train = tfpar.integrations.horovod.ElasticInput(
    ...     examples, state, global_batch_size=64, shuffle_buffer=10_000, seed=0)
    >>> callbacks = [train.callback(), hvd.elastic.CommitStateCallback(state)]
    >>> @hvd.elastic.run
    ... def fit(state):
    ...     state.model.fit(train.dataset(), steps_per_epoch=train.steps_per_epoch,
    ...                     epochs=24 - state.epoch, callbacks=callbacks)
"""

from typing import Any

from tfpar import _compat
from tfpar._keras import keras
from tfpar.callbacks.fault_tolerance import END_OF_RESUMED_EPOCH
from tfpar.data.sharding import InputConfig, worker_stream
from tfpar.data.source import measure

__all__ = ["ElasticInput"]

_HOROVODS_STATE_CALLBACKS = ("UpdateBatchStateCallback", "UpdateEpochStateCallback")


class ElasticInput:
    """Each rank's part of every global step, from where a Horovod elastic state stands.

    Args:
        source: a tf.data.Dataset of single examples, a function returning one, or a list of
            files (as `tfpar.data.distribute` takes them).
        state: the ``hvd.elastic.KerasState`` (or ``TensorFlowKerasState``) made with
            ``batch=0, epoch=0``: its ``epoch`` and ``batch`` are the position this input keeps.
        global_batch_size: examples per step over all ranks, whatever their number; it must
            divide by every number of ranks the job runs with.
        **options: ``shuffle_buffer``, ``seed`` (required with a shuffle), ``remainder`` and
            ``reader``, as `tfpar.data.InputConfig` takes them.

    Raises:
        TypeError: ``state`` without ``epoch`` and ``batch``.
        ValueError: a shuffle without a seed, or a shard policy other than "data".
    """

    def __init__(self, source: Any, state: Any, global_batch_size: int, **options: Any) -> None:
        if not (hasattr(state, "epoch") and hasattr(state, "batch")):
            raise TypeError(
                "state must be Horovod's elastic state with the input's position in it. Received: "
                f"state={state!r}, without epoch and batch. Pass hvd.elastic.KerasState(model, "
                "batch=0, epoch=0)."
            )
        if options.setdefault("shard_policy", "data") != "data":
            raise ValueError(
                f"Received: shard_policy={options['shard_policy']!r}. Under Horovod Elastic the "
                "number of ranks "
                "changes, and only DATA sharding gives a step the same examples for every number: "
                "leave "
                'shard_policy out (it is "data").'
            )
        self.config = InputConfig(global_batch_size=global_batch_size, **options)
        if self.config.shuffle_buffer and self.config.seed is None:
            raise ValueError(
                f"Received: shuffle_buffer={self.config.shuffle_buffer} and seed=None. A rank that "
                "joins, or one that rolls back, must build the epoch's order again, and an "
                "unseeded shuffle has a new order in each process. Pass seed=N."
            )
        self.source, self.state = source, state
        self._sizes = None
        self._steps: int | None = None

    @property
    def steps_per_epoch(self) -> int:
        """Global steps in one epoch: the same for every number of ranks (pass it to ``fit``)."""
        if self._steps is None:
            self._steps = self._stream(1, 0, 0, 0)[1]
        return self._steps

    def dataset(self) -> Any:
        """This rank's per-rank batches from ``state.epoch``'s step ``state.batch`` on, for the
        ranks the job has now (call it inside the function ``hvd.elastic.run`` wraps: after a reset
        it builds the input of the new world).

        Raises:
            ValueError: ``global_batch_size`` does not divide by ``hvd.size()``.
        """
        import horovod.tensorflow as hvd

        return self._stream(hvd.size(), hvd.rank(), int(self.state.epoch), int(self.state.batch))[0]

    def _stream(self, ranks, rank, epoch, step):
        if self._sizes is None:
            self._sizes = measure(self.source, self.config)
        dataset, plan = worker_stream(
            self.source,
            self.config,
            num_workers=ranks,
            worker_index=rank,
            num_replicas=ranks,
            epoch=epoch,
            step=step,
            sizes=self._sizes,
        )
        if plan.steps is None:
            raise ValueError(
                "source must be finite: an epoch is one pass over it, and the position Horovod "
                "rolls back to counts its steps. Received: an infinite dataset (a .repeat()?). "
                "Pass one pass of the examples."
            )
        return dataset, plan.steps

    def callback(self) -> Any:
        """The Keras callback that keeps ``state.epoch`` and ``state.batch`` in global steps and
        ends a resumed epoch where its steps end. Put it before
        ``hvd.elastic.CommitStateCallback(state)``, instead of Horovod's
        ``UpdateEpochStateCallback`` and ``UpdateBatchStateCallback``."""
        return _Position(self)


class _Position(keras.callbacks.Callback):
    """`ElasticInput.callback`: the state's position, counted in global steps of the epoch."""

    def __init__(self, source: ElasticInput) -> None:
        super().__init__()
        self.input, self.state = source, source.state

    def on_train_begin(self, logs=None):
        given = (_compat.fit_arguments(self.model, ("callbacks",)) or {}).get("callbacks")
        _check_order(self, list(getattr(given, "callbacks", given) or ()))
        steps = self.params.get("steps")
        if steps != self.input.steps_per_epoch:
            raise ValueError(
                f"Received: steps_per_epoch={steps}. The input's position counts steps of its "
                f"epochs, {self.input.steps_per_epoch} of them: pass "
                "steps_per_epoch=train.steps_per_epoch."
            )
        self._first_epoch, self._keras_first, self._skip = (
            int(self.state.epoch),
            None,
            int(self.state.batch),
        )

    def on_epoch_begin(self, epoch, logs=None):
        if self._keras_first is None:
            self._keras_first = epoch
        self._epoch = self._first_epoch + epoch - self._keras_first
        # Keras numbers the batches from 0
        self._before = self._skip if self._epoch == self._first_epoch else 0

    def on_train_batch_end(self, batch, logs=None):
        # the batch index: steps_per_execution > 1 calls once for several
        self._done = self._before + batch + 1
        if self._done >= self.params["steps"]:  # the epoch's steps are trained
            self.state.epoch, self.state.batch = self._epoch + 1, 0
            if self._epoch == self._first_epoch and self._skip:
                self.model.stop_training = (
                    END_OF_RESUMED_EPOCH  # Keras would run a whole epoch's steps
                )
        else:
            self.state.batch = self._done

    def on_epoch_end(self, epoch, logs=None):
        if self.model.stop_training is END_OF_RESUMED_EPOCH:
            self.model.stop_training = False
        self.state.epoch, self.state.batch = self._epoch + 1, 0


def _check_order(position, callbacks):
    """Refuses Horovod's own state callbacks beside ours, and a commit that runs before ours."""
    names = [type(c).__name__ for c in callbacks]
    theirs = [n for n in names if n in _HOROVODS_STATE_CALLBACKS]
    if theirs:
        raise ValueError(
            f"Received: {', '.join(theirs)} beside ElasticInput.callback(). Both set state.batch "
            "and state.epoch, Horovod's in batches of the old number of ranks: remove Horovod's, "
            "the input's callback keeps them."
        )
    ours = next((i for i, c in enumerate(callbacks) if c is position), None)
    commit = next((i for i, n in enumerate(names) if n == "CommitStateCallback"), None)
    if ours is not None and commit is not None and commit < ours:
        raise ValueError(
            "Received: hvd.elastic.CommitStateCallback before ElasticInput.callback() in fit's "
            "callbacks. A commit then records the step's weights with the step before's position, "
            "and a rollback trains that step twice: put the input's callback first."
        )
