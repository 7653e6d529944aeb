"""`tfpar.verify`: one replica against 2 (virtual devices) or a 2-stage pipeline, in this
process."""

import math

import numpy as np
import pytest

import tfpar
from tests.models import equivalence_data, verify_model
from tfpar.verify import VerifyReport, load_function, verify
from tfpar.verify._causes import loss_scale_finding as _loss_scale_finding


def _causes(report):
    return [
        cause for v in report.variables if v.max_difference > report.tolerance for cause in v.causes
    ]


def _whole_batches():
    return equivalence_data(128)  # 2 steps of 64: no padded step


@pytest.mark.parametrize("strategy", ["data_parallel", "pipeline", "tensor_parallel"])
def test_the_demo_model_trains_like_one_replica(strategy):
    from tfpar.demo import compiled_model, digits_dataset

    report = verify(compiled_model, digits_dataset, strategy=strategy, steps=4)
    assert report.passed, report.describe()
    assert report.steps == 4 and len(report.variables) == 8
    assert all(v.max_difference < 1e-5 for v in report.variables)
    assert report.describe().endswith("PASSED: trains like one replica")


@pytest.mark.parametrize(
    "kind, data, cause",
    [
        (
            "batchnorm",
            _whole_batches,
            "BatchNormalization statistics taken per replica (layer 'batch_normalization",
        ),
        ("dropout", _whole_batches, "random layer 'dropout"),
        ("synchronized_batchnorm", equivalence_data, "BatchNormalization statistics count padding"),
    ],
)
def test_a_model_that_differs_fails_naming_the_cause(any_keras, kind, data, cause):
    report = verify(lambda: verify_model(kind, any_keras), data, steps=2)
    assert not report.passed
    differing = [v for v in report.variables if v.max_difference > report.tolerance]
    assert differing and all(any(cause in c for c in v.causes) for v in differing), (
        report.describe()
    )
    assert cause in report.describe() and report.describe().endswith(
        "FAILED: differs from one replica"
    )


def test_a_seeded_dropout_with_a_mask_shared_across_the_batch_is_not_blamed():
    def model():
        keras = tfpar.keras
        m = keras.Sequential(
            [
                keras.layers.Input((8, 8, 1)),
                keras.layers.Flatten(),
                keras.layers.Dropout(0.3, noise_shape=(1, 64), seed=3, rng_type="stateless"),
                keras.layers.Dense(3),
            ]
        )
        m.compile(
            keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        return m

    report = verify(model, _whole_batches, steps=2)
    assert report.passed, report.describe()


def test_metrics_that_count_padding_are_named():
    def model():
        m = verify_model()
        m.compile(m.optimizer, m.loss, metrics=["accuracy"])  # not weighted_metrics
        return m

    report = verify(model, equivalence_data, steps=2)  # 96 examples: the second step is padded
    assert all(v.max_difference <= report.tolerance for v in report.variables)
    assert not report.passed and len(report.findings) == 1
    assert "metric 'accuracy'" in report.findings[0] and "weighted_metrics=" in report.findings[0]


@pytest.mark.parametrize("ranges", ["mean", "exact"])
def test_qat_ranges_taken_per_replica_are_named_and_exact_ranges_pass(ranges):
    from tfpar.quantization import quantize

    def model():
        q = quantize(verify_model(), ranges=ranges)
        q.compile(
            tfpar.keras.optimizers.SGD(0.1),
            tfpar.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return q

    report = verify(model, _whole_batches, steps=2)
    if ranges == "exact":  # the global batch's min and max on every replica: trains like one
        assert report.passed, report.describe()
        return
    assert not report.passed
    assert any(
        "QAT ranges taken per replica" in c and "ranges='exact'" in c for c in _causes(report)
    ), report.describe()


def test_loss_scales_that_disagree_are_a_finding():
    keras = tfpar.keras
    a = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0**15)
    b = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=2.0**14)
    assert _loss_scale_finding(a, a) == [] and _loss_scale_finding(keras.optimizers.SGD(), a) == []
    (finding,) = _loss_scale_finding(a, b)
    assert "loss-scale skips differ" in finding and "32768" in finding and "16384" in finding


def test_a_report_passes_only_within_the_tolerance():
    from tfpar.verify import VariableDifference

    report = VerifyReport("d", 1, 1e-5, (VariableDifference("w", 2e-5),))
    assert (
        not report.passed
        and "DIFF w" in report.describe()
        and "no cause tfpar can detect" in report.describe()
    )


class _Subclassed(tfpar.keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = tfpar.keras.layers.Dense(3)

    def call(self, x):
        return self.dense(tfpar.keras.layers.Flatten()(x))


def _unbuilt_subclassed():
    m = _Subclassed()
    m.compile("sgd", "mse")
    return m


def _uncompiled():
    return tfpar.keras.Sequential(
        [
            tfpar.keras.layers.Input((8, 8, 1)),
            tfpar.keras.layers.Flatten(),
            tfpar.keras.layers.Dense(3),
        ]
    )


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        (dict(steps=0), ValueError, "steps must be an int >= 1. Received: steps=0"),
        (dict(tolerance=math.nan), ValueError, "tolerance must be a finite number"),
        (dict(strategy="mirrored"), ValueError, "Unknown strategy 'mirrored'"),
        (
            dict(global_batch_size=33),
            ValueError,
            "global_batch_size=33 with 2 replicas. Use e.g. 32 or 34",
        ),
        (dict(strategy="horovod", replicas=2), ValueError, "takes its replicas from the launcher"),
        (
            dict(model_fn=_unbuilt_subclassed),
            ValueError,
            "has none yet (a subclassed model is built at its first call)",
        ),
        (dict(model_fn=_uncompiled), ValueError, "model_fn must return a compiled Keras model"),
        (dict(model_fn=verify_model()), TypeError, "model_fn must be a function that builds"),
        (dict(data_fn=lambda: np.zeros(3)), TypeError, "data_fn must return (x, y)"),
    ],
)
def test_bad_input_is_refused_clearly(arguments, error, message):
    call = {"model_fn": verify_model, "data_fn": _whole_batches, **arguments}
    with pytest.raises(error) as info:
        verify(call.pop("model_fn"), call.pop("data_fn"), **call)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "spec, error, message",
    [
        ("tests.models", ValueError, "takes module:function"),
        ("no_such_module_here:f", ValueError, "cannot import 'no_such_module_here'"),
        ("tests.models:nothing", ValueError, "tests.models has no 'nothing'"),
        ("tests.models:keras", TypeError, "must name a function"),
    ],
)
def test_a_function_spec_that_cannot_be_loaded_is_refused(spec, error, message):
    with pytest.raises(error) as info:
        load_function(spec, "--model")
    assert message in str(info.value) and "--model" in str(info.value)


def test_tensor_parallel_is_refused_for_a_strategy_whose_stages_it_cannot_split():
    from tfpar.demo import compiled_model, digits_dataset

    with pytest.raises(
        ValueError,
        match=r"tensor_parallel splits a pipeline's stages. Received: tensor_parallel=2 "
        r"with strategy 'data_parallel'",
    ):
        verify(compiled_model, digits_dataset, strategy="data_parallel", tensor_parallel=2)


def test_tensor_parallel_verifies_a_keras_hub_model_split_inside_its_blocks():
    """`tfpar verify --strategy tensor_parallel --model tests.gradient_paths:gpt2_keras_hub --data
    tests.gradient_paths:gpt2_data`: KerasHub's GPT-2 split by the default plan (inside its
    decoder blocks) against one device, weight by weight."""
    model_fn = load_function("tests.gradient_paths:gpt2_keras_hub", "model")
    data_fn = load_function("tests.gradient_paths:gpt2_data", "data")
    report = verify(model_fn, data_fn, strategy="tensor_parallel", steps=3, global_batch_size=8)
    assert report.passed, report.describe()
    assert "/transformer_layer_1/self_attention': 'heads'" in report.describe()  # split inside
    assert "/CPU:1: weights" in report.describe()
    assert len(report.variables) == len(model_fn().weights)
    names = " ".join(v.name for v in report.variables)
    assert "transformer_layer_1/self_attention/query/kernel" in names
    assert "transformer_layer_1/feedforward_output_dense/kernel" in names
