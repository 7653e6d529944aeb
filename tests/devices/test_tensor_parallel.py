"""Tensor parallelism on the 2 virtual CPU devices of this process (T = 2): the same training as the
plain model, where each part lives, the communication of a step, and the plans it refuses.

T = 4 needs 4 devices: tests/multiproc/test_tensor_parallel.py.
"""

import numpy as np
import pytest

import tfpar
from tests.models import (
    tensor_parallel_models,
    traced_training_step,
    train_tensor_parallel_pair,
    variable_bytes_made_by,
    weight_differences,
)
from tfpar.tensor_parallel import TensorParallel
from tfpar.tensor_parallel.ops import count_communication

keras = tfpar.keras


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("name", ["mlp", "block", "embedding"])
def test_a_split_model_trains_exactly_like_the_plain_model(any_keras, name, optimizer):
    plain, split, model, initial = train_tensor_parallel_pair(name, 2, optimizer, k=any_keras)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(initial, plain)) > 1e-2  # it trained
    differences = weight_differences(model.plain_model(), plain, split, optimizer)
    assert max(differences.values()) < 1e-5, differences


def test_each_device_holds_half_of_each_planned_layer_and_of_its_optimizer_slots(any_keras):
    k = any_keras
    model, x, y, plan = tensor_parallel_models(k)["block"]
    whole = {
        (getattr(w, "path", None) or w.name).split(":")[0]: int(np.prod(w.shape)) * 4
        for w in model.weights
    }
    split = TensorParallel(degree=2, plan=plan).shard(model)
    split.compile(k.optimizers.Adam(0.01), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    split.fit(x, y, batch_size=8, epochs=1, verbose=0)
    held = split.device_bytes()
    assert sorted(held) == ["/CPU:0", "/CPU:1"]
    planned = sum(
        size
        for name, size in whole.items()
        if name.split("/")[0] in split.styles
        and not (
            name.endswith("attention_output/bias")
            or (name.startswith("block0_down") and name.endswith("bias"))
        )
    )
    replicated = sum(whole.values()) - planned
    assert held["/CPU:1"]["weights"] == planned // 2  # the other half of every planned weight
    assert held["/CPU:0"]["weights"] == planned // 2 + replicated  # and the replicated layers
    for device in held:  # Adam: two slots per weight, next to it
        assert held[device]["optimizer"] == 2 * held[device]["weights"], held
    described = TensorParallel(degree=2, plan=plan).describe(model=split)
    assert "mesh: data 1 x pipeline 1 x tensor 2" in described
    total = 3 * (planned + replicated)
    assert (
        f"/CPU:1: weights {planned // 2:,} B, optimizer {planned:,} B "
        f"({3 * planned // 2 / total:.0%} of one "
        f"device's {total:,} B)"
    ) in described, described


def test_a_transformer_step_holds_two_reductions_forward_and_two_backward_per_block(any_keras):
    """Megatron's count, from the ops of a traced training step: the attention's and the MLP's
    all-reduce forward, and the backward all-reduce of each one's input; no gather in between.
    The embedding's (by vocabulary) is one more forward reduction, before the blocks."""
    from tfpar.demo.tokens import TRANSFORMER_PLAN, token_data, transformer

    k = any_keras
    blocks = 3
    split = TensorParallel(degree=2, plan=TRANSFORMER_PLAN).shard(
        transformer(k, vocab=16, length=6, dim=8, heads=4, blocks=blocks)
    )
    x, y = token_data(4, vocab=16, length=6)
    loss = k.losses.SparseCategoricalCrossentropy(from_logits=True)
    counts = count_communication(traced_training_step(split, loss, x, y).as_graph_def())
    assert counts == {
        "tp_allreduce_forward": 2 * blocks + 1,
        "tp_allreduce_backward": 2 * blocks,
        "tp_allgather": 0,
    }


def test_auto_plan_finds_megatron_s_splits_and_a_gathered_column_layer_still_trains(any_keras):
    from tfpar.demo.tokens import transformer
    from tfpar.tensor_parallel.pairs import auto_plan

    k = any_keras
    model = transformer(k, vocab=16, length=6, dim=8, heads=4, blocks=2)
    assert auto_plan(model, 2, k) == {
        "embed": "vocab",
        "block0_attention": "heads",
        "block0_up": "column",
        "block0_down": "row",
        "block1_attention": "heads",
        "block1_up": "column",
        "block1_down": "row",
    }
    # 3 divides neither the heads, the vocabulary nor the widths
    assert auto_plan(model, 3, k) == {}
    # A column layer no row layer follows gathers its output (one all-gather), and trains.
    mlp, x, y, _ = tensor_parallel_models(k)["mlp"]
    initial = mlp.get_weights()
    split = TensorParallel(degree=2, plan={"up": "column"}).shard(mlp)
    split.compile(k.optimizers.SGD(0.1), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    split.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    plain = tensor_parallel_models(k)["mlp"][0]
    plain.set_weights(initial)
    plain.compile(k.optimizers.SGD(0.1), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    plain.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert (
        max(
            float(np.max(np.abs(a - b)))
            for a, b in zip(split.plain_model().get_weights(), plain.get_weights())
        )
        < 1e-5
    )


def test_the_plain_model_comes_back_with_the_trained_weights_and_saves(any_keras, tmp_path):
    k = any_keras
    model, x, y, plan = tensor_parallel_models(k)["block"]
    split = TensorParallel(degree=2, plan=plan).shard(model)
    split.compile(k.optimizers.SGD(0.1), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    split.fit(x, y, batch_size=8, epochs=1, verbose=0)
    predicted = split.predict(x, verbose=0)
    plain = split.plain_model()
    assert plain is model
    np.testing.assert_allclose(plain.predict(x, verbose=0), predicted, atol=1e-5)
    path = str(tmp_path / "model.keras")
    plain.save(path)
    np.testing.assert_allclose(
        k.models.load_model(path).predict(x, verbose=0), predicted, atol=1e-5
    )
    with pytest.raises(NotImplementedError, match=r"Save plain_model\(\) instead"):
        split.get_config()


BAD_PLANS = [
    ({"nope": "column"}, "mlp", 2, "plan names layer(s) the model does not have: ['nope']"),
    ({"up": "diagonal"}, "mlp", 2, "plan['up'] is an unknown style. Received: 'diagonal'"),
    (
        {"up": "heads"},
        "mlp",
        2,
        "layer 'up' is a Dense, and style 'heads' splits MultiHeadAttention layers",
    ),
    (
        {"down": "row"},
        "mlp",
        2,
        "layer 'down' is planned 'row', and its input is not the split output of a 'column' layer",
    ),
    (
        {"up": "column", "down": "row"},
        "mlp",
        3,
        "layer 'up' has 16 output columns (units), which the tensor-parallel degree does not "
        "divide. Received: degree=3",
    ),
    (
        {"block0_attention": "heads"},
        "block",
        3,
        "layer 'block0_attention' has num_heads=4, which the tensor-parallel degree does not "
        "divide. Received: degree=3",
    ),
    (
        {"embed": "vocab"},
        "embedding",
        5,
        "layer 'embed' has a vocabulary of input_dim=12, which the tensor-parallel degree does not "
        "divide. Received: degree=5. Pad the vocabulary to a multiple of 5",
    ),
]


@pytest.mark.parametrize(
    "plan, name, degree, message",
    BAD_PLANS,
    ids=["no-layer", "style", "wrong-layer", "row-unsplit", "units", "heads", "vocab"],
)
def test_a_bad_plan_is_refused_at_once_naming_the_layer_the_value_and_the_fix(
    plan, name, degree, message
):
    tfpar.configure_devices(2)
    model = tensor_parallel_models()[name][0]
    with pytest.raises(
        ValueError
    ) as error:  # a degree over 2 on 2 devices: the plan is checked first
        TensorParallel(degree=degree, plan=plan).shard(model)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "options, error, message",
    [
        (
            {"degree": 4},
            ValueError,
            "Tensor parallelism over degree=4 devices needs 4 devices. Received: 2",
        ),
        ({"degree": 0}, ValueError, "degree"),
        ({"plan": ["up"]}, TypeError, "plan must be a non-empty dict from layer names"),
        ({"plan": None}, TypeError, "plan must be a non-empty dict from layer names"),
        ({"degree": "2"}, TypeError, "degree"),
        (
            {"batch_axis": 0},
            TypeError,
            "batch_axis names a mesh axis (a str). Received: batch_axis=0.",
        ),
        (
            {"plan": {"(": "column"}},
            ValueError,
            "is neither a layer name nor a valid regular expression",
        ),
        ({"devices": ["/cpu:0", "/cpu:0"]}, ValueError, "devices must be distinct"),
    ],
)
def test_bad_options_are_refused(options, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        TensorParallel(**options).shard(tensor_parallel_models()["mlp"][0])


def test_a_subclassed_model_and_another_strategy_s_scope_are_refused():
    import tensorflow as tf

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(ValueError, match="a subclassed model. Build it with the functional API"):
        TensorParallel(degree=2).shard(Subclassed())
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        with pytest.raises(ValueError, match="cannot run inside another strategy's scope"):
            TensorParallel(degree=2).build(lambda: tensor_parallel_models()["mlp"][0])


def test_the_timeline_has_a_track_per_device_with_each_layer_part_and_the_activation_all_reduces(
    any_keras, tmp_path
):
    import json

    from tests.conftest import trace_tracks
    from tfpar.callbacks import Timeline

    k = any_keras
    model, x, y, plan = tensor_parallel_models(k)["block"]
    split = TensorParallel(degree=2, plan=plan).shard(model)
    split.compile(k.optimizers.SGD(0.1), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    split.fit(
        x,
        y,
        batch_size=8,
        epochs=1,
        verbose=0,
        callbacks=[Timeline(str(tmp_path / "timeline.json"))],
    )
    tracks = trace_tracks(json.loads((tmp_path / "timeline.json").read_text()))
    steps = len(x) // 8
    home, other = tracks[0, "device 0 (/device:CPU:0)"], tracks[0, "device 1 (/device:CPU:1)"]
    split_layers = ["embed", "block0_attention", "block0_up", "block0_down"]
    for layer in split_layers:  # each device runs its part of each split layer, every step
        assert (
            sum(e["name"] == layer for e in home) == steps
            and sum(e["name"] == layer for e in other) == steps
        )
    # The all-reduces land on the home device: forward, the embedding's, the attention's and the
    # MLP's; backward, those of the attention's and the MLP's inputs (Megatron's f and g).
    reductions = sorted({e["name"] for e in home if "all-reduce" in e["name"]})
    assert reductions == [
        "block0_attention all-reduce",
        "block0_attention all-reduce (backward)",
        "block0_down all-reduce",
        "block0_up all-reduce (backward)",
        "embed all-reduce",
    ]
    assert all(sum(e["name"] == r for e in home) == steps for r in reductions)
    assert not any("all-reduce" in e["name"] for e in other)
    # the first step, in order
    first = {e["name"]: e for e in home[: len(split_layers) + len(reductions)]}
    assert (
        first["block0_down all-reduce"]["ts"] + 1
        >= first["block0_down"]["ts"] + first["block0_down"]["dur"]
    )
    assert (
        first["block0_up all-reduce (backward)"]["ts"] + 1 >= first["block0_down all-reduce"]["ts"]
    )


def test_an_einsum_dense_pair_splits_by_columns_and_rows_and_trains_like_the_plain_model(any_keras):
    k = any_keras

    def build():
        k.utils.set_random_seed(5)
        inputs = k.Input((4, 8))
        h = k.layers.EinsumDense(
            "abc,cd->abd", output_shape=(4, 16), bias_axes="d", activation="relu", name="up"
        )(inputs)
        h = k.layers.EinsumDense("abd,de->abe", output_shape=(4, 8), bias_axes="e", name="down")(h)
        return k.Model(inputs, k.layers.Dense(3, name="head")(k.layers.Flatten()(h)))

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 4, 8)).astype("float32"), rng.integers(0, 3, 32)
    model = build()
    # auto finds the pair
    assert TensorParallel(degree=2).styles(model) == {"up": "column", "down": "row"}
    split = TensorParallel(degree=2, plan={"up": "column", "down": "row"}).shard(model)
    plain = build()
    for m in (split, plain):
        m.compile(
            k.optimizers.SGD(0.1, momentum=0.9),
            k.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert (
        max(
            float(np.abs(a - b).max())
            for a, b in zip(split.plain_model().get_weights(), plain.get_weights())
        )
        < 1e-5
    )
    # A kernel axis that is not the output's last cannot be split by columns: refused, naming the
    # equation.
    k.utils.set_random_seed(5)
    inputs = k.Input((8,))
    odd = k.Model(inputs, k.layers.EinsumDense("ab,cb->ac", output_shape=4, name="odd")(inputs))
    with pytest.raises(
        ValueError, match=r"layer 'odd' \(EinsumDense 'ab,cb->ac'\) cannot be split by columns"
    ):
        TensorParallel(degree=2, plan={"odd": "column"}).shard(odd)


def test_keras_tutorial_subclassed_layers_split_inside_and_train_like_one_device(any_keras):
    """Keras' "Text classification with Transformer" as the tutorial writes it (subclassed layers,
    no get_config, not registered): the default plan reaches into its blocks, the split model
    trains where the model trains on one device, and no full copy of a split weight stays alive."""
    from tests.keras_tutorial import tutorial_data, tutorial_model

    k = any_keras
    model = tutorial_model(k)
    split, made = variable_bytes_made_by(lambda: TensorParallel(degree=2).shard(model))
    held = split.device_bytes()
    assert sum(h["weights"] for h in held.values()) == made
    styles = sorted(split.styles.values())
    assert styles == ["column", "heads", "row", "vocab", "vocab"], split.styles
    assert held["/CPU:1"]["weights"] > 0

    x, y = tutorial_data()
    one_device = tutorial_model(k)
    for m in (split, one_device):
        m.compile(k.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
        m.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    trained = split.plain_model().get_weights()
    assert max(float(np.abs(a - b).max()) for a, b in zip(trained, model.get_weights())) == 0
    assert max(float(np.abs(a - b).max()) for a, b in zip(trained, one_device.get_weights())) < 1e-5


def test_a_frozen_layer_stays_frozen_and_lora_or_quantized_layers_are_refused(any_keras):
    """A layer the user froze is split frozen (the one-device run does not train it either); Keras
    3's LoRA and quantized layers, whose kernels are factors or integers, are refused by name and
    left replicated by the default plan."""
    k = any_keras
    trained = []
    for split in (True, False):
        model, x, y, plan = tensor_parallel_models(k)["mlp"]
        model.get_layer("up").trainable = False
        frozen = model.get_layer("up").get_weights()
        run = TensorParallel(degree=2, plan=plan).shard(model) if split else model
        loss = k.losses.SparseCategoricalCrossentropy(from_logits=True)
        run.compile(k.optimizers.SGD(0.1, momentum=0.9), loss)
        run.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        trained.append(run.plain_model().get_weights() if split else run.get_weights())
        for a, b in zip(model.get_layer("up").get_weights(), frozen):
            np.testing.assert_array_equal(a, b)
    assert max(float(np.abs(a - b).max()) for a, b in zip(*trained)) < 1e-5
    if not hasattr(k, "ops"):
        return  # LoRA and quantize() are Keras 3's
    model, _, _, plan = tensor_parallel_models(k)["mlp"]
    model.get_layer("up").enable_lora(2)
    with pytest.raises(ValueError, match="layer 'up' has LoRA enabled, and tensor parallelism"):
        TensorParallel(degree=2, plan=plan).shard(model)
    model, _, _, plan = tensor_parallel_models(k)["mlp"]
    model.get_layer("down").quantize("int8")
    with pytest.raises(ValueError, match=r"layer 'down' has quantized \(int8\)"):
        TensorParallel(degree=2, plan=plan).shard(model)
    from tfpar.tensor_parallel.sharding import auto_styles

    assert auto_styles(model, 2) == {}  # the pair is left whole: its row layer is quantized
