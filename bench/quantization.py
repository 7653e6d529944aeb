"""Quantization benchmark on the digits: float vs int8 TFLite after QAT.

    python bench/quantization.py [--quick]

Trains the demo CNN in float32 under DataParallel (2 virtual CPU devices), fine-tunes
it with quantization-aware training (tfpar.quantization.quantize), exports both as
TFLite (float32, and fully int8 calibrated on 200 training images) and measures
them in the TFLite interpreter on one thread, in this one run.

Last line:
    RESULT quantization acc_drop=<x> size_ratio=<y> latency_ratio=<z>

- acc_drop: float TFLite accuracy - int8 TFLite accuracy on the validation digits (target <= 0.01);
- size_ratio: float TFLite file size ÷ int8 (target >= 3.5);
- latency_ratio: float ÷ int8 median latency of one image (batch 1) on this CPU (report).
"""

import os
import statistics
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfpar  # noqa: E402
from common import quick_options  # noqa: E402


def latency(export, x, repeats):
    """Median seconds of one batch-1 invocation."""
    interpreter = export.interpreter(batch_size=1)
    inp = interpreter.get_input_details()[0]
    sample = export.model_input(interpreter, x[:1])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        interpreter.set_tensor(inp["index"], sample)
        interpreter.invoke()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    opts = quick_options(__doc__)
    epochs, qat_epochs, repeats = (2, 1, 50) if opts.quick else (15, 3, 2000)

    tfpar.configure_devices(2)
    import tensorflow as tf

    from tfpar.demo import build_model, load_digits
    from tfpar.quantization import export_tflite, quantize

    keras = tfpar.keras
    keras.utils.set_random_seed(0)
    (x, y), (x_val, y_val) = load_digits()
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = build_model()
        model.compile(keras.optimizers.Adam(2e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 64,
                                  shuffle_buffer=len(x), seed=0)
    model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=epochs, verbose=0)
    with strategy.scope():
        qat = quantize(model)
        qat.compile(keras.optimizers.Adam(5e-4), "sparse_categorical_crossentropy", metrics=["accuracy"])
    qat.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=qat_epochs, verbose=0)
    folder = tempfile.mkdtemp(prefix="tfpar-bench-")
    exports = {"float": export_tflite(model, os.path.join(folder, "float.tflite"), int8=False),
               "int8": export_tflite(qat, os.path.join(folder, "int8.tflite"), representative_data=x[:200])}
    accuracy = {name: float((e.predict(x_val).argmax(-1) == y_val).mean()) for name, e in exports.items()}
    latencies = {name: [] for name in exports}
    for _ in range(3):  # alternate, so that a slow moment of the machine hits both
        for name, export in exports.items():
            latencies[name].append(latency(export, x_val, repeats))
    seconds = {name: statistics.median(values) for name, values in latencies.items()}
    for name, export in exports.items():
        print(f"{name:>5}: accuracy {accuracy[name]:.4f}, {export.size_bytes:,} bytes, "
              f"{seconds[name] * 1e6:.1f} us per image", flush=True)
    print(f"RESULT quantization acc_drop={accuracy['float'] - accuracy['int8']:.4f} "
          f"size_ratio={exports['float'].size_bytes / exports['int8'].size_bytes:.3f} "
          f"latency_ratio={seconds['float'] / seconds['int8']:.3f}")


if __name__ == "__main__":
    main()
