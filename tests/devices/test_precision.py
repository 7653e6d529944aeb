"""tfpar.precision on 2 virtual CPU devices: policy choice, the compile check, loss scaling."""

import warnings

import numpy as np
import pytest

import tfpar
from tests.models import compile_for_equivalence, equivalence_data, overflow_step
from tfpar.precision import PrecisionWarning, choose

keras = tfpar.keras


@pytest.fixture(autouse=True)
def float32_after():
    yield
    tfpar.precision.use("float32")


@pytest.mark.parametrize(
    "gpus, flags, expected",
    [
        ([("H100", (9, 0))], set(), "mixed_float16"),
        ([("K80", (3, 7))], set(), "float32"),
        ([], {"avx512f", "avx512_bf16"}, "mixed_bfloat16"),
        ([], {"amx_bf16"}, "mixed_bfloat16"),
        ([], {"avx2"}, "float32"),
    ],
)
def test_auto_choice_and_its_reason(gpus, flags, expected):
    name, reason = choose(gpus=gpus, cpu_flags=flags)
    assert name == expected and reason


@pytest.mark.parametrize(
    "flags, vector, int8, policy",
    [
        ({"sse4_2", "avx2", "fma"}, "avx2, fma", "no int8 dot-product instructions", "float32"),
        (
            {"avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"},
            "avx2, fma, avx512f, avx512_vnni, avx512_bf16",
            "int8 dot products in hardware (avx512_vnni)",
            "mixed_bfloat16",
        ),
        (
            {"avx2", "amx_bf16", "amx_int8"},
            "avx2, amx_bf16, amx_int8",
            "int8 dot products in hardware (amx_int8)",
            "mixed_bfloat16",
        ),
        (set(), "none of avx2, fma", "no int8 dot-product instructions", "float32"),
    ],
)
def test_doctor_says_what_the_cpu_computes_natively(flags, vector, int8, policy):
    from tfpar.doctor import cpu_lines

    cpu, precision = cpu_lines(flags)
    assert cpu.startswith(f"cpu:         {vector}") and int8 in cpu
    assert precision.startswith(f"precision:   'auto' picks {policy}: ")


def test_doctor_says_which_kernels_tensorflow_runs():
    from tfpar import _compat
    from tfpar.doctor import kernels_line

    assert kernels_line(True).startswith("kernels:     oneDNN's")
    assert "TF_ENABLE_ONEDNN_OPTS=1 tries it here" in kernels_line(False)
    assert kernels_line() == kernels_line(_compat.onednn_enabled())


def test_use_sets_the_keras_policy_and_auto_follows_the_hardware(any_keras):
    assert (
        tfpar.precision.use("auto") == choose()[0] == any_keras.mixed_precision.global_policy().name
    )
    assert tfpar.precision.use("mixed_bfloat16") == "mixed_bfloat16"
    assert any_keras.layers.Dense(2).compute_dtype == "bfloat16"
    with pytest.raises(
        ValueError, match=r"Unknown precision policy 'half'. Received: policy='half'. Use one of"
    ):
        tfpar.precision.use("half")
    with pytest.warns(
        PrecisionWarning, match="mixed_float16 without a GPU that has float16 tensor cores"
    ):
        tfpar.precision.use("mixed_float16")  # this machine has no GPU


def _softmax_model(float32_output, k=keras):
    return k.Sequential(
        [
            k.layers.Input((4,)),
            k.layers.Dense(3),
            k.layers.Activation("softmax", dtype="float32" if float32_output else None),
        ]
    )


def test_compile_warns_about_a_16_bit_output_and_strict_mode_raises(any_keras):
    tfpar.precision.use("mixed_bfloat16")
    with pytest.warns(
        PrecisionWarning, match=r"computed in bfloat16, so the loss is too.*dtype='float32'"
    ):
        _softmax_model(False, any_keras).compile("sgd", "sparse_categorical_crossentropy")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionWarning)
        # no warning
        _softmax_model(True, any_keras).compile("sgd", "sparse_categorical_crossentropy")
    tfpar.precision.use("mixed_bfloat16", strict=True)
    with pytest.raises(ValueError, match=r"Received: policy 'mixed_bfloat16' with strict=True"):
        _softmax_model(False, any_keras).compile("sgd", "sparse_categorical_crossentropy")
    tfpar.precision.use("float32")  # the check goes away with the mixed policy
    _softmax_model(False, any_keras).compile("sgd", "sparse_categorical_crossentropy")


@pytest.mark.parametrize("replica", [0, 1])
def test_an_overflow_on_one_replica_skips_the_step_on_every_replica(any_keras, replica):
    """Either replica: Keras 3's own check would follow replica 0's gradients alone (tfpar
    reduces its decision over the replicas)."""
    report = overflow_step(tfpar.DataParallel(), k=any_keras, replica=replica)
    # One loss-scale optimizer around the plain one (each Keras' compile wraps it once).
    assert (
        report["optimizer"] in ("LossScaleOptimizerV3", "LossScaleOptimizer")
        and report["inner"] == "SGD"
    )
    assert report["skipped"] and report["per_replica_equal"]
    assert report["loss_scale"] == [32768.0, 16384.0, 16384.0]  # halved once, then kept
    assert report["updated"]  # the next, finite step applies


def test_mixed_bfloat16_trains_under_data_parallel_without_loss_scaling():
    tfpar.precision.use("mixed_bfloat16")
    with tfpar.DataParallel().scope():
        model = _softmax_model(True)
        model.compile(keras.optimizers.Adam(0.05), "sparse_categorical_crossentropy")
    assert not isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    history = model.fit(x, y, batch_size=16, epochs=15, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]


def test_pipeline_under_mixed_float16_scales_the_loss_and_matches_the_plain_model(any_keras):
    from tests.models import _loss_scale, pipeline_model
    from tfpar.pipeline import Pipeline

    k = any_keras
    with pytest.warns(PrecisionWarning):
        tfpar.precision.use("mixed_float16")
    x, y = equivalence_data()

    def trained(model):
        compile_for_equivalence(model, k)
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        return model

    plain = trained(pipeline_model(regularize=False, k=k))
    staged = trained(
        Pipeline(num_stages=2, num_microbatches=4).stage(pipeline_model(regularize=False, k=k))
    )
    assert isinstance(staged.optimizer, k.mixed_precision.LossScaleOptimizer)
    assert _loss_scale(staged.optimizer) == _loss_scale(plain.optimizer)
    for a, b in zip(plain.get_weights(), staged.plain_model().get_weights()):
        np.testing.assert_allclose(a, b, atol=2e-3)  # float16 sums in another order


def test_the_compile_check_acts_while_a_policy_of_use_is_set_and_never_on_a_policy_keras_set():
    import keras as keras3

    keras = tfpar.keras
    originals = {k: k.Model.__dict__.get("compile") for k in (keras, keras3)}
    # use() twice wraps once; float32 unwraps
    for name in ("mixed_bfloat16", "mixed_bfloat16", "float32"):
        tfpar.precision.use(name)
        for k, original in originals.items():
            assert (k.Model.__dict__.get("compile") is original) == (name == "float32")
    assert all(k.Model.__dict__.get("compile") is original for k, original in originals.items())
    tfpar.precision.use("mixed_bfloat16")
    try:
        model = keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(2)])
        with pytest.warns(PrecisionWarning, match="computed in bfloat16"):
            model.compile("sgd", "mse")
    finally:
        tfpar.precision.use("float32")
    # The policy set through Keras itself is Keras' business: no check, no warning, Keras' compile.
    for k in (keras, keras3):
        k.mixed_precision.set_global_policy("mixed_bfloat16")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", PrecisionWarning)
                k.Sequential([k.layers.Input((3,)), k.layers.Dense(2)]).compile("sgd", "mse")
        finally:
            k.mixed_precision.set_global_policy("float32")
