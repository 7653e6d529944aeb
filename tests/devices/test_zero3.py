"""ZeRO stage 3 (`DataParallel(zero_stage=3)`, tfpar/strategies/_zero3.py) on the 2 devices of this
process, Keras 3: each replica holds a piece of each parameter, of its gradient and of its
optimizer state; the trained weights are one device's; checkpoints hold the whole values; what it
cannot shard is refused. KerasHub's models: tests/devices/test_gradient_paths.py."""

import gc
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfpar
from tests.models import overflow_step, train_zero_pair, zero_resume

DEVICES = ["/cpu:0", "/cpu:1"]


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_sharded_parameters_train_like_one_device_and_each_replica_holds_its_pieces(optimizer):
    whole, sharded, model = train_zero_pair(keras, optimizer, DEVICES, 3)
    assert max(float(np.abs(a - b).max()) for a, b in zip(whole, sharded)) < 1e-6
    assert int(model.optimizer.iterations.numpy()) == 8  # 2 epochs of 4 steps
    zero = model._tfpar_zero
    # Dense(5) and Dense(3) of 7 inputs: kernels of 35 and 15, biases of 5 and 3, each cut in 2
    assert [b.piece for b in zero.buckets] == [18, 3, 8, 2]
    for variable, size in zip(model.trainable_variables, [35, 5, 15, 3]):
        parameter = variable._value
        assert type(parameter).__name__ == "ShardedParameter"
        assert [p.shape[0] for p in parameter.pieces] == [(size + 1) // 2] * 2
        assert [p.device.split("device:")[-1] for p in parameter.pieces] == ["CPU:0", "CPU:1"]
    text = model.distribute_strategy.describe(model=model)
    assert "zero:       stage 3: each replica keeps and updates 1/2 of the parameters" in text
    assert "weights 232 B -> 124 B, gradients 232 B -> 124 B" in text, text
    # each step gathers every parameter in the forward and reduce-scatters its gradient: 31
    # elements of 4 bytes each way from each replica
    assert zero.sent_bytes == [248, 248]


def test_a_unit_recomputed_gathers_its_parameters_again_for_its_backward(monkeypatch):
    """Every layer that holds parameters is a unit; one of KEEP_BELOW bytes or more recomputes its
    forward in the backward pass, so that its gathered parameters die after its forward (here
    every unit, KEEP_BELOW 0): a step sends 1.5x an all-reduce's bytes, as FSDP's does."""
    from tfpar.strategies import _zero3_units

    monkeypatch.setattr(_zero3_units, "KEEP_BELOW", 0)
    whole, sharded, model = train_zero_pair(keras, "adam", DEVICES, 3)
    assert max(float(np.abs(a - b).max()) for a, b in zip(whole, sharded)) < 1e-6
    assert [layer.__dict__.get("_tfpar_remat") for layer in model.layers] == [True, True]
    # 31 elements of 4 bytes each way: gathered in the forward, again in the backward, and the
    # gradients reduce-scattered; a ring all-reduce of the 62 padded elements sends 248 B
    assert model._tfpar_zero.sent_bytes == [3 * 124, 3 * 124]


def test_the_mirrored_copies_are_freed_once_sharded():
    strategy = tfpar.DataParallel(devices=DEVICES, zero_stage=3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64)])
        mirrored = [weakref.ref(v.value) for v in model.trainable_variables]
        model.compile(keras.optimizers.Adam(0.01), "mse")
    gc.collect()
    assert [ref() for ref in mirrored] == [None, None]
    # the optimizer built no slot of the whole shape either
    assert all(tuple(v.shape) != (64, 64) for v in model.optimizer.variables)


@pytest.mark.parametrize("first, then", [(2, 1), (1, 2)], ids=["2-to-1", "1-to-2"])
def test_a_checkpoint_holds_the_whole_values_and_moves_between_one_device_and_two(
    tmp_path, first, then
):
    assert zero_resume(keras, str(tmp_path), DEVICES[:first], DEVICES[:then], stage=3) < 1e-6


def test_accumulated_gradients_and_a_global_norm_train_like_one_device():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 7)).astype("float32")
    y = rng.integers(0, 3, 48)
    trained = []
    for zero, devices, batch in ((0, DEVICES[:1], 24), (3, DEVICES, 12)):
        strategy = tfpar.DataParallel(
            devices=devices, zero_stage=zero, gradient_accumulation_steps=24 // batch
        )
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential(
                [keras.Input((7,)), keras.layers.Dense(5), keras.layers.Dense(3)]
            )
            model.compile(
                keras.optimizers.Adam(0.05, global_clipnorm=0.1),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
        trained.append(model)
    one, sharded = trained
    difference = max(
        float(np.abs(a - b).max()) for a, b in zip(one.get_weights(), sharded.get_weights())
    )
    assert difference < 1e-5  # Adam's normalized steps: float32 sums in another order
    assert int(sharded.optimizer.iterations.numpy()) == 4  # 2 epochs of 2 windows


def test_an_overflow_on_one_replica_skips_the_step_on_both_under_mixed_float16():
    """Keras 3's LossScaleOptimizer wraps the sharded update: replica 1's inf gradient (in its
    pieces of the others' parameters too, after the reduce-scatter) skips the step on both, the
    scale halves, the next step applies; the weights end where the unsharded run's do."""
    adam = lambda k: k.optimizers.Adam(0.01)  # noqa: E731
    whole = overflow_step(tfpar.DataParallel(), k=keras, replica=1, optimizer=adam)
    sharded = overflow_step(tfpar.DataParallel(zero_stage=3), k=keras, replica=1, optimizer=adam)
    assert sharded["sharded"] and sharded["inner"] == "Adam"
    assert sharded["skipped"] and sharded["updated"]
    assert sharded["loss_scale"] == [32768.0, 16384.0, 16384.0]
    difference = max(
        float(np.abs(np.asarray(a, float) - np.asarray(b, float)).max())
        for a, b in zip(whole["weights"], sharded["weights"])
    )
    assert difference < 1e-6


def test_predict_and_evaluate_read_the_whole_parameters():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 7)).astype("float32")
    outputs = []
    for zero, devices in ((0, DEVICES[:1]), (3, DEVICES)):
        strategy = tfpar.DataParallel(devices=devices, zero_stage=zero)
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(3)])
            model.compile(keras.optimizers.SGD(0.1), "mse")
        kernel = tf.convert_to_tensor(model.layers[0].kernel)  # outside the strategy's replicas
        outputs.append((model.predict(x, verbose=0), model.evaluate(x, x[:, :3], verbose=0)))
        outputs[-1] += (kernel.numpy(),)
    # read where TensorFlow's default replica context is current: whole, not a piece
    np.testing.assert_array_equal(outputs[0][2], outputs[1][2])
    np.testing.assert_allclose(outputs[0][0], outputs[1][0], atol=1e-6)
    assert outputs[0][1] == pytest.approx(outputs[1][1], abs=1e-6)


def _compiled(model_fn, optimizer="adam", **options):
    strategy = tfpar.DataParallel(devices=DEVICES, zero_stage=3, **options)
    with strategy.scope():
        model = model_fn()
        model.compile(optimizer, "mse")
    return model


class _Unbuilt(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)


@pytest.mark.parametrize(
    "model_fn, optimizer, match",
    [
        (
            _Unbuilt,
            "adam",
            r"zero_stage=3 shards the variables a model has at compile; this one has unbuilt "
            r"layers .*Build it before compile",
        ),
        (
            lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]),
            keras.optimizers.RMSprop(0.01),
            r"zero_stage=3 cannot shard the state of this optimizer: .*RMSprop",
        ),
    ],
    ids=["unbuilt", "rmsprop"],
)
def test_what_stage_3_cannot_shard_is_refused_at_compile(model_fn, optimizer, match):
    with pytest.raises(ValueError, match=match):
        _compiled(model_fn, optimizer)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_tf_keras_model_trains_like_one_device_with_its_weights_replaced(optimizer, tmp_path):
    """tf_keras: each weight replaced by its pieces wherever its layer holds it (the attribute,
    the weight lists, the checkpoint dependency), so its own train step differentiates to the
    pieces; the mirrored copies go; a TF-format checkpoint moves between 2 replicas and one
    device."""
    import tf_keras

    whole, sharded, model = train_zero_pair(tf_keras, optimizer, DEVICES, 3)
    assert max(float(np.abs(a - b).max()) for a, b in zip(whole, sharded)) < 1e-6
    dense = model.layers[0]
    assert type(dense.kernel).__name__ == "ShardedParameter"
    assert dense.trainable_weights == [dense.kernel, dense.bias]
    assert [p.shape[0] for p in dense.kernel.pieces] == [18, 18]
    # SGD's checkpoint goes from 2 replicas to one device, Adam's from one device to 2 (Keras 3's
    # Adam goes both ways above; tf_keras' Adam from 2 replicas to one runs in the 2-worker job)
    first, then = (DEVICES, DEVICES[:1]) if optimizer == "sgd" else (DEVICES[:1], DEVICES)
    assert zero_resume(tf_keras, str(tmp_path), first, then, optimizer, stage=3) < 1e-6


def test_tf_keras_mirrored_copies_are_freed_and_a_mixed_policy_is_refused():
    import tf_keras

    strategy = tfpar.DataParallel(devices=DEVICES, zero_stage=3)
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(64)])
        mirrored = [weakref.ref(v) for v in model.trainable_variables]
        model.compile(tf_keras.optimizers.Adam(0.01), "mse")
    gc.collect()
    assert [ref() for ref in mirrored] == [None, None]
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with strategy.scope():
            model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2)])
            with pytest.raises(ValueError, match=r"tf_keras' mixed-precision weights.*Keras 3"):
                model.compile("adam", "mse")
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")


def test_tfpar_verify_proves_a_sharded_recomputed_step_equal_to_one_replica(capsys):
    """`tfpar verify --zero-stage 3 --remat blocks` on the text model (an Embedding: Keras 3's Adam
    takes its squared rows; an attention block recomputed, its layers run plain inside it), as the
    entry point calls it."""
    from tfpar import cli

    arguments = ["--model", "tests.gradient_paths:text_keras3"]
    arguments += ["--data", "tests.gradient_paths:text_data", "--steps", "3"]
    arguments += ["--zero-stage", "3", "--remat", "blocks"]
    assert cli.main(["verify", *arguments]) == 0
    out = capsys.readouterr().out
    assert "zero:       stage 3" in out and "PASSED: trains like one replica" in out, out
    assert "block(s) recompute their activations" in out


@pytest.mark.parametrize(
    "stage, clip",
    [(3, {}), (3, {"global_clipnorm": 0.05}), (2, {"global_clipnorm": 0.05})],
    ids=["stage-3", "stage-3-clipnorm", "stage-2-clipnorm"],
)
def test_an_embedding_s_rows_travel_instead_of_its_table(stage, clip):
    """An Embedding of 1,000 x 8 looked up 24 times a step per replica: at stage 3 its rows and
    indices are gathered (24 x 9 floats from each replica) instead of its table reduce-scattered
    (4,000 floats a replica), and each replica sums those in its half, their squares too (the
    global norm takes them; Keras 3's Adam too, but under a global_clipnorm, whose clipped
    gradients are dense: stages 1 and 2 squared the rows there too, 0.16 from one device): one
    device's weights."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 1000, size=(48, 4)).astype("int32")
    y = rng.normal(size=(48, 8)).astype("float32")
    trained = []
    for zero, devices in ((0, DEVICES[:1]), (stage, DEVICES)):
        strategy = tfpar.DataParallel(devices=devices, zero_stage=zero)
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = _bag_of_embeddings(1000, 8)
            model.compile(keras.optimizers.Adam(0.05, **clip), "mse")
        model.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)
        trained.append(model)
    one, sharded = trained
    difference = float(np.abs(one.get_weights()[0] - sharded.get_weights()[0]).max())
    assert difference < 1e-5  # Adam's normalized steps: float32 sums in another order
    if stage == 3:  # the forward's gather of 4,000 floats, then 24 rows of 8 values and an index
        assert sharded._tfpar_zero.sent_bytes == [4 * 4000 + 4 * 24 * 9] * 2


def _bag_of_embeddings(rows, width):
    return keras.Sequential(
        [
            keras.Input((4,), dtype="int32"),
            keras.layers.Embedding(rows, width),
            keras.layers.GlobalAveragePooling1D(),
        ]
    )


def test_clipping_an_embedding_s_rows_by_value_is_refused_when_traced():
    strategy = tfpar.DataParallel(devices=DEVICES, zero_stage=3)
    with strategy.scope():
        model = _bag_of_embeddings(10, 2)
        model.compile(keras.optimizers.SGD(0.1, clipvalue=1.0), "mse")
    x = np.zeros((8, 4), "int32")
    with pytest.raises(ValueError, match=r"zero_stage=3 cannot clip a sparse gradient by value"):
        model.fit(x, np.zeros((8, 2), "float32"), verbose=0)


def _fine_tuned(k, stage, devices):
    """A model trained 1 epoch, its first layer frozen, compiled again and trained 1 more (the
    fine-tuning flow: the frozen layer's parameters stay sharded by the first compile)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 7)).astype("float32")
    y = rng.normal(size=(48, 3)).astype("float32")
    strategy = tfpar.DataParallel(devices=devices, zero_stage=stage)
    with strategy.scope():
        k.utils.set_random_seed(1)
        regularizer = k.regularizers.L2(0.01)
        model = k.Sequential(
            [
                k.Input((7,)),
                k.layers.Dense(5, activation="relu", kernel_regularizer=regularizer),
                k.layers.Dense(3),
            ]
        )
        model.compile(k.optimizers.Adam(0.01), "mse")
    model.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)
    first = getattr(model, "_tfpar_zero", None)
    model.layers[0].trainable = False
    with strategy.scope():
        model.compile(k.optimizers.Adam(0.01), "mse")
    model.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)
    return model, first


def test_a_layer_frozen_after_training_keeps_its_pieces_and_the_rest_trains_on(any_keras):
    """Fine-tuning: the frozen layer's parameters keep the state that sharded them (read whole,
    its regularization loss read from its pieces: tf_keras binds it to the weight), whose
    optimizer state is released; the others are sharded again by the second compile; one
    device's weights."""
    one = _fine_tuned(any_keras, 0, DEVICES[:1])[0].get_weights()
    model, first = _fine_tuned(any_keras, 3, DEVICES)
    assert max(float(np.abs(a - b).max()) for a, b in zip(one, model.get_weights())) < 1e-5
    assert len(model._tfpar_zero.variables) == 2  # the second Dense's kernel and bias
    assert first.slot_variables() == []  # the first compile's Adam slots released
    assert model.layers[0].kernel.numpy().shape == (7, 5)  # read through the first state


def test_an_embedding_under_mixed_float16_takes_its_unscaled_squared_rows():
    """Keras 3's loss scale applies the update in a branch of its own and hands it unscaled
    gradients: the squared rows the backward kept (of scaled gradients) are found there and
    unscaled, as one device's Adam squares its unscaled rows."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 1000, size=(48, 4)).astype("int32")
    y = rng.normal(size=(48, 8)).astype("float32")
    trained = []
    tfpar.precision.use("mixed_float16")
    try:
        for zero, devices in ((0, DEVICES[:1]), (3, DEVICES)):
            strategy = tfpar.DataParallel(devices=devices, zero_stage=zero)
            with strategy.scope():
                keras.utils.set_random_seed(1)
                model = _bag_of_embeddings(1000, 8)
                model.compile(keras.optimizers.Adam(0.05), "mse")
            model.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)
            trained.append(model.get_weights()[0])
    finally:
        tfpar.precision.use("float32")
    assert float(np.abs(trained[0] - trained[1]).max()) < 1e-4  # float16 sums in another order


def test_tf_keras_loss_scale_is_refused_and_a_model_with_nothing_to_train_is_left_as_it_is():
    import tf_keras

    strategy = tfpar.DataParallel(devices=DEVICES, zero_stage=3)
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2)])
        scaled = tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.SGD(0.1))
        with pytest.raises(ValueError, match=r"cannot take tf_keras' LossScaleOptimizer"):
            model.compile(scaled, "mse")
        frozen = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        frozen.trainable = False
        frozen.compile("adam", "mse")
    assert not hasattr(frozen, "_tfpar_zero")


def test_remat_naming_a_small_layer_makes_its_gathering_call_recompute():
    """remat=["first"] names a layer under 64 KiB: its stage-3 call (gathered after its inputs,
    once per call) recomputes too, gathering again in the backward, instead of remat's own call
    replacing it; one device's weights."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 7)).astype("float32")
    y = rng.normal(size=(48, 3)).astype("float32")
    trained = []
    for zero, devices in ((0, DEVICES[:1]), (3, DEVICES)):
        strategy = tfpar.DataParallel(devices=devices, zero_stage=zero, remat=["first"])
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential(
                [keras.Input((7,)), keras.layers.Dense(5, name="first"), keras.layers.Dense(3)]
            )
            model.compile(keras.optimizers.Adam(0.01), "mse")
        model.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)
        trained.append(model)
    one, sharded = trained
    assert (
        max(float(np.abs(a - b).max()) for a, b in zip(one.get_weights(), sharded.get_weights()))
        < 1e-6
    )
    first = sharded.layers[0]
    assert first.__dict__["_tfpar_recomputes"] and first.__dict__["_tfpar_zero3"]
    # first's 18 + 3 elements gathered twice, the other's 8 + 2 once, all reduce-scattered
    assert sharded._tfpar_zero.sent_bytes == [4 * (2 * 21 + 10 + 31)] * 2
