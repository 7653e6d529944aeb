"""``remat`` (activation checkpointing) on `DataParallel` (issue 50), 2 replicas of this process:
a block recomputed in the backward pass trains the weights it trains without (Keras 3's Dropout
and BatchNormalization included), KerasHub's GPT-2 recomputed trains like one device, the blocks
chosen and those kept say why, and bad options are refused. Peak memory:
tests/multiproc/test_remat_memory.py."""

import contextlib
import functools
import logging

import numpy as np
import pytest

import tfpar
from tests import gradient_paths
from tests.keras_tutorial import two_block_model


def residual_block(k):
    """A subclassed residual block of Conv2D, BatchNormalization and Dropout whose ``call`` takes
    no ``training`` (its sublayers inherit it from the call) and which holds a weight of its own
    (read under the policy's autocast)."""

    class ResidualBlock(k.layers.Layer):
        def __init__(self, filters, **kwargs):
            super().__init__(**kwargs)
            self.conv = k.layers.Conv2D(filters, 3, padding="same")
            self.norm = k.layers.BatchNormalization()
            self.drop = k.layers.Dropout(0.2)

        def build(self, input_shape):
            self.gate = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="gate")

        def call(self, inputs):
            x = self.norm(self.conv(inputs))
            return inputs + self.gate * self.drop(k.activations.relu(x))

    return ResidualBlock


def image_model(k, block=None):
    """The residual block (``block``: its class) between an input of 8x8x4 and 3 logits."""
    k.utils.set_random_seed(1)
    inputs = k.Input((8, 8, 4))
    x = (block or residual_block(k))(4, name="residual")(inputs)
    x = k.layers.GlobalAveragePooling2D()(x)
    model = k.Model(inputs, k.layers.Dense(3, dtype="float32")(x))
    model.compile(k.optimizers.Adam(1e-2), k.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@contextlib.contextmanager
def recomputations(cls):
    """The names of the layers of ``cls`` whose ``call`` ran as a recomputation (tfpar's, in the
    backward pass), while entered: a test that remat really recomputed."""
    from tfpar.remat import _recompute

    own = cls.call
    names = []

    @functools.wraps(own)  # Keras reads the call's signature through it
    def call(self, *args, **kwargs):
        if getattr(_recompute._recomputing, "layer", None) is self:
            names.append(self.name)
        return own(self, *args, **kwargs)

    cls.call = call
    try:
        yield names
    finally:
        cls.call = own


def train(k, make, remat, x, y):
    """The model ``make`` builds (with its block's class, or None), trained 4 steps under 2
    replicas with ``remat``; its weights, the strategy's description of it, and the names of the
    blocks whose call ran as a recomputation in fit."""
    strategy = tfpar.DataParallel(remat=remat)
    with strategy.scope():
        model, block = make()
    k.utils.set_random_seed(2)  # the same dropout seeds on both sides
    with recomputations(block) if block else contextlib.nullcontext([]) as recomputed:
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    return model.get_weights(), strategy.describe(model=model), recomputed


def largest_difference(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b))


def test_recomputed_blocks_train_the_weights_they_train_without(any_keras):
    """Keras 3's Dropout (rate 0.1) drops the forward's units when recomputed; tf_keras' blocks
    recompute where they draw no random numbers (rate 0)."""
    k = any_keras
    rate = 0.1 if k.__name__ == "keras" else 0.0
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, (64, 8)).astype("int32")
    y = rng.integers(0, 3, (64,))
    plain, _, none = train(k, lambda: two_block_model(k, rate), "none", x, y)
    recomputed, described, blocks = train(k, lambda: two_block_model(k, rate), "blocks", x, y)
    # each block's forward runs once more in each replica's traced step: its recomputation
    assert none == [] and sorted(blocks) == ["block_a", "block_a", "block_b", "block_b"], blocks
    assert "2 block(s) recompute their activations" in described, described
    assert "block_a, block_b" in described and "remat kept" not in described
    assert largest_difference(plain, recomputed) < 1e-6
    assert largest_difference(plain, two_block_model(k, rate)[0].get_weights()) > 1e-3  # it trained


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_a_recomputed_block_keeps_its_training_mode_state_and_autocast_under_keras3(policy):
    """Its Dropout and BatchNormalization in training mode (inherited: the block's call takes no
    ``training``), the same dropout units, the moving statistics moved once, its own weight read
    under the policy's autocast: the weights and statistics of the steps without remat."""
    import keras

    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 8, 8, 4)).astype("float32")
    y = rng.integers(0, 3, (64,))
    kept = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        plain, _, _ = train(keras, lambda: (image_model(keras), None), "none", x, y)
        block = residual_block(keras)
        with recomputations(block) as recomputed:
            make = lambda: (image_model(keras, block), None)  # noqa: E731
            trained, described, _ = train(keras, make, "blocks", x, y)
    finally:
        keras.config.set_dtype_policy(kept)
    assert recomputed == ["residual", "residual"], recomputed  # once in each replica's step
    assert "1 block(s) recompute" in described and "residual" in described, described
    assert largest_difference(plain, trained) < 1e-6  # the moving mean and variance too


def test_a_keras3_remat_scope_is_honoured_with_the_state_the_forward_read():
    """A block named in a Keras 3 RematScope: Keras alone recomputes it from the state its forward
    changed (its Dropout draws other units, its BatchNormalization moves twice); under tfpar, whose
    ``remat="none"`` honours the scope, tfpar recomputes it with the state the forward read: the
    weights of the same steps without a scope. A "larger_than" scope chooses by output size."""
    import keras

    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 8, 8, 4)).astype("float32")
    y = rng.integers(0, 3, (64,))

    def scoped(block=None, mode="list_of_layers"):
        with keras.RematScope(mode=mode, layer_names=["residual"]):
            return image_model(keras, block)

    def keras_alone(model):
        keras.utils.set_random_seed(2)
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        return model.get_weights()

    plain, _, _ = train(keras, lambda: (image_model(keras), None), "none", x, y)
    block = residual_block(keras)
    with recomputations(block) as recomputed:
        trained, described, _ = train(keras, lambda: (scoped(block), None), "none", x, y)
    assert recomputed == ["residual", "residual"], recomputed  # once in each replica's step
    assert "1 block(s) recompute their activations" in described, described
    assert "remat scope: 1 of them chosen by Keras' RematScope" in described, described
    assert largest_difference(plain, trained) < 1e-6
    alone = keras_alone(scoped())
    assert largest_difference(keras_alone(scoped(mode=None)), alone) > 1e-3  # Keras' own
    with keras.RematScope(mode="larger_than", output_size_threshold=40):
        inputs = keras.Input((8,))
        wide = keras.layers.Dense(64, name="wide")(inputs)
        mlp = keras.Model(inputs, keras.layers.Dense(16, name="narrow")(wide))
    plan = tfpar.remat.plan_remat(mlp, "none")
    assert [layer.name for layer in plan.recomputed] == ["wide"] and plan.scoped == ("wide",)


def test_a_model_made_in_a_full_remat_scope_trains_under_tfpar_as_without_it():
    """Keras would recompute the model's own call too, whose ``training`` keyword its
    ``tf.recompute_grad`` refuses in a graph: tfpar recomputes its layers instead."""
    import keras

    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = rng.integers(0, 3, (64,))

    def mlp():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(3, name="logits")(hidden))
        model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
        return model, None

    def scoped():
        with keras.RematScope(mode="full"):
            return mlp()

    plain, _, _ = train(keras, mlp, "none", x, y)
    trained, described, _ = train(keras, scoped, "none", x, y)
    assert "remat scope: 2 of them chosen by Keras' RematScope" in described, described
    assert largest_difference(plain, trained) < 1e-6
    keras_alone, _ = scoped()
    with pytest.raises(ValueError, match="supports keywords arguments only when eager"):
        keras_alone.fit(x, y, batch_size=16, verbose=0)


def test_tf_keras_keeps_a_block_whose_recomputation_would_differ_and_says_why():
    k = tfpar.keras
    dropout = tfpar.remat.plan_remat(two_block_model(k, 0.1)[0], "blocks")
    assert dropout.recomputed == ()
    assert [name for name, _ in dropout.kept] == ["block_a", "block_b"]
    assert "draws new random numbers when recomputed" in dropout.kept[0][1]
    norm = tfpar.remat.plan_remat(image_model(k), "blocks")
    assert norm.kept[0][0] == "residual" and "non-trainable weights" in norm.kept[0][1]
    frozen, _ = two_block_model(k, 0.0)
    frozen.get_layer("block_a").att.trainable = False  # fine-tuning: a frozen layer moves nothing
    plan = tfpar.remat.plan_remat(frozen, "blocks")
    assert [layer.name for layer in plan.recomputed] == ["block_a", "block_b"], plan.kept


def test_named_blocks_and_patterns_choose_the_outermost_layers_they_match():
    import keras

    model, _ = two_block_model(keras, 0.0)
    plan = tfpar.remat.plan_remat(model, ["block_?", "block_a", "embedding"])
    assert [layer.name for layer in plan.recomputed] == ["block_a", "block_b"]
    assert plan.kept[0][0] == "embedding" and "the whole table" in plan.kept[0][1]
    assert tfpar.remat.plan_remat(model, "none").lines() == []


def test_keras_hub_gpt2_recomputed_trains_like_one_device(capsys):
    """``tfpar verify --remat blocks`` as a user runs it: its transformer layers are the blocks;
    its token and position embedding keeps its activations (an Embedding's)."""
    import keras_hub

    from tfpar import cli

    models = "tests.gradient_paths"
    args = ["verify", "--model", f"{models}:gpt2_keras_hub", "--data", f"{models}:gpt2_data"]
    with recomputations(keras_hub.layers.TransformerDecoder) as recomputed:
        assert cli.main([*args, "--steps", "3", "--batch-size", "16", "--remat", "blocks"]) == 0
    assert sorted(set(recomputed)) == ["transformer_layer_0", "transformer_layer_1"], recomputed
    printed = capsys.readouterr().out
    assert "PASSED: trains like one replica" in printed, printed
    assert "2 block(s) recompute their activations" in printed, printed
    model = gradient_paths.gpt2_keras_hub()
    plan = tfpar.remat.plan_remat(model, "blocks")
    assert [layer.name for layer in plan.recomputed] == [
        "transformer_layer_0",
        "transformer_layer_1",
    ]


def test_a_tensor_parallel_gpt2_recomputes_its_split_blocks_and_trains_like_one_device():
    """`TensorParallel(remat="blocks")`: KerasHub's GPT-2 split over 2 devices (each block's
    attention by heads, its MLP by columns then rows) recomputes each block, its split layers and
    their all-reduces included, and trains the weights of one device; its embedding, split by
    vocabulary, keeps its activations, named once."""
    import keras
    import keras_hub

    from tfpar.tensor_parallel import TensorParallel

    keras.utils.set_random_seed(0)
    model, x, y = gradient_paths.keras_hub_task("gpt2", examples=12)
    tp = TensorParallel(degree=2, remat="blocks")
    split = tp.shard(model)
    model_before_fit = [w.copy() for w in model.get_weights()]
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    one_device = [w.copy() for w in model.get_weights()]  # plain_model() writes into model
    split.compile(keras.optimizers.Adam(1e-2), model.loss)
    with recomputations(keras_hub.layers.TransformerDecoder) as recomputed:
        split.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert sorted(recomputed) == ["transformer_layer_0", "transformer_layer_1"], recomputed
    described = tp.describe(model=split)
    assert "2 block(s) recompute their activations" in described, described
    assert described.count("remat kept: token_embedding: holds the Embedding") == 1, described
    trained = split.plain_model().get_weights()
    assert largest_difference(trained, one_device) < 1e-5
    assert largest_difference(trained, model_before_fit) > 1e-3  # it trained


@pytest.mark.parametrize(
    "environ, several",
    [
        ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1"}, False),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, True),
        ({"PMI_RANK": "0"}, True),  # a rank of an unknown number: refused, to be safe
        ({}, False),
    ],
)
def test_several_workers_are_read_from_the_launcher_s_environment(monkeypatch, environ, several):
    from tfpar.pipeline.workers import SIZE_VARIABLES, Workers

    ranks = ("TF_CONFIG", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
    for name in ranks + SIZE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert Workers.several() is several
    if environ:
        monkeypatch.setenv("HOROVOD_SIZE", "two")
        with pytest.raises(ValueError, match=r"Received: HOROVOD_SIZE='two'"):
            Workers.several()


def test_tensor_parallel_across_workers_refuses_remat_before_it_joins_them(monkeypatch):
    from tfpar.cluster import ClusterInfo
    from tfpar.tensor_parallel import TensorParallel

    cluster = ClusterInfo(
        cluster={"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, task_type="worker", task_index=0
    )
    monkeypatch.setenv("TF_CONFIG", cluster.to_tf_config())
    with pytest.raises(ValueError, match=r"remat with TensorParallel across workers .* Received: "):
        TensorParallel(degree=2, remat="blocks")


@pytest.mark.parametrize(
    "remat, error, match",
    [
        ("block", ValueError, r"remat takes \"none\", \"blocks\" or a list .*remat='block'"),
        (3, TypeError, r"Received: remat=3"),
        ([], TypeError, r"non-empty list .*Received: remat=\[\]"),
        (["ok", 4], TypeError, r"Received: 4 in remat=\['ok', 4\]"),
    ],
)
def test_bad_remat_options_are_refused_at_once(remat, error, match):
    with pytest.raises(error, match=match):
        tfpar.DataParallel(remat=remat)
    with pytest.raises(error, match=match):
        tfpar.Pipeline(num_stages=2, remat=remat)
    with pytest.raises(error, match=match):
        tfpar.tensor_parallel.TensorParallel(degree=2, remat=remat)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"recompute": True}, r"Received: recompute=True with remat='blocks'. Give one of them"),
        ({"tensor_parallel": 2}, r"Received: remat='blocks' with tensor_parallel=2. Use recompute"),
    ],
)
def test_a_pipeline_refuses_remat_with_what_it_does_not_combine_with(options, match):
    with pytest.raises(ValueError, match=match):
        tfpar.Pipeline(num_stages=2, remat="blocks", **options)


def test_a_tf_keras_pipeline_stage_that_draws_keeps_its_activations_under_recompute(caplog):
    """recompute=True recomputes whole stages by the rule of remat's blocks: a tf_keras stage with
    a Dropout would draw other units when recomputed (a gradient of another function), so it keeps
    its activations and says why; the other stage recomputes. The weights are those of the same
    steps without recompute."""
    k = tfpar.keras
    rng = np.random.default_rng(4)
    x = rng.normal(size=(32, 6)).astype("float32")
    y = rng.integers(0, 3, (32,))

    def trained(recompute):
        k.utils.set_random_seed(3)
        inputs = k.Input((6,))
        h = k.layers.Dense(16, activation="relu", name="dense_a")(inputs)
        h = k.layers.Dropout(0.3, seed=7, name="drop")(h)
        h = k.layers.Dense(16, activation="tanh", name="dense_b")(h)
        source = k.Model(inputs, k.layers.Dense(3, name="logits")(h))
        pipeline = tfpar.Pipeline(num_stages=2, cut_points=["drop"], recompute=recompute)
        staged = pipeline.stage(source)
        staged.compile(k.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
        k.utils.set_random_seed(5)  # the same dropout draws on both sides
        staged.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        return staged

    plain = trained(False)
    with caplog.at_level(logging.WARNING, logger="tfpar.pipeline.executor"):
        recomputed = trained(True)
    assert recomputed._recompute == [False, True]
    assert "recompute kept: stage 0 keeps its activations: tf_keras' 'drop' draws" in caplog.text
    trained_weights = recomputed.plain_model().get_weights()
    assert largest_difference(plain.plain_model().get_weights(), trained_weights) < 1e-6


def test_a_name_that_matches_no_layer_is_refused_before_fit_traces_anything():
    import keras

    strategy = tfpar.DataParallel(remat=["decoder_*"])
    with strategy.scope():
        model, _ = two_block_model(keras, 0.0)
    with pytest.raises(ValueError, match=r"'decoder_\*' matches none of .*Its layers: "):
        model.fit(np.zeros((16, 8), "int32"), np.zeros((16,)), batch_size=16, verbose=0)
    assert model.optimizer.iterations.numpy() == 0


def test_remat_composes_with_zero_accumulation_mixed_precision_and_compression(any_keras):
    """The gradient-path matrix's text model (its self-attention the block) through three paths,
    each with the attention recomputed, against one device: ZeRO 2 accumulating, ZeRO 1 under
    mixed_float16, bf16 on the wire."""
    name = "keras3" if any_keras.__name__ == "keras" else "tf_keras"
    paths = ["zero2+accumulate", "zero1+mixed_float16", "bf16"]
    with recomputations(any_keras.layers.MultiHeadAttention) as recomputed:
        report = tfpar.verify.verify(
            getattr(gradient_paths, f"text_{name}"),
            gradient_paths.text_data,
            steps=4,
            global_batch_size=16,
            paths=paths,
            remat="blocks",
        )
    assert set(recomputed) == {"attention"} and len(recomputed) >= 2 * len(paths), recomputed
    assert [row.path for row in report.rows] == paths
    assert all(row.verdict == "ok" for row in report.rows), report.describe()
    assert "1 block(s) recompute their activations" in report.describe(), report.describe()


def test_a_block_that_adds_a_loss_in_its_forward_is_refused_when_traced(any_keras):
    """A mixture of experts' router loss, an auxiliary loss: recomputed, it would have no
    gradient."""
    import tensorflow as tf

    k = any_keras

    class Routed(k.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = k.layers.Dense(4)

        def call(self, inputs):
            outputs = self.dense(inputs)
            self.add_loss(1e-2 * tf.reduce_mean(outputs**2))
            return outputs

    strategy = tfpar.DataParallel(remat="blocks")
    with strategy.scope():
        inputs = k.Input((4,))
        model = k.Model(inputs, k.layers.Dense(1)(Routed(name="router")(inputs)))
        model.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"remat recomputes 'router', which adds a loss"):
        model.fit(np.ones((16, 4), "float32"), np.ones((16, 1)), batch_size=16, verbose=0)


def test_a_named_nested_model_is_its_blocks():
    import keras

    model, _ = two_block_model(keras, 0.0)
    inputs = keras.Input((8,), dtype="int32")
    outer = keras.Model(inputs, keras.layers.Dense(2)(model(inputs)))
    plan = tfpar.remat.plan_remat(outer, [model.name])
    assert [layer.name for layer in plan.recomputed] == ["block_a", "block_b"]
