"""Quantization-aware training (TFMOT's default 8-bit scheme) and int8 TFLite export.

`quantize` wraps a Sequential or Functional tf_keras model in fake-quant ops
(``quantize_annotate_layer`` on every layer but those excluded, then
``quantize_apply``), inside the strategy the model was built under, so that
QAT trains under DataParallel (one host or several workers) like any model.
The quantizers' ranges are moving averages that TensorFlow reduces across
replicas (``assign_moving_average`` averages the replicas' values), so they are
the same on every replica; `quantizer_ranges` reads them per replica.
`export_tflite` writes a fully int8 TFLite model, calibrated on a
representative dataset, and checks that the TFLite interpreter runs it.

Example:
    >>> with strategy.scope():  # doctest: +SKIP
    ...     qat = tfpar.quantization.quantize(model)
    ...     qat.compile(...)
    >>> qat.fit(...)  # doctest: +SKIP
    >>> export = tfpar.quantization.export_tflite(qat, "model.tflite", representative_data=x[:200])  # doctest: +SKIP
    >>> export.size_bytes, export.predict(x_val[:4])  # doctest: +SKIP
"""

import dataclasses

import numpy as np

from tfpar import _compat
from tfpar._files import check_folder_of, write_atomically
from tfpar._keras import check_tf_keras_model, keras, tf

_WHY_TF_KERAS = ("tensorflow-model-optimization, which inserts the fake-quantization ops, "
                 "rewrites tf_keras models only")

__all__ = ["TFLiteExport", "export_tflite", "quantize", "quantizer_ranges"]


def _tfmot():
    import tensorflow_model_optimization as tfmot

    return tfmot


def _check_graph_model(model, what):
    check_tf_keras_model(model, "Pruning" if what == "prune" else "Quantization-aware training", _WHY_TF_KERAS)
    if not _compat.is_graph_network(model):
        raise ValueError(
            f"Cannot {what} the subclassed model {model.name!r} ({type(model).__name__}): "
            "tensorflow-model-optimization rebuilds models layer by layer from their graph, which a "
            "subclassed model's call() does not expose. Write it as a Sequential or Functional "
            "model (a subclassed layer inside is fine with a QuantizeConfig), or annotate its "
            "layers yourself with tfmot.quantization.keras.quantize_annotate_layer.")


def quantize(model, exclude=()):
    """Returns the quantization-aware copy of ``model`` (its weights, fake-quant ops added).

    Call it where the model was built (inside ``strategy.scope()`` or not): the
    new variables are created under the model's own strategy either way.

    Args:
        model: a built Sequential or Functional tf_keras model, float32.
        exclude: names of layers to leave in float.

    Returns:
        The QAT model (not compiled).

    Raises:
        ValueError: a subclassed model, an excluded name that names no layer, or a
            mixed precision policy (TFMOT's quantizers compute in float32: call
            ``tfpar.precision.use("float32")`` first).
    """
    _check_graph_model(model, "quantize")
    policy = keras.mixed_precision.global_policy().name
    if policy != "float32":
        raise ValueError(
            f"Quantization-aware training runs in float32. Received: the global policy {policy!r}. "
            "TFMOT's fake-quant ops need float32 (they emulate int8 in float), so mixed precision "
            "adds nothing here: call tfpar.precision.use('float32') before building the model, and "
            "train the float model with mixed precision before QAT if you like.")
    names = {layer.name for layer in model.layers}
    unknown = sorted(set(exclude) - names)
    if unknown:
        raise ValueError(f"exclude names no layer of {model.name!r}: {unknown}. Received: "
                         f"exclude={list(exclude)}. Layers: {sorted(names)}.")
    tfmot = _tfmot()
    annotate = tfmot.quantization.keras.quantize_annotate_layer

    def clone(layer):
        if layer.name in exclude or isinstance(layer, keras.layers.InputLayer):
            return layer
        return annotate(layer)

    with model.distribute_strategy.scope():
        annotated = keras.models.clone_model(model, clone_function=clone)
        annotated.set_weights(model.get_weights())
        return tfmot.quantization.keras.quantize_apply(annotated)


def quantizer_ranges(model):
    """The fake-quant ranges: variable name -> one value per replica (numpy)."""
    ranges = {}
    for variable in model.non_trainable_variables:
        name = variable.name.split(":")[0]
        if name.endswith(("_min", "_max")):
            values = getattr(variable, "values", (variable,))
            ranges[name] = [np.asarray(v.numpy()) for v in values]
    return ranges


@dataclasses.dataclass(frozen=True)
class TFLiteExport:
    """A TFLite model written by `export_tflite`."""

    path: str
    size_bytes: int
    int8: bool
    """Whether weights, activations, input and output are int8."""

    def interpreter(self, batch_size=1):
        interpreter = tf.lite.Interpreter(model_path=self.path, num_threads=1)
        detail = interpreter.get_input_details()[0]
        interpreter.resize_tensor_input(detail["index"], [batch_size, *detail["shape"][1:]])
        interpreter.allocate_tensors()
        return interpreter

    @staticmethod
    def model_input(interpreter, x):
        """``x`` (float) as ``interpreter``'s input expects it: quantized to int8 with the input's
        scale and zero point for a fully int8 model, else float32."""
        inp = interpreter.get_input_details()[0]
        x = np.asarray(x, np.float32)
        if inp["dtype"] == np.int8:
            scale, zero = inp["quantization"]
            return np.clip(np.round(x / scale + zero), -128, 127).astype(np.int8)
        return x

    def predict(self, x, batch_size=64):
        """Runs ``x`` through the TFLite interpreter; returns float outputs (dequantized)."""
        outputs = []
        for start in range(0, len(x), batch_size):
            chunk = x[start:start + batch_size]
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


def export_tflite(model, path, representative_data=None, int8=True):
    """Writes ``model`` as a TFLite file and checks the interpreter runs it.

    Args:
        model: a tf_keras model (a QAT model from `quantize`, or a float one).
        path: the ``.tflite`` file to write.
        representative_data: input examples (an array, or a list of them) that
            calibrate the int8 ranges: some hundreds drawn from the training data.
        int8: full integer quantization (weights, activations, int8 input and
            output); False writes a float32 TFLite model.

    Returns:
        A `TFLiteExport`.

    Raises:
        ValueError: ``int8`` without ``representative_data``, or a ``path`` in no existing folder.
    """
    check_tf_keras_model(model, "tfpar.quantization.export_tflite", "it exports the tf_keras models quantize() makes")
    check_folder_of("path", path)  # before the conversion, which takes seconds
    if int8 and (representative_data is None or len(representative_data) == 0):
        raise ValueError(
            "A fully int8 TFLite model needs representative_data: input examples (a few hundred from "
            "the training set) on which the converter calibrates the ranges of the activations, "
            "input and output. Received: representative_data=None. Pass e.g. "
            "representative_data=x_train[:200], or int8=False for a float model.")
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
    content = converter.convert()
    write_atomically(path, content)  # a reader never sees half a model
    export = TFLiteExport(path=path, size_bytes=len(content), int8=int8)
    probe = np.zeros([1, *model.inputs[0].shape[1:]], np.float32) if representative_data is None \
        else np.asarray(representative_data[:1], np.float32)
    export.predict(probe)  # raises if the interpreter cannot run it
    return export
