"""tfpar.quantization on 2 virtual CPU devices: QAT under DataParallel, int8 TFLite export, pruning."""

import numpy as np
import pytest

import tfpar
from tests.models import digits_subset, qat_model
from tfpar.quantization import export_tflite, prune, quantize, quantizer_ranges, sparsity, strip_pruning

keras = tfpar.keras


def _compile(model):
    model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])


def _qat(strategy, epochs=2):
    x, y, _, _ = digits_subset()
    with strategy.scope():
        float_model = qat_model()
        model = quantize(float_model)
        _compile(model)
    model.fit(x, y, batch_size=64, epochs=epochs, shuffle=False, verbose=0)
    return model


@pytest.fixture(scope="module")
def qat_two_replicas():
    return _qat(tfpar.DataParallel())


def test_qat_under_data_parallel_keeps_the_ranges_equal_on_every_replica(qat_two_replicas):
    ranges = quantizer_ranges(qat_two_replicas)
    assert ranges and all(len(values) == 2 for values in ranges.values())
    for name, (first, second) in ranges.items():
        np.testing.assert_array_equal(first, second, err_msg=name)
    # Training moved the activation ranges away from their initial [-6, 6].
    assert any(not np.allclose(v[0], 6.0) for n, v in ranges.items() if n.endswith("_max"))


def test_qat_on_one_replica_and_on_two_replicas_gives_the_same_weights(qat_two_replicas):
    import tensorflow as tf

    one = _qat(tf.distribute.get_strategy())
    # Tolerance 3e-3 (measured after 16 steps, on weights of size ~0.1-0.3: 1.2e-3 on an AMX
    # machine, 2.6e-3 on an AVX-512 one): each replica
    # measures its activation ranges on half the batch and TFMOT averages them over the replicas
    # (its moving averages reduce with MEAN), which differs from the full batch's min and max by a
    # hair; fake-quant rounding with those ranges moves a few weights by one quantization step.
    for a, b in zip(one.get_weights(), qat_two_replicas.get_weights()):
        np.testing.assert_allclose(a, b, atol=3e-3)


def test_int8_tflite_export_runs_and_keeps_the_accuracy(tmp_path):
    x, y, x_val, y_val = digits_subset()
    strategy = tfpar.DataParallel()
    with strategy.scope():
        trained = quantize(qat_model())
        trained.compile(keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trained.fit(x, y, batch_size=64, epochs=12, shuffle=False, verbose=0)  # 0.93 on the held-out digits here
    export = export_tflite(trained, str(tmp_path / "int8.tflite"), representative_data=x[:100])
    assert export.int8 and export.size_bytes == (tmp_path / "int8.tflite").stat().st_size
    interpreter = export.interpreter()
    assert interpreter.get_input_details()[0]["dtype"] == np.int8
    int8_accuracy = (export.predict(x_val).argmax(-1) == y_val).mean()
    keras_accuracy = (trained.predict(x_val, verbose=0).argmax(-1) == y_val).mean()
    assert keras_accuracy >= 0.85 and int8_accuracy >= 0.85, (keras_accuracy, int8_accuracy)
    assert abs(int8_accuracy - keras_accuracy) <= 0.02
    float_export = export_tflite(qat_model(), str(tmp_path / "float.tflite"), int8=False)
    assert float_export.size_bytes > 2 * export.size_bytes


def test_pruning_under_data_parallel_reaches_the_target_sparsity():
    x, y, _, _ = digits_subset()
    with tfpar.DataParallel().scope():
        pruned, callbacks = prune(qat_model(), 0.75, end_step=24, frequency=4)
        _compile(pruned)
    pruned.fit(x, y, batch_size=64, epochs=4, verbose=0, callbacks=callbacks)  # 8 steps an epoch
    assert abs(sparsity(pruned) - 0.75) <= 0.01
    assert abs(sparsity(strip_pruning(pruned)) - 0.75) <= 0.01


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)


def test_bad_quantization_input_gets_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"Cannot quantize the subclassed model .* Sequential or Functional"):
        quantize(_Subclassed())
    with pytest.raises(ValueError, match=r"exclude names no layer of 'qat_model': \['nope'\]"):
        quantize(qat_model(), exclude=["nope"])
    with pytest.raises(ValueError, match=r"needs representative_data.*Received: representative_data=None"):
        export_tflite(qat_model(), str(tmp_path / "m.tflite"))
    with pytest.raises(ValueError, match=r"target_sparsity must be in \[0, 1\). Received: target_sparsity=1.5"):
        prune(qat_model(), 1.5, end_step=10)
    tfpar.precision.use("mixed_bfloat16")
    try:
        with pytest.raises(ValueError, match=r"runs in float32. Received: the global policy 'mixed_bfloat16'"):
            quantize(qat_model())
    finally:
        tfpar.precision.use("float32")


def test_excluded_layers_stay_float():
    model = quantize(qat_model(), exclude=["logits"])
    names = [layer.name for layer in model.layers]
    assert "quant_hidden" in names and "logits" in names and "quant_logits" not in names
