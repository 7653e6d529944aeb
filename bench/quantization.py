"""Quantization benchmark on the digits: float vs int8 TFLite after QAT, and the deployable chain.

    python bench/quantization.py [--quick]

Trains the demo CNN in float32 under DataParallel (2 virtual CPU devices), then, from that
float model, (a) fine-tunes it with quantization-aware training (tfpar.quantization.quantize)
and (b) runs the deployable chain (`tfpar.demo.compress_chain`: pruning to 75 %, 16 clusters
per kernel keeping the zeros, cluster- and sparsity-preserving QAT). Each is exported as fully
int8 TFLite (calibrated on 200 training images) and measured against the float TFLite file in
the TFLite interpreter on one thread, in this one run.

Last line:
    RESULT quantization acc_drop=<x> size_ratio=<y> latency_ratio=<z> latency_ratio_builtin=<w>
           deploy_size_ratio=<v> acc_drop_deploy=<u>

- acc_drop: float TFLite accuracy - QAT int8 TFLite accuracy on the validation digits
  (target <= 0.01);
- size_ratio: float TFLite file size ÷ QAT int8 (target >= 3.5);
- latency_ratio: float ÷ int8 median latency of one image (batch 1), with the interpreter's default
  kernels (the XNNPACK delegate, for float and for int8) (target >= 1.5);
- latency_ratio_builtin: the same with TFLite's built-in kernels only (no XNNPACK delegate);
- deploy_size_ratio: the float file gzipped ÷ the chain's int8 file gzipped (target >= 8);
- acc_drop_deploy: float TFLite accuracy - the chain's int8 TFLite accuracy (target <= 0.01).
"""

import os
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import quick_options  # noqa: E402

import tfpar  # noqa: E402


def main():
    opts = quick_options(__doc__)
    epochs, qat_epochs, repeats = (2, 1, 50) if opts.quick else (15, 3, 2000)

    tfpar.configure_devices(2)
    import tensorflow as tf

    from tfpar.demo import build_model, compress_chain, load_digits
    from tfpar.doctor import cpu_lines
    from tfpar.quantization import export_tflite, quantize
    from tfpar.quantization.deploy import latencies_in_turns

    keras = tfpar.keras
    keras.utils.set_random_seed(0)
    (x, y), (x_val, y_val) = load_digits()
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = build_model()
        model.compile(
            keras.optimizers.Adam(2e-3), "sparse_categorical_crossentropy", metrics=["accuracy"]
        )
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)), strategy, 64, shuffle_buffer=len(x), seed=0
    )
    model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=epochs, verbose=0)
    with strategy.scope():
        qat = quantize(model)
        qat.compile(
            keras.optimizers.Adam(5e-4), "sparse_categorical_crossentropy", metrics=["accuracy"]
        )
    qat.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=qat_epochs, verbose=0)
    compressed = compress_chain(model, strategy, train, epochs=qat_epochs)
    folder = tempfile.mkdtemp(prefix="tfpar-bench-")
    exports = {
        "float": export_tflite(model, os.path.join(folder, "float.tflite"), int8=False),
        "int8": export_tflite(
            qat, os.path.join(folder, "int8.tflite"), representative_data=x[:200]
        ),
    }
    deploy = export_tflite(
        compressed,
        os.path.join(folder, "deploy.tflite"),
        representative_data=x[:200],
        compress=True,
        validation_data=(x_val, y_val),
        reference=model,
    ).report
    accuracy = {name: export.accuracy(x_val, y_val) for name, export in exports.items()}
    seconds = {
        kernels: latencies_in_turns(
            exports, x_val[:1], repeats, builtin_kernels=kernels == "builtin"
        )
        for kernels in ("default", "builtin")
    }
    for name, export in exports.items():
        print(
            f"{name:>5}: accuracy {accuracy[name]:.4f}, {export.size_bytes:,} bytes, "
            f"{seconds['default'][name] * 1e6:.1f} us per image "
            f"({seconds['builtin'][name] * 1e6:.1f} us with "
            "TFLite's built-in kernels only)",
            flush=True,
        )
    print(cpu_lines()[0], flush=True)  # int8 against float depends on the CPU's instructions
    print(
        "deployable chain (pruned 75 %, 16 clusters, int8), against the float model:\n"
        + deploy.describe(),
        flush=True,
    )
    print(
        f"RESULT quantization acc_drop={accuracy['float'] - accuracy['int8']:.4f} "
        f"size_ratio={exports['float'].size_bytes / exports['int8'].size_bytes:.3f} "
        f"latency_ratio={seconds['default']['float'] / seconds['default']['int8']:.3f} "
        f"latency_ratio_builtin={seconds['builtin']['float'] / seconds['builtin']['int8']:.3f} "
        f"deploy_size_ratio={deploy.gzip_ratio:.3f} acc_drop_deploy={deploy.accuracy_drop:.4f}"
    )


if __name__ == "__main__":
    main()
