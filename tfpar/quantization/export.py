"""int8 (or float) TFLite export of a tf_keras model, checked in the TFLite interpreter, and with
``compress=True`` measured against the float model before it is written
(`tfpar.quantization.deploy`).

Examples:
    >>> export = tfpar.quantization.export_tflite(qat, "model.tflite", representative_data=x[:200])
    # doctest: +SKIP
    >>> export.size_bytes, export.predict(x_val[:4])  # doctest: +SKIP
"""

import dataclasses
import os
import tempfile
from typing import Any

import numpy as np

from tfpar._checks import check_number
from tfpar._files import check_folder_of, write_atomically
from tfpar._keras import check_tf_keras_model, tf
from tfpar.quantization import deploy
from tfpar.quantization._tfmot import strip_wrappers

__all__ = ["TFLiteExport", "export_tflite"]


@dataclasses.dataclass(frozen=True)
class TFLiteExport:
    """A TFLite model written by `export_tflite`."""

    path: str
    size_bytes: int
    int8: bool
    """Whether weights, activations, input and output are int8."""
    report: object = None
    """With ``export_tflite(..., compress=True)``: its
    `tfpar.quantization.deploy.DeploymentReport`."""

    def interpreter(self, batch_size: int = 1, builtin_kernels: bool = False) -> Any:
        """A TFLite interpreter on one thread, its input resized to ``batch_size``, with the
        default kernels (the XNNPACK delegate where it applies), or TFLite's built-in kernels
        only (``builtin_kernels=True``)."""
        resolver = tf.lite.experimental.OpResolverType
        interpreter = tf.lite.Interpreter(
            model_path=self.path,
            num_threads=1,
            experimental_op_resolver_type=resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            if builtin_kernels
            else resolver.AUTO,
        )
        detail = interpreter.get_input_details()[0]
        interpreter.resize_tensor_input(detail["index"], [batch_size, *detail["shape"][1:]])
        interpreter.allocate_tensors()
        return interpreter

    @staticmethod
    def model_input(interpreter: Any, x: Any) -> Any:
        """``x`` (float) as ``interpreter``'s input expects it: quantized to int8 with the input's
        scale and zero point for a fully int8 model, else float32."""
        inp = interpreter.get_input_details()[0]
        x = np.asarray(x, np.float32)
        if inp["dtype"] == np.int8:
            scale, zero = inp["quantization"]
            return np.clip(np.round(x / scale + zero), -128, 127).astype(np.int8)
        return x

    def accuracy(self, x: Any, y: Any) -> float:
        """The share of ``x`` whose highest output is its label in ``y`` (class ids, or one-hot),
        in the TFLite interpreter."""
        labels = np.asarray(y)
        labels = labels.argmax(-1) if labels.ndim > 1 else labels.reshape(-1)
        return float((self.predict(x).argmax(-1) == labels).mean())

    def predict(self, x: Any, batch_size: int = 64) -> Any:
        """Runs ``x`` through the TFLite interpreter; returns float outputs (dequantized)."""
        outputs = []
        for start in range(0, len(x), batch_size):
            chunk = x[start : start + batch_size]
            interpreter = self.interpreter(len(chunk))
            inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
            interpreter.set_tensor(inp["index"], self.model_input(interpreter, chunk))
            interpreter.invoke()
            result = interpreter.get_tensor(out["index"])
            if out["dtype"] == np.int8:
                scale, zero = out["quantization"]
                result = (result.astype(np.float32) - zero) * scale
            outputs.append(result)
        return np.concatenate(outputs)


def export_tflite(
    model: Any,
    path: str,
    representative_data: Any = None,
    int8: bool = True,
    *,
    compress: bool = False,
    validation_data: tuple | None = None,
    reference: Any = None,
    max_accuracy_drop: float | None = None,
) -> "TFLiteExport":
    """Writes ``model`` as a TFLite file and checks the interpreter runs it.

    Args:
        model: a tf_keras model (a QAT model from `quantize`, or a float one; pruning and
            clustering wrappers are stripped).
        path: the ``.tflite`` file to write.
        representative_data: input examples (an array, or a list of them) that
            calibrate the int8 ranges: some hundreds drawn from the training data.
        int8: full integer quantization (weights, activations, int8 input and
            output); False writes a float32 TFLite model.
        compress: measure the file before writing it: a `DeploymentReport` (sizes raw and
            gzipped, sparsity and distinct values per weight tensor, accuracy and latency in the
            TFLite interpreter, each against ``reference``'s float TFLite file) in the result's
            ``report``. Needs ``validation_data`` and ``reference``.
        validation_data: ``(x, y)`` held-out examples with class labels (ints, or one-hot).
        reference: the float tf_keras model this one was compressed from.
        max_accuracy_drop: with ``compress``, refuse to write when the accuracy falls by more
            than this (a fraction: 0.01 is one point) below ``reference``'s.

    Returns:
        A `TFLiteExport`.

    Raises:
        ValueError: ``int8`` without ``representative_data``, a ``path`` in no existing folder,
            ``compress`` without ``validation_data`` or ``reference`` (or those without
            ``compress``), a ``max_accuracy_drop`` outside [0, 1].
        AccuracyDropError: (a ValueError) the drop exceeds ``max_accuracy_drop``; nothing was
            written, the figures are in its ``report``.
    """
    check_tf_keras_model(
        model, "tfpar.quantization.export_tflite", "it exports the tf_keras models quantize() makes"
    )
    check_folder_of("path", path)  # before the conversion, which takes seconds
    if int8 and (representative_data is None or len(representative_data) == 0):
        raise ValueError(
            "A fully int8 TFLite model needs representative_data: input examples (a few hundred "
            "from the training set) on which the converter calibrates the ranges of the "
            "activations, input and output. Received: representative_data=None. Pass e.g. "
            "representative_data=x_train[:200], or int8=False for a float model."
        )
    _check_compress_arguments(compress, validation_data, reference, max_accuracy_drop)
    content = _convert(strip_wrappers(model), representative_data, int8)
    if not compress:
        write_atomically(path, content)  # a reader never sees half a model
        return _checked(
            TFLiteExport(path=path, size_bytes=len(content), int8=int8), model, representative_data
        )
    # measured before it is written
    with tempfile.TemporaryDirectory(prefix="tfpar-export-") as folder:
        candidate = TFLiteExport(
            path=os.path.join(folder, "model.tflite"), size_bytes=len(content), int8=int8
        )
        write_atomically(candidate.path, content)
        float_content = _convert(reference, None, False)
        float_file = TFLiteExport(
            path=os.path.join(folder, "float.tflite"), size_bytes=len(float_content), int8=False
        )
        write_atomically(float_file.path, float_content)
        report = deploy.measure(
            _checked(candidate, model, representative_data),
            float_file,
            validation_data,
            max_accuracy_drop,
        )
    if max_accuracy_drop is not None and report.accuracy_drop > max_accuracy_drop:
        raise deploy.AccuracyDropError(
            f"Not written to {path}: in the TFLite interpreter the model's accuracy is "
            f"{report.accuracy:.4f} against {report.reference_accuracy:.4f} for the float model on "
            f"the {report.examples} held-out examples, a drop of {report.accuracy_drop:.4f}. "
            f"Received: max_accuracy_drop={max_accuracy_drop!r}. Fine-tune the compressed model "
            "longer, prune less or use more clusters, or leave the most sensitive layers out "
            "(exclude=[...]); or raise max_accuracy_drop.\n" + report.describe(),
            report,
        )
    write_atomically(path, content)
    return TFLiteExport(path=path, size_bytes=len(content), int8=int8, report=report)


def _check_compress_arguments(compress, validation_data, reference, max_accuracy_drop):
    if not isinstance(compress, bool):
        raise TypeError(f"compress must be True or False. Received: compress={compress!r}.")
    given = [
        name
        for name, value in (
            ("validation_data", validation_data),
            ("reference", reference),
            ("max_accuracy_drop", max_accuracy_drop),
        )
        if value is not None
    ]
    if not compress:
        if given:
            raise ValueError(
                f"{', '.join(given)} only count with compress=True (the deployment report). "
                f"Received: compress=False, {', '.join(given)} given. Pass compress=True."
            )
        return
    missing = [name for name in ("validation_data", "reference") if name not in given]
    if missing:
        raise ValueError(
            "compress=True measures the file against the float model on held-out data, and needs "
            f"{' and '.join(missing)}. Received: {', '.join(f'{name}=None' for name in missing)}. "
            "Pass validation_data=(x_val, y_val) and reference=float_model (the model before "
            "compression)."
        )
    if not (
        isinstance(validation_data, (tuple, list))
        and len(validation_data) == 2
        and len(validation_data[0]) == len(validation_data[1])
        and len(validation_data[0]) > 0
    ):
        raise ValueError(
            "validation_data must be (x, y): held-out inputs and their labels, as many of each. "
            f"Received: validation_data of type {type(validation_data).__name__}."
        )
    check_tf_keras_model(
        reference, "export_tflite's reference", "it is converted to a float TFLite file"
    )
    check_number(
        "max_accuracy_drop",
        max_accuracy_drop,
        minimum=0,
        maximum=1,
        allow_none=True,
        hint=" A fraction: 0.01 allows one point of accuracy.",
    )


def _convert(model, representative_data, int8):
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if int8:
        samples = np.asarray(representative_data, np.float32)

        def representative():
            for sample in samples:
                yield [sample[None]]

        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    return converter.convert()


def _checked(export, model, representative_data):
    """``export``, once the interpreter has run it (raises if it cannot)."""
    probe = (
        np.zeros([1, *model.inputs[0].shape[1:]], np.float32)
        if representative_data is None
        else np.asarray(representative_data[:1], np.float32)
    )
    export.predict(probe)
    return export
