"""`FaultTolerance`: back up at every epoch and resume after a relaunch, safely with many workers."""

import os
import uuid

from tfpar._checks import check_number
from tfpar._keras import keras
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


class FaultTolerance(keras.callbacks.BackupAndRestore):
    """Backs the run up at each epoch's end (or every N steps) and resumes from it after a relaunch.

    Keras' `BackupAndRestore` under every tfpar strategy: with several workers only
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
        ValueError: a directory that cannot be written.

    Example:
        >>> model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=20,  # doctest: +SKIP
        ...           callbacks=[tfpar.callbacks.FaultTolerance("/shared/run-17/backup")])
    """

    def __init__(self, backup_dir, save_freq="epoch", delete_checkpoint=True):
        if save_freq != "epoch":
            check_number("save_freq", save_freq, minimum=1, integer=True,
                         hint=' Use "epoch", or a number of steps between backups.')
        _check_writable(backup_dir)
        super().__init__(backup_dir, save_freq=save_freq, delete_checkpoint=delete_checkpoint)
        self.resumed_at_epoch = None
        """The epoch (0-based) this run resumed at, or None for a fresh start."""

    def on_train_begin(self, logs=None):
        self.resumed_at_epoch = None
        self._first_epoch = True
        super().on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None):
        if self._first_epoch:
            self._first_epoch = False
            if epoch > 0:
                self.resumed_at_epoch = epoch
                chief_print(self.model, f"tfpar: resumed from the backup in {self.backup_dir} at epoch {epoch + 1}")
        super().on_epoch_begin(epoch, logs)
