"""``tfpar demo --qat`` and ``--compress``: the trained digits model made deployable through
TFMOT (quantization-aware training; pruning, clustering and QAT that keeps both), exported as
TFLite and compared with the float model."""

from dataclasses import dataclass
from typing import Any

from tfpar._keras import keras

__all__ = [
    "QAT_EPOCHS",
    "TrainedRun",
    "compress_and_export",
    "compress_chain",
    "quantize_and_export",
]

QAT_EPOCHS = 3
"""Epochs of quantization-aware fine-tuning after the float training (``--qat``), and of each
stage of ``--compress``'s chain."""


@dataclass(frozen=True)
class TrainedRun:
    """What the float training leaves to the fine-tuning and export steps after it."""

    dist: Any
    """The strategy the model trained under (its input strategy)."""
    train: Any
    """The training input, a `tfpar.data.distribute` result."""
    val: Any
    """The validation input, likewise."""
    x_train: Any
    """The training features: representative data for int8 calibration."""
    validation: tuple
    """``(x_val, y_val)``, to measure the exported models."""
    learning_rate: float
    verbose: int
    chief: bool
    """Whether this process reports (and exports)."""


def quantize_and_export(float_model: Any, run: TrainedRun) -> tuple:
    """QAT fine-tuning of the trained ``float_model``, then float and int8 TFLite files compared."""
    import os
    import tempfile

    from tfpar.quantization import export_tflite, quantize

    with run.dist.scope():
        qat_model = quantize(float_model)
        qat_model.compile(
            optimizer=keras.optimizers.Adam(run.learning_rate / 4),
            loss="sparse_categorical_crossentropy",
            weighted_metrics=["accuracy"],
        )
    qat_model.fit(
        run.train.dataset,
        steps_per_epoch=run.train.steps_per_epoch,
        epochs=QAT_EPOCHS,
        validation_data=run.val.dataset,
        validation_steps=run.val.steps_per_epoch,
        verbose=run.verbose,
    )
    if not run.chief:
        return ()
    x_val, y_val = run.validation
    lines = []
    with tempfile.TemporaryDirectory(prefix="tfpar-demo-") as folder:  # the demo keeps no files
        exports = {
            "float32": export_tflite(
                float_model, os.path.join(folder, "digits_float.tflite"), int8=False
            ),
            "int8 (QAT)": export_tflite(
                qat_model,
                os.path.join(folder, "digits_int8.tflite"),
                representative_data=run.x_train[:200],
            ),
        }
        for name, export in exports.items():
            accuracy = export.accuracy(x_val, y_val)
            lines.append(
                f"TFLite {name:<11} accuracy {accuracy:.4f}, {export.size_bytes:,} bytes "
                f"({os.path.basename(export.path)})"
            )
    ratio = exports["float32"].size_bytes / exports["int8 (QAT)"].size_bytes
    return (*lines, f"TFLite size ratio float/int8: {ratio:.2f}")


def compress_chain(
    float_model: Any,
    strategy: Any,
    train: Any,
    *,
    sparsity: float = 0.75,
    clusters: int = 16,
    epochs: int = QAT_EPOCHS,
    learning_rate: float = 1e-3,
    verbose: int = 0,
) -> Any:
    """TFMOT's collaborative optimization of a trained float model, under ``strategy``: pruning
    to ``sparsity`` (reached after ``epochs - 1`` epochs), clustering into ``clusters`` values per
    kernel that keeps the zeros, then QAT that keeps both; ``epochs`` epochs each, on ``train``
    (a `tfpar.data.distribute` result). Returns the QAT model, ready for `export_tflite`."""
    from tfpar.quantization import cluster, prune, quantize

    def fit(model, callbacks=()):
        with strategy.scope():
            model.compile(
                optimizer=keras.optimizers.Adam(learning_rate),
                loss="sparse_categorical_crossentropy",
                weighted_metrics=["accuracy"],
            )
        model.fit(
            train.dataset,
            steps_per_epoch=train.steps_per_epoch,
            epochs=epochs,
            callbacks=list(callbacks),
            verbose=verbose,
        )
        return model

    steps = train.steps_per_epoch
    with strategy.scope():
        pruned, callbacks = prune(
            float_model,
            sparsity,
            end_step=max(1, (epochs - 1) * steps),
            frequency=max(1, steps // 4),
        )
    fit(pruned, callbacks)
    with strategy.scope():
        clustered = fit(cluster(pruned, clusters, preserve_sparsity=True))
    with strategy.scope():
        return fit(quantize(clustered, preserve=("clusters", "sparsity")))


def compress_and_export(float_model: Any, run: TrainedRun) -> tuple:
    """`compress_chain` on the trained ``float_model``, exported with its deployment report."""
    import os
    import tempfile

    from tfpar.quantization import export_tflite
    from tfpar.quantization.deploy import AccuracyDropError

    compressed = compress_chain(
        float_model, run.dist, run.train, learning_rate=run.learning_rate / 2, verbose=run.verbose
    )
    if not run.chief:
        return ()
    with tempfile.TemporaryDirectory(prefix="tfpar-demo-") as folder:  # the demo keeps no files
        try:
            export = export_tflite(
                compressed,
                os.path.join(folder, "digits_compressed.tflite"),
                representative_data=run.x_train[:200],
                compress=True,
                validation_data=run.validation,
                reference=float_model,
                max_accuracy_drop=0.01,
            )
        except AccuracyDropError as refused:
            return (
                "compressed (pruned 75 %, 16 clusters, int8): refused",
                *str(refused).splitlines(),
            )
    report: Any = export.report
    return (
        "compressed (pruned 75 %, 16 clusters, int8), against the float model:",
        *report.describe().splitlines(),
    )
