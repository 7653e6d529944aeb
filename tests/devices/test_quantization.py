"""tfpar.quantization on 2 virtual CPU devices: QAT under DataParallel, int8 TFLite export, pruning,
clustering, the collaborative chain (PQAT, CQAT, sparsity-preserving clustering), exact ranges and
the deployment report."""

import os
import warnings

import numpy as np
import pytest

import tfpar
from tests.models import digits_subset, qat_model
from tfpar.quantization import (
    cluster,
    export_tflite,
    prune,
    quantize,
    quantizer_ranges,
    sparsity,
    strip_clustering,
    strip_pruning,
    unique_weights,
)
from tfpar.quantization.deploy import AccuracyDropError

keras = tfpar.keras


def _compile(model, optimizer=None):
    model.compile(
        optimizer or keras.optimizers.SGD(0.05),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def _qat(strategy, epochs=2, ranges="mean"):
    x, y, _, _ = digits_subset()
    with strategy.scope():
        float_model = qat_model()
        model = quantize(float_model, ranges=ranges)
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
        trained.compile(
            keras.optimizers.Adam(3e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    # 0.93 on the held-out digits here
    trained.fit(x, y, batch_size=64, epochs=12, shuffle=False, verbose=0)
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
    with pytest.raises(
        ValueError, match=r"Cannot quantize the subclassed model .* Sequential or Functional"
    ):
        quantize(_Subclassed())
    with pytest.raises(ValueError, match=r"exclude names no layer of 'qat_model': \['nope'\]"):
        quantize(qat_model(), exclude=["nope"])
    with pytest.raises(
        ValueError, match=r"needs representative_data.*Received: representative_data=None"
    ):
        export_tflite(qat_model(), str(tmp_path / "m.tflite"))
    with pytest.raises(
        ValueError, match=r"target_sparsity must be in \[0, 1\). Received: target_sparsity=1.5"
    ):
        prune(qat_model(), 1.5, end_step=10)
    tfpar.precision.use("mixed_bfloat16")
    try:
        with pytest.raises(
            ValueError, match=r"runs in float32. Received: the global policy 'mixed_bfloat16'"
        ):
            quantize(qat_model())
    finally:
        tfpar.precision.use("float32")


def test_excluded_layers_stay_float():
    model = quantize(qat_model(), exclude=["logits"])
    names = [layer.name for layer in model.layers]
    assert "quant_hidden" in names and "logits" in names and "quant_logits" not in names


def test_exact_ranges_make_qat_on_two_replicas_train_like_one(qat_two_replicas):
    import tensorflow as tf

    one = _qat(tf.distribute.get_strategy(), ranges="exact")
    two = _qat(tfpar.DataParallel(), ranges="exact")
    for name, values in quantizer_ranges(two).items():
        np.testing.assert_array_equal(values[0], values[1], err_msg=name)
    ranges_one, ranges_two = quantizer_ranges(one), quantizer_ranges(two)  # in the models' order
    assert len(ranges_one) == len(ranges_two)
    for (name, values), theirs in zip(ranges_one.items(), ranges_two.values()):
        np.testing.assert_allclose(values[0], theirs[0], atol=1e-5, err_msg=name)
    for a, b in zip(one.get_weights(), two.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    # Averaged ranges ("mean", the default) are not the global batch's: they differ by more.
    assert (
        max(
            float(np.max(np.abs(a - b)))
            for a, b in zip(one.get_weights(), qat_two_replicas.get_weights())
        )
        > 1e-4
    )


def _per_replica(model, marker):
    """Variable name -> its value on each replica, for the variables whose name holds ``marker``."""
    return {
        v.name: [np.asarray(t.numpy()) for t in getattr(v, "values", (v,))]
        for v in model.variables
        if marker in v.name
    }


def _assert_equal_on_every_replica(model, marker, replicas=2):
    found = _per_replica(model, marker)
    assert found, f"no {marker} variables"
    for name, values in found.items():
        assert len(values) == replicas, name
        for other in values[1:]:
            np.testing.assert_array_equal(values[0], other, err_msg=name)


def _kernels(model):
    """Layer name (without TFMOT's wrapper prefixes) -> its kernel."""
    found = {}
    for layer in model.layers:
        for weight in layer.weights:
            if weight.name.split(":")[0].endswith("kernel"):
                name = layer.name
                for prefix in ("quant_", "cluster_", "prune_low_magnitude_"):
                    name = name.removeprefix(prefix)
                found[name] = weight.numpy()
    return found


@pytest.fixture(scope="module")
def pruned_two_replicas():
    """qat_model trained, then pruned to 60 % on 2 replicas: (float model, pruned model)."""
    x, y, _, _ = digits_subset()
    strategy = tfpar.DataParallel()
    with strategy.scope():
        trained = qat_model()
        _compile(trained, keras.optimizers.Adam(3e-3))
    trained.fit(x, y, batch_size=64, epochs=10, shuffle=False, verbose=0)
    with strategy.scope():
        pruned, callbacks = prune(trained, 0.6, end_step=16, frequency=4)
        _compile(pruned, keras.optimizers.Adam(1e-3))
    pruned.fit(x, y, batch_size=64, epochs=3, shuffle=False, verbose=0, callbacks=callbacks)
    return trained, pruned


def test_pruning_masks_are_equal_on_every_replica_and_leave_the_float_model_as_it_was(
    pruned_two_replicas,
):
    trained, pruned = pruned_two_replicas
    _assert_equal_on_every_replica(pruned, "mask")
    assert abs(sparsity(strip_pruning(pruned)) - 0.6) <= 0.01
    assert sparsity(trained) < 0.01  # prune() pruned a copy


def test_clustering_under_data_parallel_shares_the_centroids_across_replicas(pruned_two_replicas):
    trained, _ = pruned_two_replicas
    before = trained.get_weights()
    x, y, _, _ = digits_subset()
    with trained.distribute_strategy.scope():
        clustered = cluster(trained, clusters=8)
        # fine-tuning: a large SGD step merges the centroids
        _compile(clustered, keras.optimizers.Adam(1e-3))
    clustered.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    _assert_equal_on_every_replica(clustered, "cluster_centroids")
    _assert_equal_on_every_replica(clustered, "pulling_indices")
    counts = unique_weights(strip_clustering(clustered))
    assert set(counts) == {"conv", "hidden", "logits"} and all(
        1 < c <= 8 for c in counts.values()
    ), counts
    for a, b in zip(before, trained.get_weights()):  # the model clustered is left as it was
        np.testing.assert_array_equal(a, b)


def test_pruning_preserving_qat_keeps_every_zero(pruned_two_replicas):
    _, pruned = pruned_two_replicas
    x, y, _, _ = digits_subset()
    zeros = {name: kernel == 0 for name, kernel in _kernels(strip_pruning(pruned)).items()}
    with pruned.distribute_strategy.scope():
        pqat = quantize(pruned, preserve="sparsity")
        _compile(pqat)
    pqat.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    after = _kernels(pqat)
    assert after.keys() == zeros.keys() == {"conv", "hidden", "logits"}
    for name, mask in zeros.items():
        assert np.all(after[name][mask] == 0), name
    _assert_equal_on_every_replica(pqat, "_min")


def test_sparsity_preserving_clustering_then_cqat_keeps_the_zeros_and_the_clusters(
    pruned_two_replicas,
):
    trained, pruned = pruned_two_replicas
    x, y, x_val, y_val = digits_subset()
    zeros = {name: kernel == 0 for name, kernel in _kernels(strip_pruning(pruned)).items()}
    strategy = pruned.distribute_strategy
    with strategy.scope():
        clustered = cluster(pruned, clusters=8, preserve_sparsity=True)
        _compile(clustered, keras.optimizers.Adam(1e-3))
    clustered.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    _assert_equal_on_every_replica(clustered, "cluster_centroids")
    stripped = _kernels(strip_clustering(clustered))
    for name, mask in zeros.items():
        assert np.all(stripped[name][mask] == 0), name
    with strategy.scope():
        cqat = quantize(clustered, preserve=("clusters", "sparsity"), ranges="exact")
        _compile(cqat, keras.optimizers.Adam(1e-3))
    cqat.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    _assert_equal_on_every_replica(cqat, "_min")
    _assert_equal_on_every_replica(cqat, "_max")
    after = _kernels(cqat)
    for name, mask in zeros.items():
        assert np.all(after[name][mask] == 0), name
        assert 1 < np.unique(after[name]).size <= 8, (name, np.unique(after[name]).size)
    accuracy = {
        name: m.evaluate(x_val, y_val, verbose=0)[1]
        for name, m in (("float", trained), ("cqat", cqat))
    }
    assert accuracy["float"] >= 0.85 and accuracy["cqat"] >= accuracy["float"] - 0.1, accuracy


def test_pqat_on_a_dense_model_warns_why():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quantize(qat_model(), preserve="sparsity")
    messages = [str(w.message) for w in caught if "Pruning-preserving QAT" in str(w.message)]
    assert len(messages) == 1 and "0.0% zeros" in messages[0] and "Prune it first" in messages[0], (
        messages
    )


@pytest.fixture(scope="module")
def trained_float():
    x, y, _, _ = digits_subset()
    model = qat_model()
    model.compile(
        keras.optimizers.Adam(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.fit(x, y, batch_size=64, epochs=12, shuffle=False, verbose=0)
    return model


def test_compressed_export_reports_sizes_sparsity_accuracy_and_latency(trained_float, tmp_path):
    x, y, x_val, y_val = digits_subset()
    pruned, callbacks = prune(trained_float, 0.5, end_step=8, frequency=2)
    _compile(pruned)
    pruned.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
    export = export_tflite(
        quantize(pruned, preserve="sparsity"),
        str(tmp_path / "deploy.tflite"),
        representative_data=x[:100],
        compress=True,
        validation_data=(x_val, y_val),
        reference=trained_float,
        max_accuracy_drop=1.0,
    )
    report = export.report
    content = (tmp_path / "deploy.tflite").read_bytes()
    import gzip

    assert report.size_bytes == export.size_bytes == len(content)
    assert report.gzip_bytes == len(gzip.compress(content, 9)) < report.size_bytes
    assert report.reference_size_bytes > 2 * report.size_bytes and report.gzip_ratio > 4
    kernels = {w.name: w for w in report.weights}
    assert len(kernels) == 3 and all(w.dtype == "int8" for w in kernels.values()), kernels
    assert (
        all(0.45 <= w.sparsity <= 0.55 for w in kernels.values())
        and 0.45 <= report.sparsity <= 0.55
    )
    assert all(1 < w.unique <= 255 for w in kernels.values())
    assert report.examples == len(y_val) and 0.8 <= report.reference_accuracy <= 1
    expected = float((export.predict(x_val).argmax(-1) == y_val).mean())
    assert (
        report.accuracy == expected and report.accuracy_drop == report.reference_accuracy - expected
    )
    assert report.latency_seconds > 0 and report.reference_latency_seconds > 0
    summary = report.describe()
    for text in ("gzipped", "held-out", "us per example", "distinct values", "% zero"):
        assert text in summary


def test_compressed_export_refuses_to_write_past_max_accuracy_drop(trained_float, tmp_path):
    x, y, x_val, y_val = digits_subset()
    untrained = quantize(qat_model())  # a model far worse than the reference
    with pytest.raises(
        AccuracyDropError, match=r"Not written to .*refused.tflite.*max_accuracy_drop=0.05"
    ) as info:
        export_tflite(
            untrained,
            str(tmp_path / "refused.tflite"),
            representative_data=x[:100],
            compress=True,
            validation_data=(x_val, y_val),
            reference=trained_float,
            max_accuracy_drop=0.05,
        )
    assert isinstance(info.value, ValueError) and info.value.report.accuracy_drop > 0.05
    assert os.listdir(tmp_path) == []  # nothing written, no temporary file left
