"""``tfpar demo``: the main job. A small CNN on the UCI digits.

The digits (1,797 8x8 images, scikit-learn's ``load_digits``) ship with tfpar (`DIGITS_FILE`), so
nothing is downloaded. Training runs under a tfpar strategy with input from
`tfpar.data`, shows the Keras progress bar, and ends with a summary.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

from tfpar._checks import check_choice, check_int, default_epochs
from tfpar._factory import STRATEGIES, ParallelismSpec
from tfpar._keras import keras, keras3, tf
from tfpar._topology import topology_of
from tfpar.data import distribute
from tfpar.demo.compression import (
    TrainedRun,
    compress_and_export,
    compress_chain,
    quantize_and_export,
)
from tfpar.demo.digits import DIGITS_FILE, digits_dataset, digits_validation_dataset, load_digits
from tfpar.demo.tokens import token_data, transformer

__all__ = [
    "DemoResult",
    "STRATEGIES",
    "build_model",
    "digits_validation_dataset",
    "token_data",
    "transformer",
    "compiled_model",
    "compress_chain",
    "default_epochs",
    "DIGITS_FILE",
    "digits_dataset",
    "load_digits",
    "run_demo",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoResult:
    """What a demo run measured."""

    strategy: str
    """The strategy's `describe()` text."""
    epochs: int
    """Epochs trained."""
    val_accuracy: float
    """Validation accuracy after the last epoch."""
    examples_per_second: float
    """Training examples per second over the epochs after the first (which traces)."""
    notes: tuple = ()
    """Further lines for the summary (e.g. the pipeline's bubble)."""

    def describe(self) -> str:
        """The text the demo prints at the end."""
        return "\n".join(
            [
                "=" * 60,
                self.strategy,
                f"epochs:              {self.epochs}",
                f"validation accuracy: {self.val_accuracy:.4f}",
                f"examples/second:     {self.examples_per_second:,.0f}",
                *self.notes,
                "=" * 60,
            ]
        )


def build_model(k: Any = None) -> Any:
    """A small convolutional network for 8x8 digits (85k parameters), in Keras ``k`` (default
    tf_keras, `tfpar.keras`; or the Keras 3 module)."""
    k = k or keras
    return k.Sequential(
        [
            k.layers.Input((8, 8, 1)),
            k.layers.Conv2D(32, 3, padding="same", activation="relu"),
            k.layers.Conv2D(64, 3, padding="same", activation="relu"),
            k.layers.MaxPooling2D(),
            k.layers.Flatten(),
            k.layers.Dense(64, activation="relu"),
            k.layers.Dense(10),
            # float32 output under any precision policy: the loss is computed in float32.
            k.layers.Activation("softmax", dtype="float32"),
        ],
        name="digits_cnn",
    )


def compiled_model(k: Any = None, learning_rate: float = 2e-3) -> Any:
    """`build_model` compiled as the demo compiles it: ``tfpar verify --model
    tfpar.demo:compiled_model``."""
    k = k or keras
    model = build_model(k)
    model.compile(
        optimizer=k.optimizers.Adam(learning_rate),
        loss="sparse_categorical_crossentropy",
        weighted_metrics=["accuracy"],  # masks tfpar.data's padding
    )
    return model


def run_demo(
    *,
    strategy: str = "data_parallel",
    num_devices: int | None = None,
    epochs: int = 8,
    global_batch_size: int | None = None,
    learning_rate: float = 2e-3,
    verbose: int = 1,
    print_fn: Callable[[str], Any] = print,
    replicas: int = 1,
    microbatches: int = 8,
    precision: str = "float32",
    qat: bool = False,
    keras_version: int = 2,
    report_dir: str | None = None,
    compression: str = "none",
    compress: bool = False,
    zero_stage: int = 0,
) -> "DemoResult":
    """Trains the digits CNN (under "tensor_parallel": the token transformer, `transformer`, on
    generated tokens) and returns a `DemoResult`.

    Args:
        strategy: one of `STRATEGIES`.
        num_devices: virtual CPU devices when there is no GPU (default:
            ``$TFPAR_NUM_CPU_DEVICES``, else 2); ignored by "horovod", whose
            ranks are started by ``tfpar demo`` through horovodrun.
        epochs: epochs to train, >= 1.
        global_batch_size: examples per step across all replicas (default:
            32 per replica).
        learning_rate: Adam's learning rate.
        verbose: Keras verbosity (1: progress bar; under "parameter_server" it becomes 2, a line per
            epoch, as Keras allows no progress bar there).
        print_fn: where the summary goes.
        replicas: "pipeline" only: data-parallel copies of the 2-stage pipeline.
        microbatches: "pipeline" only: microbatches per replica and step.
        precision: a `tfpar.precision.POLICIES` name for the training.
        qat: after training, fine-tune with quantization-aware training (float32), export
            float and int8 TFLite models and compare their accuracy and size.
        keras_version: 2 (tf_keras, `tfpar.keras`) or 3 (Keras 3): the Keras the model is built in.
        report_dir: a folder for the run's `tfpar.callbacks.Timeline` and `tfpar.report` plots
            (made if missing, checked before training); their paths end the summary.
        compression: "data_parallel" and "horovod": the gradients on the wire ("none", "bf16",
            "fp16").
        compress: after training, the deployable chain (`compress_chain`: pruning, clustering
            that keeps the zeros, cluster- and sparsity-preserving QAT), exported as int8 TFLite
            with its deployment report against the float model (refused above 1 point of
            accuracy lost).
        zero_stage: "data_parallel": the optimizer state sharded over the replicas (ZeRO 1 or 2),
            or the parameters too (3).

    Raises:
        ValueError: on an unknown strategy, epochs < 1, a batch that does not divide by the
            number of replicas, or Keras 3 with a strategy or --qat that needs tf_keras.
    """
    _check_options(strategy, epochs, keras_version, qat, compress)
    k = keras3() if keras_version == 3 else keras
    timeline = _timeline(report_dir)
    from tfpar import precision as precision_module

    policy = precision_module.use(precision)
    parallelism = ParallelismSpec(
        kind=strategy,
        devices=num_devices,
        replicas=replicas,
        microbatches=microbatches,
        compression=compression,
        balance="time" if strategy == "pipeline" else "params",
        zero_stage=zero_stage,
    ).build()
    dist = parallelism.input_strategy
    k.utils.set_random_seed(0)
    # Tensor parallelism splits a transformer's layers: the token model and its generated tokens.
    tokens = strategy == "tensor_parallel"
    (x_train, y_train), (x_val, y_val) = (
        (token_data(4096), token_data(512, seed=1)) if tokens else load_digits()
    )
    chief = dist.extended.should_checkpoint
    if not chief:  # one progress bar and one summary: the chief's
        verbose = 0
        print_fn = _say_nothing
    if verbose == 1 and topology_of(dist).coordinator:
        verbose = 2  # Keras refuses a progress bar under parameter servers: one line per epoch
    model = _compiled_model(parallelism, k, tokens, learning_rate)
    replicas_in_step = parallelism.num_replicas_in_sync
    global_batch_size = global_batch_size or 32 * replicas_in_step
    description = _description(parallelism, global_batch_size, model, policy, k, keras_version)
    print_fn(description)
    train = _input(
        x_train, y_train, parallelism, global_batch_size, shuffle_buffer=len(x_train), seed=0
    )
    val = _input(x_val, y_val, parallelism, global_batch_size)
    callbacks = _callbacks(
        model, epochs, learning_rate, replicas_in_step, global_batch_size, timeline
    )
    history = _fit(model, train, val, epochs, callbacks, verbose)
    notes = _training_notes(history, timeline if chief else None, report_dir)
    if qat or compress:
        float_model = _float_copy(model, dist, precision_module)
        run = TrainedRun(dist, train, val, x_train, (x_val, y_val), learning_rate, verbose, chief)
        notes += quantize_and_export(float_model, run) if qat else ()
        notes += compress_and_export(float_model, run) if compress else ()
    result = DemoResult(
        strategy=description,
        epochs=epochs,
        val_accuracy=float(history.history["val_accuracy"][-1]),
        examples_per_second=_examples_per_second(history, len(x_train), train.steps_per_epoch),
        notes=notes,
    )
    print_fn(result.describe())
    return result


def _say_nothing(*_):
    """The summary's printer on a process that is not the chief."""


def _timeline(report_dir):
    """A `Timeline` writing into ``report_dir`` (checked before training), or None."""
    if report_dir is None:
        return None
    from tfpar.callbacks.timeline import Timeline, timeline_in

    return Timeline(timeline_in(report_dir, "report_dir"))


def _compiled_model(parallelism, k, tokens, learning_rate):
    """The demo's model built by ``parallelism`` and compiled in its scope."""
    model = parallelism.build(lambda: transformer(k) if tokens else build_model(k))
    with parallelism.scope():
        model.compile(
            optimizer=k.optimizers.Adam(learning_rate),
            loss=k.losses.SparseCategoricalCrossentropy(from_logits=tokens),
            weighted_metrics=["accuracy"],  # masks tfpar.data's padding
        )
    return model


def _input(x, y, parallelism, global_batch_size, **options):
    """``(x, y)`` as `tfpar.data.distribute` gives it to ``parallelism`` with ``options``: from a
    function, not a dataset, since parameter-server workers build their input themselves."""
    return distribute(
        lambda: tf.data.Dataset.from_tensor_slices((x, y)),
        parallelism,
        global_batch_size,
        **options,
    )


def _fit(model, train, val, epochs, callbacks, verbose):
    return model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=epochs,
        validation_data=val.dataset,
        validation_steps=val.steps_per_epoch,
        callbacks=callbacks,
        verbose=verbose,
        shuffle=False,  # tfpar.data shuffled it; Keras 3 warns that it cannot shuffle a dataset
    )


def _description(parallelism, global_batch_size, model, policy, k, keras_version):
    """What runs: the parallelism's description, the precision policy and the Keras."""
    keras_name = "Keras 3" if keras_version == 3 else "tf_keras"
    return (
        parallelism.describe(global_batch_size=global_batch_size, model=model)
        + f"\n  precision:  {policy}\n  keras:      {keras_name} {k.__version__}"
    )


def _examples_per_second(history, examples, steps_per_epoch):
    """From Throughput's step times, the first epoch (it traces) left out when there are others."""
    step_times = history.history["step_time"]
    steady = [t * steps_per_epoch for t in (step_times[1:] or step_times)]
    return examples * len(steady) / sum(steady)


def _check_options(strategy, epochs, keras_version, qat, compress):
    """Refuses, before anything is built, what the demo cannot run."""
    check_choice("strategy", strategy, STRATEGIES, what="demo strategy")
    check_int("epochs", epochs, 1)
    check_choice("keras_version", keras_version, (2, 3))
    flags = " ".join(flag for flag, on in (("--qat", qat), ("--compress", compress)) if on)
    if flags and strategy not in ("data_parallel", "horovod"):
        raise ValueError(
            f"{flags} runs with the data_parallel or horovod strategy. Received: --strategy "
            f"{strategy}."
        )
    if keras_version == 3 and (strategy == "parameter_server" or flags):
        raise ValueError(
            "--keras 3 runs with --strategy data_parallel, horovod, pipeline or tensor_parallel, "
            "without --qat or --compress: parameter servers in fit and TFMOT's compression need "
            "tf_keras (README, Keras 3 and tf_keras). Received: --keras 3 --strategy "
            f"{strategy}{' ' + flags if flags else ''}. Leave out --keras 3 for those."
        )


def _callbacks(model, epochs, learning_rate, replicas, global_batch_size, timeline):
    """The demo's callbacks. The linear scaling rule: Adam's rate is ``learning_rate`` for the whole
    global batch, reached over 2 warm-up epochs from ``learning_rate / replicas``; the throughput
    shows in the progress bar; a pipeline's bubble is measured."""
    from tfpar.callbacks import LearningRateWarmup, PipelineBubble, Throughput
    from tfpar.pipeline import PipelineModel

    callbacks = [
        LearningRateWarmup(
            warmup_epochs=min(2, epochs), initial_lr=learning_rate / replicas, scale=replicas
        ),
        Throughput(global_batch_size),
    ]
    if isinstance(model, PipelineModel):
        callbacks.append(PipelineBubble())
    if timeline is not None:
        callbacks.append(timeline)
    return callbacks


def _training_notes(history, timeline, report_dir):
    """The summary's lines on the training: a pipeline's bubble, and the chief's ``timeline`` and
    plots (None elsewhere)."""
    notes: tuple[str, ...] = ()
    if "bubble" in history.history:
        notes += (
            f"bubble: measured {history.history['bubble'][-1]:.3f} "
            f"(theory {history.history['bubble_theory'][-1]:.3f})",
        )
    if timeline is not None and report_dir is not None:
        from tfpar.report import report

        notes += (
            f"timeline: {timeline.path} (open it in https://ui.perfetto.dev)",
            *(f"plot:     {path}" for path in report(report_dir)),
        )
    return notes


def _float_copy(model, dist, precision_module):
    """``model`` rebuilt in float32 with its trained weights (the training may have been mixed):
    quantization-aware training emulates int8 in float32."""
    precision_module.use("float32")
    with dist.scope():
        float_model = build_model()
        float_model.set_weights(model.get_weights())
    return float_model
