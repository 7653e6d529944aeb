"""LARS and LAMB (tfpar/optimizers) against a NumPy reference of the papers' equations, in both
Kerases and under `DataParallel` on 2 devices; their refusals and warnings."""

import numpy as np
import pytest

import tfpar
from tfpar.optimizers import LAMB, LARS

STEPS = 100  # 25 epochs of 4 batches of 16
PATHS = (
    "dense/kernel",
    "dense/bias",
    "layer_normalization/gamma",
    "layer_normalization/beta",
    "dense_1/kernel",
    "dense_1/bias",
)
NO_DECAY = ["bias", "layer_normalization"]
"""The usual exclusions: the biases and the normalisation layer's scale and offset."""
CASES = {  # name: (class, its options, (decayed, adapted) per variable, in PATHS' order)
    "lars": (LARS, dict(learning_rate=0.125, momentum=0.9, eta=0.02, weight_decay=0.01), None),
    "lars-nesterov-excluding": (
        LARS,
        dict(
            learning_rate=0.125,
            momentum=0.9,
            nesterov=True,
            eta=0.02,
            weight_decay=0.01,
            exclude_from_weight_decay=NO_DECAY,
            exclude_from_layer_adaptation=["layer_normalization"],
        ),
        [(1, 1), (0, 1), (0, 0), (0, 0), (1, 1), (0, 1)],
    ),
    "lamb": (LAMB, dict(learning_rate=0.01, weight_decay=0.01), None),
    # adaptation: the decay's exclusions
    "lamb-excluding": (
        LAMB,
        dict(learning_rate=0.01, weight_decay=0.01, exclude_from_weight_decay=NO_DECAY),
        [(1, 1), (0, 0), (0, 0), (0, 0), (1, 1), (0, 0)],
    ),
}


def _model(k):
    k.utils.set_random_seed(3)
    return k.Sequential(
        [
            k.Input((6,)),
            k.layers.Dense(8, activation="tanh", name="dense"),
            k.layers.LayerNormalization(name="layer_normalization"),
            k.layers.Dense(3, name="dense_1"),
        ]
    )


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 6)).astype("float32"), rng.integers(0, 3, 64)


def _ratio(numerator, denominator):
    return numerator / denominator if numerator > 0 and denominator > 0 else 1.0


def _reference_step(name, options, w, g, slots, t, decay, adapt):
    """One variable's step, as the papers write it (float64 arrays in, out)."""
    lr, wd = options["learning_rate"], options.get("weight_decay", 0.0) * decay
    if name.startswith("lars"):
        local = (
            _ratio(options["eta"] * np.linalg.norm(w), np.linalg.norm(g) + wd * np.linalg.norm(w))
            if adapt
            else 1.0
        )
        v = options["momentum"] * slots[0] + lr * local * (g + wd * w)
        step = options["momentum"] * v + lr * local * (g + wd * w) if options.get("nesterov") else v
        return w - step, [v]
    m = 0.9 * slots[0] + 0.1 * g
    v = 0.999 * slots[1] + 0.001 * g * g
    r = (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-6) + wd * w
    return w - lr * (_ratio(np.linalg.norm(w), np.linalg.norm(r)) if adapt else 1.0) * r, [m, v]


def _slots(optimizer):
    return [list(getattr(optimizer, attribute)) for attribute, _ in type(optimizer)._SLOTS]


def _batch(t):
    """Step t's batch (t from 1): fit's order, 4 batches of 16 per epoch, unshuffled."""
    return slice(16 * ((t - 1) % 4), 16 * ((t - 1) % 4 + 1))


def _gradients(model, loss, x, y):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        value = loss(y, model(x, training=True))
    return tape.gradient(value, model.trainable_variables)


def _keras_version(k):
    return 2 if k is tfpar.keras else 3


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_of_100_steps_follows_the_papers_equations(any_keras, name):
    """Each step of the optimizer, from the state it is in, against the papers' equations in float64
    on the same gradients: 100 steps of a training run of a model with biases and LayerNorm."""
    cls, options, flags = CASES[name]
    x, y = _data()
    model = _model(any_keras)
    optimizer = cls(**options, keras_version=_keras_version(any_keras))
    loss = any_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    start = model.get_weights()
    flags = flags or [(1, 1)] * len(start)
    worst = 0.0
    for t in range(1, STEPS + 1):
        grads = _gradients(model, loss, x[_batch(t)], y[_batch(t)])
        before = [v.numpy().astype("float64") for v in model.trainable_variables]
        slots_before = (
            [[s.numpy().astype("float64") for s in per] for per in zip(*_slots(optimizer))]
            if t > 1
            else [[np.zeros_like(w) for _ in cls._SLOTS] for w in before]
        )
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        for i, (decay, adapt) in enumerate(flags):
            w, slots = _reference_step(
                name,
                options,
                before[i],
                grads[i].numpy().astype("float64"),
                slots_before[i],
                t,
                decay,
                adapt,
            )
            worst = max(
                worst,
                float(np.abs(model.trainable_variables[i].numpy() - w).max()),
                *(
                    float(np.abs(s.numpy() - r).max())
                    for s, r in zip([p[i] for p in _slots(optimizer)], slots)
                ),
            )
    assert [
        getattr(v, "path", v.name.split(":")[0]).split("/", 1)[-1]
        if _keras_version(any_keras) == 3
        else v.name.split(":")[0]
        for v in model.trainable_variables
    ] == list(PATHS)
    # it trained
    assert max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), start)) > 0.05
    assert worst < 1e-6, worst


def _fit(k, name, devices):
    cls, options, _ = CASES[name]
    x, y = _data()
    strategy = tfpar.DataParallel(devices=tuple(devices))
    with strategy.scope():
        model = _model(k)
        model.compile(
            cls(**options, keras_version=_keras_version(k)),
            k.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    # 25 epochs' batches, in order, as one epoch (an epoch's set-up is most of a short one's time)
    epochs = STEPS // 4
    xs = np.concatenate([x] * epochs)
    ys = np.concatenate([y] * epochs)
    model.fit(xs, ys, batch_size=16, shuffle=False, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == STEPS
    return model.get_weights()


@pytest.mark.parametrize("name", ["lars-nesterov-excluding", "lamb-excluding"])
def test_two_devices_train_as_one_over_100_steps(any_keras, name):
    """The trust ratio comes from the all-reduced gradient: two replicas' halves of each batch give
    one device's steps."""
    one, two = _fit(any_keras, name, ["/cpu:0"]), _fit(any_keras, name, ["/cpu:0", "/cpu:1"])
    assert max(float(np.abs(a - b).max()) for a, b in zip(one, two)) < 1e-6


def _trained(k, name, strategy, batch, epochs=2, **overrides):
    """The regression MLP of tests/devices/test_gradients.py trained under ``strategy`` with the
    case's optimizer, made in the strategy's scope (Keras 3 places an optimizer's slots with the
    strategy current when it was made)."""
    from tests.devices.test_gradients import _data as regression
    from tests.devices.test_gradients import _fit as fit_mlp

    cls, options, _ = CASES[name]
    with strategy.scope():
        optimizer = cls(**{**options, **overrides}, keras_version=_keras_version(k))
    return fit_mlp(k, strategy, *regression(96), batch, epochs=epochs, optimizer=optimizer)[1]


@pytest.mark.parametrize("name", ["lars-nesterov-excluding", "lamb-excluding"])
def test_accumulated_compressed_and_loss_scaled_steps(any_keras, name):
    """2 accumulated steps of 16 on 2 replicas equal one device's steps of 32: the trust ratio of
    the accumulated gradient (LAMB without moment decay here), its ``iterations`` counting updates;
    with fp16 on the wire under mixed_float16 too, to fp16's accuracy; an inf gradient on one
    replica skips the step on both."""
    calm = dict(beta_1=0.0, beta_2=0.0) if name.startswith("lamb") else {}
    accumulated = _trained(
        any_keras, name, tfpar.DataParallel(gradient_accumulation_steps=2), 16, **calm
    )
    reference = _trained(any_keras, name, tfpar.DataParallel(devices=["/cpu:0"]), 32, **calm)
    assert (
        int(accumulated.optimizer.iterations.numpy())
        == int(reference.optimizer.iterations.numpy())
        == 6
    )
    for a, b in zip(accumulated.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    with pytest.warns(tfpar.precision.PrecisionWarning):  # no float16 GPU here: emulated
        tfpar.precision.use("mixed_float16")
    try:
        ours = _trained(
            any_keras,
            name,
            tfpar.DataParallel(compression="fp16", gradient_accumulation_steps=2),
            16,
            epochs=1,
            **calm,
        )
        mixed = _trained(
            any_keras, name, tfpar.DataParallel(devices=["/cpu:0"]), 32, epochs=1, **calm
        )
    finally:
        tfpar.precision.use("float32")
    assert type(ours.optimizer.inner_optimizer).__name__ == CASES[name][0].__name__
    for a, b in zip(ours.get_weights(), mixed.get_weights()):
        np.testing.assert_allclose(a, b, atol=2e-3, rtol=0)
    from tests.models import overflow_step

    cls, options, _ = CASES[name]
    report = overflow_step(
        tfpar.DataParallel(),
        k=any_keras,
        after=3,
        optimizer=lambda k: cls(**options, keras_version=_keras_version(k)),
    )
    assert report["skipped"] and report["updated"] and report["per_replica_equal"]
    assert report["loss_scale"][1] == report["loss_scale"][0] / 2


@pytest.mark.parametrize(
    "make, error, match",
    [
        (
            lambda: LARS(eta=-0.001),
            ValueError,
            r"eta must be a number >= 0. Received: eta=-0.001. eta is LARS' trust",
        ),
        (
            lambda: LARS(momentum=1.0),
            ValueError,
            r"momentum must be in \[0, 1\). Received: momentum=1.0",
        ),
        (lambda: LAMB(beta_2=1.5), ValueError, r"beta_2 must be in \[0, 1\). Received: beta_2=1.5"),
        (
            lambda: LAMB(weight_decay=-1e-4),
            ValueError,
            r"weight_decay must be a number >= 0. Received: weight_decay=-0.0001",
        ),
        (
            lambda: LAMB(exclude_from_weight_decay="bias"),
            TypeError,
            r"exclude_from_weight_decay must be a list of names. "
            r"Received: exclude_from_weight_decay='bias'. Write \['bias'\]",
        ),
        (
            lambda: LARS(exclude_from_layer_adaptation=["norm("]),
            ValueError,
            r"exclude_from_layer_adaptation holds an invalid "
            r"regular expression.*Received: .*\['norm\('\]",
        ),
        (
            lambda: LARS(keras_version=4),
            ValueError,
            r"Unknown keras_version 4. Received: keras_version=4. Use one of \[2, 3\]",
        ),
    ],
)
def test_bad_options_are_refused_at_once(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_a_pattern_that_matches_nothing_is_named_in_a_warning(any_keras):
    optimizer = LAMB(
        exclude_from_weight_decay=["bias", "layer_norm$"], keras_version=_keras_version(any_keras)
    )
    model = _model(any_keras)
    with pytest.warns(
        UserWarning,
        match=r"LAMB: the exclude_from_weight_decay pattern 'layer_norm\$' matches no "
        r"variable, so it excludes nothing. The variables: .*dense/kernel",
    ):
        optimizer.build(model.trainable_variables)
    # 'bias' matched, and no warning named it
    assert optimizer._decay_of(model.trainable_variables[1]) == 0.0


def test_an_optimizer_of_the_other_keras_is_refused_with_the_fix(any_keras):
    other = 3 if _keras_version(any_keras) == 2 else 2
    with tfpar.DataParallel().scope():
        model = _model(any_keras)
        with pytest.raises(
            TypeError,
            match=rf"optimizer must be a .* optimizer for .* model .*Use "
            rf"tfpar.optimizers.LARS\(..., keras_version={_keras_version(any_keras)}\)",
        ):
            model.compile(LARS(keras_version=other), "mse")
    # a model tfpar does not own: Keras' own refusal, which prints the optimizer as it should be
    # made
    with pytest.raises(
        ValueError,
        match=rf"tfpar.optimizers.LARS for Keras {other}.*keras_version="
        rf"{_keras_version(any_keras)}",
    ):
        _model(any_keras).compile(LARS(keras_version=other), "mse")


def test_a_sharded_optimizer_state_refuses_them_with_the_reason(any_keras):
    strategy = tfpar.DataParallel(zero_stage=1)
    with strategy.scope():
        model = _model(any_keras)
        with pytest.raises(
            ValueError,
            match=r"zero_stage=1 cannot shard the state of this optimizer: LARS scales each "
            r"layer's step by the layer's norms .*train it with zero_stage=0",
        ):
            model.compile(LARS(keras_version=_keras_version(any_keras)), "mse")


def test_a_pipeline_trains_with_them_as_the_plain_model(any_keras):
    """Each stage's variables are whole: the pipeline's steps (4 microbatches) equal the plain
    model's."""
    from tests.models import equivalence_data, max_weight_difference, pipeline_model

    x, y = equivalence_data()
    trained = []
    for staged in (False, True):
        model = pipeline_model(k=any_keras)
        if staged:
            model = tfpar.Pipeline(num_stages=2, num_microbatches=4).stage(model)
        model.compile(
            LAMB(
                0.01,
                weight_decay=0.01,
                exclude_from_weight_decay=["bias"],
                keras_version=_keras_version(any_keras),
            ),
            any_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        trained.append(model.plain_model() if staged else model)
    assert max_weight_difference(*trained) < 1e-5


def test_tensor_parallelism_refuses_them_with_the_reason(any_keras):
    """A split layer is one variable per device: each would get its own trust ratio, not the
    layer's."""
    from tests.models import tensor_parallel_models
    from tfpar.tensor_parallel import TensorParallel

    model, _, _, plan = tensor_parallel_models(any_keras)["mlp"]
    split = TensorParallel(degree=2, plan=plan).shard(model)
    with pytest.raises(
        ValueError,
        match=r"LAMB scales each layer's step by the norms of its whole weights .*tensor "
        r"parallelism holds a split layer as one variable per device.*Received: "
        r"optimizer=LAMB for model .*Use another optimizer with tensor parallelism",
    ):
        split.compile(LAMB(keras_version=_keras_version(any_keras)), "mse")


def test_saved_and_loaded_with_the_model(any_keras, tmp_path):
    """model.save / load_model keep the optimizer's class, options and slots ("tfpar>LAMB"
    registered)."""
    x, y = _data()
    model = _model(any_keras)
    model.compile(
        LAMB(**CASES["lamb-excluding"][1], keras_version=_keras_version(any_keras)),
        any_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = str(tmp_path / ("model.keras" if _keras_version(any_keras) == 3 else "model.h5"))
    model.save(path)
    loaded = any_keras.models.load_model(path)
    assert type(loaded.optimizer) is type(model.optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    for a, b in zip(_slots(loaded.optimizer)[1], _slots(model.optimizer)[1]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
