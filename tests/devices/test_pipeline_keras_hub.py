"""Pipelines of KerasHub's own task models (issue 48): a task model around its backbone is cut
between the backbone's blocks, the hidden state and the padding mask crossing each cut, and 3
steps of `fit` with Adam end where one device ends. Tiny configs, random weights, no download
(`tests.gradient_paths.keras_hub_task`)."""

import numpy as np
import pytest

import tfpar
from tests.gradient_paths import keras_hub_task
from tfpar.pipeline import Pipeline

BLOCKS = {
    "gpt2": "transformer_layer",
    "bert": "transformer_layer",
    "llama": "transformer_layer",
    "gemma": "decoder_block",
    "bert_masked_lm": "transformer_layer",
}


_ONE_DEVICE = {}  # name -> the one-device model's weights after its 3 steps: the same in every test
# its tests in one test process, so that each one-device model trains once (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("tests.devices.test_pipeline_keras_hub")


def _staged_and_one_device(name, **options):
    """(staged model, its plain model's weights after 3 steps, the one-device model's)."""
    import keras

    keras.utils.set_random_seed(0)
    model, x, y = keras_hub_task(name, examples=12)
    start = model.get_weights()
    staged = Pipeline(**{"num_stages": 2, "num_microbatches": 2, **options}).stage(model)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    staged.compile(keras.optimizers.Adam(1e-2), loss)
    staged.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    trained = staged.plain_model().get_weights()
    if name not in _ONE_DEVICE:
        model.set_weights(start)
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        moved = max(float(np.abs(a - b).max()) for a, b in zip(start, model.get_weights()))
        assert moved > 1e-2  # it trained
        _ONE_DEVICE[name] = model.get_weights()
    return staged, trained, _ONE_DEVICE[name]


def _largest(trained, one_device):
    return max(float(np.abs(a - b).max()) for a, b in zip(trained, one_device))


@pytest.mark.parametrize("name", list(BLOCKS))
def test_a_task_model_is_cut_between_its_backbone_s_blocks_and_trains_like_one_device(
    name, tmp_path
):
    """Each task model, cut and trained like one device; the staged GPT-2 saves and loads as
    KerasHub's model, its trained weights with it."""
    import keras

    staged, trained, one_device = _staged_and_one_device(name)
    assert _largest(trained, one_device) < 1e-5
    if name == "gpt2":
        plain = staged.plain_model()
        plain.save(tmp_path / "gpt2.keras")
        loaded = keras.saving.load_model(tmp_path / "gpt2.keras")
        assert type(loaded) is type(plain)
        for a, b in zip(loaded.get_weights(), trained):
            np.testing.assert_array_equal(a, b)
    first, second = staged.partition.stages
    block = BLOCKS[name]
    described = staged.partition.describe()
    assert f"{block}_0" in first.layers and f"{block}_1" in second.layers, described
    # Balanced by parameters: no stage holds more than its share plus one block.
    backbone = staged.plain_model().backbone
    one_block = backbone.get_layer(f"{block}_0").count_params()
    total = sum(stage.parameters for stage in staged.partition.stages)
    assert max(first.parameters, second.parameters) <= total / 2 + one_block


@pytest.mark.parametrize(
    "name, options",
    [
        ("gpt2", {"schedule": "zb-h1"}),
        ("gpt2", {"schedule": "interleaved", "virtual_stages": 2}),
        # its second stage recomputes; the first holds the embeddings
        ("bert", {"recompute": True}),
        ("llama", {"balance": "time"}),  # each block's forward and backward measured
    ],
    ids=["zb-h1", "interleaved", "recompute", "time"],
)
def test_the_schedules_and_recomputation_cut_task_models_like_one_device(name, options, caplog):
    staged, trained, one_device = _staged_and_one_device(name, **options)
    assert _largest(trained, one_device) < 1e-5
    if options.get("virtual_stages"):
        assert len(staged.stages) == 4
    if options.get("recompute"):  # an embedding's stage keeps its activations, and says so
        assert "recompute kept: stage 0 keeps its activations: holds the Embedding" in caplog.text
        assert staged._recompute == [False, True]
    if options.get("balance"):  # cut between the blocks, the measured seconds as the costs
        first, second = staged.partition.stages
        assert "transformer_layer_0" in first.layers and "transformer_layer_1" in second.layers
        assert 0 < first.cost < 10 and 0 < second.cost < 10


def test_a_functional_model_around_a_functional_model_is_cut_inside_under_both_kerases(any_keras):
    """The same cut for a model written with either Keras: a backbone model called by a head."""
    k = any_keras

    def build():
        k.utils.set_random_seed(2)
        inputs = k.Input((8,))
        h = inputs
        for i in range(3):
            h = k.layers.Dense(16, activation="tanh", name=f"block_{i}")(h)
        backbone = k.Model(inputs, h, name="backbone")
        outer = k.Input((8,))
        return k.Model(outer, k.layers.Dense(3, name="head")(backbone(outer)), name="task")

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 8)).astype("float32"), rng.integers(0, 3, 16)
    runs = []
    for staged in (True, False):
        model = build()
        if staged:
            model = Pipeline(num_stages=2, num_microbatches=2).stage(model)
            first, second = model.partition.stages
            assert "block_0" in first.layers and "block_2" in second.layers  # inside the backbone
        loss = k.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(k.optimizers.Adam(1e-2), loss)
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        runs.append(model.plain_model().get_weights() if staged else model.get_weights())
    assert _largest(*runs) < 1e-5


def test_a_tf_keras_backbone_called_with_training_false_is_refused():
    """tf_keras keeps the recorded training=False of Keras' fine-tuning recipe; the stages would
    run the backbone in training mode."""
    import tf_keras as k

    tfpar.configure_devices(2)
    inputs = k.Input((8,))
    backbone = k.Model(inputs, k.layers.Dense(4, name="block")(inputs), name="backbone")
    outer = k.Input((8,))
    model = k.Model(outer, k.layers.Dense(2, name="head")(backbone(outer, training=False)))
    with pytest.raises(ValueError, match="with training=False, which tf_keras keeps"):
        Pipeline(num_stages=2, num_microbatches=2).stage(model)


def test_a_global_norm_clip_of_a_tied_embedding_is_refused_at_compile():
    """GPT-2's tied embedding has a copy in the first and the last stage: a global norm would count
    its gradient twice, so the step would differ from the plain model's."""
    import keras

    tfpar.configure_devices(2)
    model, _, _ = keras_hub_task("gpt2", examples=4)
    staged = Pipeline(num_stages=2, num_microbatches=2).stage(model)
    with pytest.raises(ValueError, match="global_clipnorm would count its gradient twice"):
        staged.compile(keras.optimizers.Adam(1e-2, global_clipnorm=1.0), "mse")


@pytest.mark.parametrize(
    "options, error, message",
    [
        (
            {"tensor_parallel": 2, "tensor_plan": {"no_such_layer": "column"}},
            ValueError,
            "plan names layer(s) the model does not have: ['no_such_layer']",
        ),
        (
            {"cut_points": ["no_such_layer"]},
            ValueError,
            "cut point 'no_such_layer' names no call of a layer",
        ),
        (
            {"cut_points": ["transformer_layer_0", "transformer_layer_0"], "num_stages": 3},
            ValueError,
            "cut_points must name distinct layers before the last",
        ),
        (
            {"cut_points": "transformer_layer_0"},
            TypeError,
            "cut_points must be 'auto' or a list of layer names",
        ),
        ({"cut_points": 1}, TypeError, "Received: cut_points=1."),
        (
            {"balance": "time", "layer_costs": {"transformer_layer_0": 1.0}},
            ValueError,
            "balance='time' on 'gpt2_causal_lm', which nests a model, needs",
        ),
    ],
)
def test_a_cut_tfpar_cannot_make_is_refused_before_anything_is_built(options, error, message):
    import re

    tfpar.configure_devices(2)
    model, _, _ = keras_hub_task("gpt2", examples=4)
    before = len(model.weights)
    pattern = re.escape(message).replace("gpt2_causal_lm", r"gpt2_causal_lm\w*")
    with pytest.raises(error, match=pattern):
        Pipeline(**{"num_stages": 2, "num_microbatches": 2, **options}).stage(model)
    assert len(model.weights) == before


def test_a_pipeline_recomputes_the_blocks_inside_its_stages_and_trains_like_one_device():
    """``Pipeline(remat="blocks")``: GPT-2's transformer layers, one in each stage, recompute their
    activations (the stage keeps their inputs)."""
    staged, trained, one_device = _staged_and_one_device("gpt2", remat="blocks")
    assert _largest(trained, one_device) < 1e-5
    described = Pipeline(num_stages=2, remat="blocks").describe(model=staged)
    assert "2 block(s) recompute their activations" in described, described
    marked = [layer.name for layer in staged._flatten_layers() if "_tfpar_remat" in layer.__dict__]
    assert sorted(marked) == ["transformer_layer_0", "transformer_layer_1"], described
