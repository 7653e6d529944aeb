"""`PipelineBubble`: the measured pipeline bubble next to the theoretical one, per epoch."""

from tfpar._keras import keras, tf

__all__ = ["PipelineBubble"]


class PipelineBubble(keras.callbacks.Callback):
    """Logs ``bubble`` (measured) and ``bubble_theory`` (the schedule's ``bubble_fraction``:
    (p-1)/(m+p-1) for GPipe and 1F1B) at each epoch's end.

    The measured figure is 1 - (mean stage busy time ÷ step span), from the
    timestamps a `PipelineModel` takes around every forward and backward (and weight
    pass, under a zero-bubble schedule) of every microbatch. Both go to the Keras logs (so to the
    progress bar, History and TensorBoard callbacks) and, with ``log_dir``, to TensorBoard scalars
    ``pipeline/bubble`` and ``pipeline/bubble_theory``.

    Args:
        log_dir: a TensorBoard directory, or None.

    Raises:
        TypeError: at the start of training, if the model is not a `PipelineModel`.

    Examples:
        >>> staged.fit(x, y, epochs=3,  # doctest: +SKIP
        ...            callbacks=[tfpar.callbacks.PipelineBubble()])
    """

    def __init__(self, log_dir: str | None = None) -> None:
        super().__init__()
        self.log_dir = log_dir
        self._writer = None

    def on_train_begin(self, logs=None):
        from tfpar.pipeline.model import PipelineModel

        if not isinstance(self.model, PipelineModel):
            raise TypeError(
                "PipelineBubble needs a model from Pipeline.stage(). Received: "
                f"{type(self.model).__name__}."
            )
        if self.log_dir is not None:
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_epoch_begin(self, epoch, logs=None):
        self.model.pipeline_timing.assign(tf.zeros([2], tf.float64))

    def on_epoch_end(self, epoch, logs=None):
        busy, span = self.model.pipeline_timing.numpy()
        measured = float(1 - busy / span) if span > 0 else float("nan")
        theory = self.model.schedule.bubble_fraction
        if logs is not None:
            logs["bubble"] = measured
            logs["bubble_theory"] = theory
        if self._writer is not None:
            with self._writer.as_default():
                tf.summary.scalar("pipeline/bubble", measured, step=epoch)
                tf.summary.scalar("pipeline/bubble_theory", theory, step=epoch)
            self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
