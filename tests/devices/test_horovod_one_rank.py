"""HorovodStrategy as one rank in this process (no horovodrun), and its errors."""

import builtins

import numpy as np
import pytest
import tensorflow as tf

from tfpar import keras

needs_horovod = pytest.mark.usefixtures("horovod_installed")


def test_missing_horovod_says_how_to_install(monkeypatch):
    from tfpar.strategies import horovod

    real_import = builtins.__import__

    def no_horovod(name, *args, **kwargs):
        if name.startswith("horovod"):
            raise ModuleNotFoundError("No module named 'horovod'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_horovod)
    with pytest.raises(ImportError, match=r"needs Horovod.*tfpar install-horovod"):
        horovod.HorovodStrategy()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(op="mean"), r"Unknown op 'mean'. Received: op='mean'"),
        (dict(compression="int8"), r"Unknown compression 'int8'"),
        (
            dict(backward_passes_per_step=0),
            r"backward_passes_per_step must be an int >= 1.*Received: backward_passes_per_step=0",
        ),
        (
            dict(op="adasum", compression="bf16"),
            r"compression='bf16' cannot be combined with op='adasum'.*"
            r"Received: op='adasum', compression='bf16'",
        ),
    ],
)
def test_bad_options(kwargs, match):
    from tfpar.strategies.horovod import HorovodConfig

    with pytest.raises(ValueError, match=match):
        HorovodConfig(**kwargs)


@needs_horovod
def test_one_rank_trains_like_one_device():
    from tests.models import (
        compile_for_equivalence,
        equivalence_data,
        equivalence_model,
    )
    from tfpar.strategies.horovod import HorovodStrategy

    strategy = HorovodStrategy()
    assert isinstance(strategy, tf.distribute.Strategy) and strategy.num_replicas_in_sync == 1
    x, y = equivalence_data()
    with strategy.scope():
        model = equivalence_model()
        compile_for_equivalence(model)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    plain = equivalence_model()
    compile_for_equivalence(plain)
    plain.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)


@needs_horovod
def test_jit_compile_is_refused_with_the_fix():
    from tfpar.strategies.horovod import XLA_OPS_BUILT, HorovodStrategy

    if XLA_OPS_BUILT:
        pytest.skip("this TensorFlow has Horovod's XLA ops")
    strategy = HorovodStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse", jit_compile=True)
    with pytest.raises(ValueError, match=r"XLA ops are not built.*Received: jit_compile=True"):
        model.fit(np.ones((8, 3)), np.ones(8), epochs=1, verbose=0)


@needs_horovod
def test_describe_counts_a_keras3_model():
    import keras as keras3

    from tfpar.strategies.horovod import HorovodStrategy

    model = keras3.Sequential([keras3.layers.Input((2,)), keras3.layers.Dense(1)], name="k3")
    assert "model:      k3, 3 parameters" in HorovodStrategy().describe(model=model)


def test_horovods_distributed_optimizer_for_keras3_wraps_the_optimizer_it_is_given():
    """tfpar/install_horovod/_copied_into_horovod/keras3.py, which the installer adds to Horovod, in
    this process: a Keras 3 optimizer is recognized (a tf_keras one is not), the copy keeps its
    class name and config, its apply hands every gradient to the all-reduce with the tf.Variable
    each Keras 3 variable holds, and an unsupported backward_passes_per_step is refused naming the
    fix."""
    import keras as keras3

    from tfpar.install_horovod._copied_into_horovod.keras3 import (
        distributed_optimizer,
        is_keras3_optimizer,
    )

    assert is_keras3_optimizer(keras3.optimizers.SGD(0.1)) and not is_keras3_optimizer(
        keras.optimizers.SGD(0.1)
    )
    seen = []

    def doubled(grads, variables):  # an all-reduce summing two ranks with equal gradients
        seen.append(variables)
        return [2 * g for g in grads]

    optimizer = distributed_optimizer(keras3.optimizers.SGD(0.1, momentum=0.5), doubled)
    assert type(optimizer).__name__ == "SGD" and isinstance(optimizer, keras3.optimizers.SGD)
    assert optimizer.get_config()["momentum"] == 0.5
    variable = keras3.Variable([1.0, 2.0])
    optimizer.apply_gradients([(tf.constant([1.0, 1.0]), variable)])
    np.testing.assert_allclose(variable.numpy(), [0.8, 1.8])  # 0.1 x the doubled gradient
    assert len(seen) == 1 and isinstance(seen[0][0], tf.Variable)
    with pytest.raises(
        ValueError,
        match=r"backward_passes_per_step=1 with a Keras 3 optimizer. Received: "
        r"backward_passes_per_step=2. Accumulate with Keras 3's own "
        r"gradient_accumulation_steps",
    ):
        distributed_optimizer(keras3.optimizers.SGD(0.1), doubled, backward_passes_per_step=2)
