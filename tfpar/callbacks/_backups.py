"""The backups `FaultTolerance` drives: each Keras' own ``BackupAndRestore``, whose real backup the
chief alone writes, and which tells FaultTolerance after each backup the epoch and step its run
continues at."""

import json
import os
import tempfile

from tfpar._keras import keras, keras3, tf

__all__ = ["TfKerasBackup", "keras3_backup", "strategy_of"]


class TfKerasBackup(keras.callbacks.BackupAndRestore):
    """tf_keras' own: on several workers the chief writes the backup, the others temporary
    copies."""

    tfpar_saved = None  # FaultTolerance._saved

    def _backup(self, epoch, batch=0):
        super()._backup(epoch, batch)
        steps = self.params.get("steps")
        epoch, step = (
            (epoch + 1, 0)
            if self.save_freq == "epoch" or (steps and batch + 1 >= steps)
            else (epoch, batch + 1)
        )
        if self.tfpar_saved is not None and strategy_of(self.model).extended.should_checkpoint:
            self.tfpar_saved(epoch, step, epoch >= self.params.get("epochs", 0))


def strategy_of(model):
    """The strategy ``model`` was built under, else the current one."""
    return getattr(model, "distribute_strategy", None) or tf.distribute.get_strategy()


def keras3_backup(backup_dir, **kwargs):
    """Keras 3's BackupAndRestore, written by the chief only (Keras 3 lets every worker write the
    one path), kept in two copies so that a crash while saving leaves the previous one, and with
    the step its run continues at (Keras 3 records the epoch only, and restarts it)."""
    base = keras3().callbacks.BackupAndRestore

    class Keras3Backup(base):
        _next = (0, 0)
        tfpar_saved = None  # FaultTolerance._saved

        def _chief(self):
            return strategy_of(self.model).extended.should_checkpoint

        def on_epoch_begin(self, epoch, logs=None):
            self._current_epoch = epoch  # Keras 3 counts from 0 again after a resume

        def on_epoch_end(self, epoch, logs=None):
            self._next = (epoch + 1, 0)
            super().on_epoch_end(epoch, logs)

        def on_train_batch_end(self, batch, logs=None):
            steps = self.params.get("steps")
            self._next = (
                (self._current_epoch + 1, 0)
                if steps and batch + 1 >= steps
                else (self._current_epoch, batch + 1)
            )
            super().on_train_batch_end(batch, logs)

        def _save_model(self):
            if not self._chief():
                _save_in_step(self.model, self.backup_dir)
                return
            super()._save_model()
            with open(self._training_metadata_path, encoding="utf-8") as f:
                metadata = json.load(f)
            metadata["tfpar_next"] = list(self._next)
            with open(self._training_metadata_path, "w", encoding="utf-8") as f:
                json.dump(metadata, f)
            if self.tfpar_saved is not None:
                self.tfpar_saved(*self._next, self._next[0] >= self.params.get("epochs", 0))

        def resume_point(self, initial_epoch):
            """``(epoch, step)`` the restored run continues at (``initial_epoch, 0`` without a
            backup)."""
            if not os.path.exists(self._training_metadata_path):
                return initial_epoch, 0
            with open(self._training_metadata_path, encoding="utf-8") as f:
                metadata = json.load(f)
            epoch, step = metadata.get("tfpar_next", (metadata["epoch"], 0))
            return epoch, step

        def on_train_end(self, logs=None):
            if self._chief():
                super().on_train_end(logs)

        def _implements_train_batch_hooks(self):
            return self.save_freq != "epoch"

    return Keras3Backup(backup_dir, double_checkpoint=True, **kwargs)


def _save_in_step(model, backup_dir):
    """A Keras 3 worker but the chief writes no backup; but writing one gathers a sharded
    optimizer state (ZeRO) from every worker, in collectives each must run: there it writes a
    copy, in step with the chief, and deletes it (as tf_keras' workers do)."""
    if getattr(model, "_tfpar_zero", None) is None:
        return
    os.makedirs(backup_dir, exist_ok=True)  # its file system, not a small /tmp
    with tempfile.TemporaryDirectory(prefix="workertemp_", dir=backup_dir) as scratch:
        model.save_weights(os.path.join(scratch, "latest.weights.h5"))
