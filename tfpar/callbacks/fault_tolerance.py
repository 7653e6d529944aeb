"""`FaultTolerance`: back up at every epoch and resume after a relaunch, safely with many workers."""

import os
import uuid

from tfpar._checks import check_number
from tfpar._keras import is_keras3, keras, keras3, tf
from tfpar._parallelism import sum_over_workers
from tfpar.cluster import ClusterInfo
from tfpar.callbacks._hooks import chief_print

__all__ = ["FaultTolerance"]


def _check_writable(directory):
    """Creates ``directory`` if needed and writes a probe file there, so that a bad path fails now."""
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".tfpar-write-probe-{uuid.uuid4().hex}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as error:
        raise ValueError(
            f"The checkpoint directory {directory!r} cannot be written ({error.strerror or error}). "
            f"Received: backup_dir={directory!r}. Give a directory every worker can write (on several "
            "hosts, a shared file system), so that a run does not fail only when it first saves.") from None


def _refuse_several_chiefs(strategy, backup_dir):
    """Counts the workers that believe they are the chief (one collective, multi-worker only):
    two would write and delete one backup, each undoing the other's."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return  # one process (or Horovod: rank 0; or parameter servers: the coordinator) saves
    chiefs = int(sum_over_workers(strategy, 1 if strategy.extended.should_checkpoint else 0))
    if chiefs != 1:
        raise ValueError(
            f"FaultTolerance needs exactly one chief to write {backup_dir}, and {chiefs} workers of "
            f"this job believe they are it. Received: a cluster whose tasks do not agree on their "
            "roles. Give each task its own TF_CONFIG \"task\" (type and index); tfpar launch does.")


class FaultTolerance(keras.callbacks.Callback):
    """Backs the run up at each epoch's end (or every N steps) and resumes from it after a relaunch.

    Keras' `BackupAndRestore`, of the model's own Keras (tf_keras or Keras 3), under every
    tfpar strategy: with several workers only
    the chief writes the real backup and the others write to their own temporary
    directories that are removed (so no two workers write one path,
    tensorflow#38635); after a process is killed and the job relaunched with the
    same ``backup_dir``, training resumes after the last backed-up epoch (or step),
    with the weights, optimizer state and epoch counter of that moment, and the
    backup is deleted once training completes. The directory is checked to be
    writable when the callback is built.

    Args:
        backup_dir: where the backup lives (the same path on every worker).
        save_freq: "epoch", or a number of steps (batch hooks: not under ParameterServer).
        delete_checkpoint: delete the backup when training finishes.

    Raises:
        ValueError: a directory that cannot be written, a bad ``save_freq``, or a job whose
            TF_CONFIG or tasks would make more than one chief (then refused when training starts).

    Example:
        >>> model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=20,  # doctest: +SKIP
        ...           callbacks=[tfpar.callbacks.FaultTolerance("/shared/run-17/backup")])
    """

    def __init__(self, backup_dir, save_freq="epoch", delete_checkpoint=True):
        super().__init__()
        if save_freq != "epoch":
            check_number("save_freq", save_freq, minimum=1, integer=True,
                         hint=' Use "epoch", or a number of steps between backups.')
        ClusterInfo.from_tf_config()  # a TF_CONFIG that makes several chiefs (no "index") fails here
        _check_writable(backup_dir)
        _tell_the_launcher()
        self.backup_dir, self.save_freq, self.delete_checkpoint = backup_dir, save_freq, delete_checkpoint
        self._backup = None  # Keras' BackupAndRestore for the model's Keras, made at set_model
        self.resumed_at_epoch = None
        """The epoch (0-based) this run resumed at, or None for a fresh start."""

    def set_model(self, model):
        super().set_model(model)
        if self._backup is None or is_keras3(self._backup) != is_keras3(model):
            make = _keras3_backup if is_keras3(model) else _TfKerasBackup
            self._backup = make(self.backup_dir, save_freq=self.save_freq, delete_checkpoint=self.delete_checkpoint)
        self._backup.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        if self._backup is not None:
            self._backup.set_params(params)

    def _implements_train_batch_hooks(self):
        return self._backup._implements_train_batch_hooks()

    def on_train_begin(self, logs=None):
        _refuse_several_chiefs(_strategy_of(self.model), self.backup_dir)
        self.resumed_at_epoch = None
        self._first_epoch = True
        self._backup.on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None):
        if self._first_epoch:
            self._first_epoch = False
            if epoch > 0:
                self.resumed_at_epoch = epoch
                chief_print(self.model, f"tfpar: resumed from the backup in {self.backup_dir} at epoch {epoch + 1}")
        self._backup.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._backup.on_epoch_end(epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
        self._backup.on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        self._backup.on_train_batch_end(batch, logs)

    def on_train_end(self, logs=None):
        self._backup.on_train_end(logs)


def _tell_the_launcher():
    """Under ``tfpar launch --max-restarts``: marks that this job backs up, so a restart resumes."""
    from tfpar.launch import FAULT_TOLERANCE_MARK, STATE_VARIABLE

    folder = os.environ.get(STATE_VARIABLE)
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, FAULT_TOLERANCE_MARK), "a"):
            pass


class _TfKerasBackup(keras.callbacks.BackupAndRestore):
    """tf_keras' own: on several workers the chief writes the backup, the others temporary copies."""


def _strategy_of(model):
    return getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()


def _keras3_backup(backup_dir, **kwargs):
    """Keras 3's BackupAndRestore, written by the chief only (Keras 3 lets every worker write the
    one path), kept in two copies so that a crash while saving leaves the previous one."""
    base = keras3().callbacks.BackupAndRestore

    class Keras3Backup(base):
        def _chief(self):
            return _strategy_of(self.model).extended.should_checkpoint

        def _save_model(self):
            if self._chief():
                super()._save_model()

        def on_train_end(self, logs=None):
            if self._chief():
                super().on_train_end(logs)

        def _implements_train_batch_hooks(self):
            return self.save_freq != "epoch"

    return Keras3Backup(backup_dir, double_checkpoint=True, **kwargs)
