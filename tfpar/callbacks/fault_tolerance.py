"""`FaultTolerance`: back up at every epoch and resume after a relaunch, safely with many
workers."""

import json
import os
import time
import uuid
import warnings

from tfpar import _compat
from tfpar._checks import check_number
from tfpar._files import write_atomically
from tfpar._keras import is_keras3, keras, tf
from tfpar._parallelism import sum_over_workers
from tfpar._tasks.env import (
    BACKUP_MARK,
    FAULT_TOLERANCE_MARK,
    GROW_REQUEST,
    STATE_VARIABLE,
)
from tfpar.callbacks._backups import TfKerasBackup, keras3_backup, strategy_of
from tfpar.callbacks._hooks import chief_print
from tfpar.callbacks.elastic_rate import rescale_learning_rate
from tfpar.cluster import ClusterInfo
from tfpar.data.resume import position_of, rescaled_resume

__all__ = ["FaultTolerance"]

INPUT_LAYOUT = "tfpar_input.json"
"""The file beside the backup that records how the input's steps were made
(`tfpar.data.resume.layout_of`)."""


def _check_writable(directory):
    """Creates ``directory`` if needed and writes a probe file there, so that a bad path fails
    now."""
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".tfpar-write-probe-{uuid.uuid4().hex}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as error:
        raise ValueError(
            f"The checkpoint directory {directory!r} cannot be written "
            f"({error.strerror or error}). Received: backup_dir={directory!r}. Give a directory "
            "every worker can write (on several hosts, a shared file system), so that a run does "
            "not fail only when it first saves."
        ) from None


def _refuse_several_chiefs(strategy, backup_dir):
    """Counts the workers that believe they are the chief (one collective, multi-worker only):
    two would write and delete one backup, each undoing the other's."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return  # one process (or Horovod: rank 0; or parameter servers: the coordinator) saves
    chiefs = int(sum_over_workers(strategy, 1 if strategy.extended.should_checkpoint else 0))
    if chiefs != 1:
        raise ValueError(
            f"FaultTolerance needs exactly one chief to write {backup_dir}, and {chiefs} workers "
            "of this job believe they are it. Received: a cluster whose tasks do not agree on "
            'their roles. Give each task its own TF_CONFIG "task" (type and index); tfpar launch '
            "does."
        )


class _EndOfResumedEpoch:
    """``model.stop_training`` while a callback ends a resumed epoch that Keras would run whole
    (FaultTolerance under Keras 3, `tfpar.integrations.horovod`'s position under both): true, so
    that Keras leaves the epoch, and not ``True``, so that the callback can tell it from another
    callback's request to stop, whichever of them runs first."""

    def __bool__(self):
        return True

    def __repr__(self):
        return "True (tfpar: the end of a resumed epoch)"


END_OF_RESUMED_EPOCH = _EndOfResumedEpoch()


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
    writable when the callback is built. Beside the backup the chief records how a
    `tfpar.data.distribute` input's steps are made (``tfpar_input.json``), so that a
    resume in the middle of an epoch on another number of workers continues at the
    same example, or is refused when it cannot. Under an elastic ``tfpar launch``
    that waits to grow the job, the chief waits after its next backup to be restarted.

    Args:
        backup_dir: where the backup lives (the same path on every worker).
        save_freq: "epoch", or a number of steps (batch hooks: not under ParameterServer).
        delete_checkpoint: delete the backup when training finishes.

    Raises:
        ValueError: a directory that cannot be written, a bad ``save_freq``, or a job whose
            TF_CONFIG or tasks would make more than one chief (then refused when training starts);
            when training starts, a mid-epoch resume whose steps would hold other examples than the
            backed-up run's (another global batch; FILE shards on another number of workers).

    Examples:
        >>> model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch,  # doctest: +SKIP
        ...           epochs=20,
        ...           callbacks=[tfpar.callbacks.FaultTolerance("/shared/run-17/backup")])
    """

    def __init__(
        self, backup_dir: str, save_freq: str | int = "epoch", delete_checkpoint: bool = True
    ) -> None:
        super().__init__()
        if save_freq != "epoch":
            check_number(
                "save_freq",
                save_freq,
                minimum=1,
                integer=True,
                hint=' Use "epoch", or a number of steps between backups.',
            )
        # a TF_CONFIG that makes several chiefs (no "index") fails here
        ClusterInfo.from_tf_config()
        _check_writable(backup_dir)
        _tell_the_launcher()
        self.backup_dir = backup_dir
        self.save_freq = save_freq
        self.delete_checkpoint = delete_checkpoint
        self._backup = None  # Keras' BackupAndRestore for the model's Keras, made at set_model
        self.resumed_at_epoch = None
        """The epoch (0-based) this run resumed at, or None for a fresh start."""
        self.resumed_at_step = None
        """The step (0-based) of that epoch it resumed at, or None for a fresh start."""

    def set_model(self, model):
        super().set_model(model)
        if self._backup is None or is_keras3(self._backup) != is_keras3(model):
            make = keras3_backup if is_keras3(model) else TfKerasBackup
            self._backup = make(
                self.backup_dir, save_freq=self.save_freq, delete_checkpoint=self.delete_checkpoint
            )
        self._backup.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        if self._backup is not None:
            self._backup.set_params(params)

    def _implements_train_batch_hooks(self):
        return self._backup._implements_train_batch_hooks()

    def on_train_begin(self, logs=None):
        _refuse_several_chiefs(strategy_of(self.model), self.backup_dir)
        self._backup.on_train_begin(logs)
        given = _compat.fit_arguments(self.model) or {}
        x, initial_epoch = given.get("x"), given.get("initial_epoch") or 0
        steps = self.params.get("steps")
        if is_keras3(self.model):
            epoch, step = self._backup.resume_point(initial_epoch)
            # Keras 3's fit reads it after on_train_begin
            _compat.keras3_start_at_epoch(self.model, epoch)
        else:
            epoch, step = _compat.tf_keras_resume_point(self.model, steps, initial_epoch)
        self.resumed_at_epoch = epoch if (epoch, step) != (initial_epoch, 0) else None
        self.resumed_at_step = step if self.resumed_at_epoch is not None else None
        position = position_of(x)
        masked = 0
        if position is not None:
            step, masked = self._resume_point(position, step)
            if masked and not is_keras3(self.model):
                _compat.tf_keras_set_resume_point(self.model, epoch, step, steps)
            position.start_at(epoch, step, steps, masked)
        self._epoch, self._skipped = None, (epoch, step) if step else None
        self._backup.tfpar_saved = self._saved
        self._layout = position.layout if position is not None else None
        if self.save_freq != "epoch" and (position is None or not position.exact):
            _warn_inexact(self.save_freq, x, position)
        if self.resumed_at_epoch is not None:
            where = f"epoch {epoch + 1}" + (
                f", step {self.resumed_at_step + 1}" if self.resumed_at_step else ""
            )
            if masked:
                where += (
                    f" (its example {masked + 1}, in step {step + 1} of this job's global batches "
                    f"of {position.layout['global_batch_size']})"
                )
            chief_print(
                self.model, f"tfpar: resumed from the backup in {self.backup_dir} at {where}"
            )

    def _resume_point(self, position, step):
        """``(step, masked)`` this run continues at (`tfpar.data.resume.rescaled_resume`: another
        global batch of an elastic job converted to this one's steps), from the input's layout
        recorded beside the backup; the learning rate put on this job's scale
        (`tfpar.callbacks.elastic_rate.rescale_learning_rate`)."""
        path = os.path.join(self.backup_dir, INPUT_LAYOUT)
        if self.resumed_at_epoch is None or not os.path.exists(path):
            return step, 0
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        rescale_learning_rate(
            self.model,
            position.layout["learning_rate_factor"],
            saved.get("learning_rate_factor", 1.0),
        )
        return (
            rescaled_resume(saved, position.layout, saved["step"])
            if saved.get("step")
            else (step, 0)
        )

    def _saved(self, epoch, step, last):
        """After the chief's backup, whose run continues at ``step`` of ``epoch``: the input's
        layout beside it, and the launcher told (`_backed_up`); ``last``: training's last backup."""
        if self._layout is not None:
            write_atomically(
                os.path.join(self.backup_dir, INPUT_LAYOUT),
                json.dumps({**self._layout, "epoch": int(epoch), "step": int(step)}),
            )
        _backed_up(last)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._backup.on_epoch_begin(epoch, logs)

    def on_epoch_end(self, epoch, logs=None):
        # ours to end, and no other callback asked to stop
        if self.model.stop_training is END_OF_RESUMED_EPOCH:
            self.model.stop_training = False
        self._backup.on_epoch_end(epoch, logs)

    def _step(self, batch):
        """The step of the epoch ``batch`` is: Keras 3 numbers a resumed epoch's steps from 0."""
        if self._skipped is not None and self._skipped[0] == self._epoch and is_keras3(self.model):
            return batch + self._skipped[1]
        return batch

    def on_train_batch_begin(self, batch, logs=None):
        self._backup.on_train_batch_begin(self._step(batch), logs)

    def on_train_batch_end(self, batch, logs=None):
        step = self._step(batch)
        self._backup.on_train_batch_end(step, logs)
        if step != batch and step + 1 >= self.params["steps"]:
            # Keras 3 runs every epoch from its step 0: the resumed one ends where its steps do.
            self.model.stop_training = END_OF_RESUMED_EPOCH
            self._skipped = None

    def on_train_end(self, logs=None):
        self._backup.on_train_end(logs)
        layout = os.path.join(self.backup_dir, INPUT_LAYOUT)
        if (
            self.delete_checkpoint
            and strategy_of(self.model).extended.should_checkpoint
            and os.path.exists(layout)
        ):
            os.remove(layout)


def _warn_inexact(save_freq, x, position):
    what = (
        "a tfpar.data.distribute input shuffled without a seed, whose order a new process cannot "
        "build again"
        if position is not None
        else f"not a tfpar.data.distribute input (Received: x of type {type(x).__name__})"
    )
    warnings.warn(
        f"FaultTolerance(save_freq={save_freq}) backs up in the middle of epochs, and fit's input "
        f"is {what}. After a resume there, Keras continues at the saved step while the input "
        "starts that epoch's order again, so some examples of that epoch train twice and others "
        "never. Feed fit tfpar.data.distribute(..., seed=N) (its resume continues at the saved "
        'example), or back up at epoch ends (save_freq="epoch").',
        stacklevel=2,
    )


def _tell_the_launcher(mark=FAULT_TOLERANCE_MARK):
    """Under ``tfpar launch --max-restarts`` (or an elastic launch): marks that this job backs up,
    so a restart resumes."""
    folder = os.environ.get(STATE_VARIABLE)
    if folder and os.path.isdir(folder):
        path = os.path.join(folder, mark)
        with open(path, "a"):
            pass
        os.utime(path)


def _backed_up(last):
    """After the chief's backup: marks it for the launcher; if an elastic launch waits to grow the
    job and training goes on after this backup (not ``last``), waits to be stopped
    (`tfpar._tasks.env.GROW_REQUEST`)."""
    folder = os.environ.get(STATE_VARIABLE)
    if not folder:
        return
    _tell_the_launcher(BACKUP_MARK)
    if not last and os.path.exists(os.path.join(folder, GROW_REQUEST)):
        print(
            "tfpar: backed up; the launcher restarts the job with more workers from here",
            flush=True,
        )
        deadline = time.monotonic() + _GROW_WAIT_SECONDS
        while time.monotonic() < deadline and os.path.exists(os.path.join(folder, GROW_REQUEST)):
            time.sleep(0.05)


_GROW_WAIT_SECONDS = 60.0  # the launcher looks every 0.05 s: past this, it decided otherwise
