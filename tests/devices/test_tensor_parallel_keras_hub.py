"""Tensor parallelism on KerasHub's own task models (issue 48): the default plan reaches inside
their nested backbone and their decoder and encoder blocks, and 3 steps of `fit` with Adam end where
one device ends. Tiny configs, random weights, no download (`tests.gradient_paths.keras_hub_task`).
"""

import numpy as np
import pytest

from tests.gradient_paths import keras_hub_task
from tests.models import traced_training_step, variable_bytes_made_by
from tfpar.tensor_parallel import TensorParallel
from tfpar.tensor_parallel.ops import GATHER, count_communication

BLOCKS = 2  # keras_hub_task's num_layers
# What the default plan splits in each block (by the path inside the block); and the embedding.
_LLAMA_ATTENTION = {f"self_attention/{name}": "column" for name in ("query", "key", "value")}
_GEMMA_ATTENTION = {f"attention/{name}": "column" for name in ("query", "key", "value")}
SPLIT_IN_EACH_BLOCK = {
    "gpt2": {
        "self_attention": "heads",
        "feedforward_intermediate_dense": "column",
        "feedforward_output_dense": "row",
    },
    "bert": {
        "self_attention_layer": "heads",
        "feedforward_intermediate_dense": "column",
        "feedforward_output_dense": "row",
    },
    # KerasHub's own attention (grouped-query, rotary): its projections, gathered around the
    # attention itself; the gated MLP: the gate and up projections by columns, down by rows.
    "llama": {
        **_LLAMA_ATTENTION,
        "self_attention/attention_output": "row",
        "feedforward_gate_dense": "column",
        "feedforward_intermediate_dense": "column",
        "feedforward_output_dense": "row",
    },
    "gemma": {
        **_GEMMA_ATTENTION,
        "attention/attention_output": "row",
        "ffw_gating": "column",
        "ffw_gating_2": "column",
        "ffw_linear": "row",
    },
}


# The split column outputs a block's own code reads whole: Llama's and Gemma's attention computes
# on its query, key and value itself (rotary, grouped heads), and their gated MLP multiplies the
# gate and up projections before the down one. GPT-2's and BERT's MLP pass theirs to the row layer
# in parts: nothing is gathered.
READ_WHOLE = {
    "gpt2": set(),
    "bert": set(),
    "llama": {"query", "key", "value", "feedforward_gate_dense", "feedforward_intermediate_dense"},
    "gemma": {"query", "key", "value", "ffw_gating", "ffw_gating_2"},
}


def _split_and_one_device(name, tp=None, kv_heads=1):
    """(split model, plain model's weights after 3 steps on one device, x, y)."""
    import keras

    keras.utils.set_random_seed(0)
    model, x, y = keras_hub_task(name, examples=12, kv_heads=kv_heads)
    split = (tp or TensorParallel(degree=2)).shard(model)  # the model itself is left as it is
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    one_device = model.get_weights()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    split.compile(keras.optimizers.Adam(1e-2), loss)
    split.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    return split, one_device, x, y


@pytest.mark.parametrize("name", list(SPLIT_IN_EACH_BLOCK))
def test_keras_hub_task_models_split_inside_their_blocks_and_train_like_one_device(name):
    split, one_device, x, _ = _split_and_one_device(name)
    assert _styles_by_block(split) == [SPLIT_IN_EACH_BLOCK[name]] * BLOCKS, split.styles
    embeddings = [p for p, style in split.styles.items() if style == "vocab"]
    assert any(path.endswith("/token_embedding") for path in embeddings), split.styles
    held = split.device_bytes()
    assert len(held) == 2 and all(h["weights"] > 0 and h["optimizer"] > 0 for h in held.values())
    # What a block's own code reads whole (an all-gather each), said by describe() and timed.
    gathered = {layer for layer, _ in split.gathers()}
    assert gathered == READ_WHOLE[name], split.gathers()
    assert ("gathered:" in TensorParallel(degree=2).describe(model=split)) == bool(gathered)
    timed = {label for _, label in split.device_trace_labels() if label.endswith(" all-gather")}
    assert timed == {f"{layer} all-gather" for layer in gathered}

    predicted = split.predict(x, verbose=0)
    plain = split.plain_model()
    trained = plain.get_weights()
    _assert_equal_weights(trained, one_device)
    np.testing.assert_allclose(plain.predict(x, verbose=0), predicted, atol=1e-5)


def _styles_by_block(split):
    """Per block of the backbone, in order: {path inside the block: style}."""
    blocks: dict = {}
    for path, style in split.styles.items():
        parts = path.split("/")
        if len(parts) >= 3:  # backbone/block/layer...
            blocks.setdefault(parts[1], {})["/".join(parts[2:])] = style
    return list(blocks.values())


def _assert_equal_weights(trained, one_device):
    assert len(trained) == len(one_device) > 0
    differences = [float(np.max(np.abs(a - b))) for a, b in zip(trained, one_device)]
    assert max(differences) <= 1e-5, differences


def test_a_gpt2_step_holds_megatron_s_two_reductions_forward_and_two_backward_per_block():
    """From the ops of a traced training step: per block, the attention's and the MLP's all-reduce
    forward and the backward all-reduce of each one's input. The tied embedding adds one each way
    (the lookup's sum forward; the logits' input backward). The MLP's gathered activation has no
    reader, so TensorFlow never runs that gather; the logits' gather is the one that runs."""
    import keras

    model, x, y = keras_hub_task("gpt2", examples=4)
    split = TensorParallel(degree=2).shard(model)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    graph = traced_training_step(split, loss, x, y)
    counts = count_communication(graph.as_graph_def())
    assert counts["tp_allreduce_forward"] == 2 * BLOCKS + 1
    assert counts["tp_allreduce_backward"] == 2 * BLOCKS + 1
    ops = graph.get_operations()
    gathers = [op for op in ops if op.name.rsplit("/", 1)[-1].startswith(GATHER)]
    read = [op for op in gathers if any(t.consumers() for t in op.outputs)]
    assert len(gathers) == BLOCKS + 1 and len(read) == 1, [op.name for op in read]


@pytest.mark.parametrize(
    "plan, message",
    [
        (
            {".*/no_such_layer": "column"},
            r"plan names layer\(s\) the model does not have: \['\.\*/no_",
        ),
        (
            {".*transformer_layer_0/self_attention": "column"},
            "is a CachedMultiHeadAttention, and style",
        ),
        ({".*transformer_layer_0/feedforward_output_dense": "row"}, None),
    ],
)
def test_a_plan_names_layers_inside_blocks_by_their_paths(plan, message):
    model, _, _ = keras_hub_task("gpt2", examples=4)
    tp = TensorParallel(degree=2, plan=plan)
    if message is None:  # a row layer alone takes its input whole: each device its columns
        styles = tp.styles(model)
        assert list(styles.values()) == ["row"]
        assert list(styles)[0].endswith("/transformer_layer_0/feedforward_output_dense")
        return
    with pytest.raises(ValueError, match=message):
        tp.shard(model)


def _model_parallel(backbone, shape=(1, 2)):
    """``keras.distribution.ModelParallel`` as a Keras 3 script for JAX writes it, with the
    backbone's own layout map."""
    import keras

    mesh = keras.distribution.DeviceMesh(
        shape=shape,
        axis_names=("batch", "model"),
        devices=[f"cpu:{i}" for i in range(shape[0] * shape[1])],
    )
    layout_map = backbone.get_layout_map(mesh)
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


# The backbones' own layouts: Llama's splits its query, key and value by the hidden axis (rows),
# Gemma's by heads (its kernels' axis 0); both the attention output by heads, the MLP as Megatron.
LAYOUT_STYLES = {
    "llama": {
        **{f"self_attention/{name}": "row" for name in ("query", "key", "value")},
        "self_attention/attention_output": "row:0",
        "feedforward_gate_dense": "column",
        "feedforward_intermediate_dense": "column",
        "feedforward_output_dense": "row",
    },
    "gemma": {
        **{f"attention/{name}": "column:0" for name in ("query", "key", "value")},
        "attention/attention_output": "row:0",
        "ffw_gating": "column",
        "ffw_gating_2": "column",
        "ffw_linear": "row",
    },
}


@pytest.mark.parametrize("name", list(LAYOUT_STYLES))
def test_the_backbone_s_own_layout_map_splits_every_block_and_trains_like_one_device(name):
    import keras_hub

    backbones = {"llama": keras_hub.models.LlamaBackbone, "gemma": keras_hub.models.GemmaBackbone}
    tp = TensorParallel.from_distribution(_model_parallel(backbones[name]))
    assert tp.config.degree == 2  # the mesh's model axis
    split, one_device, _, _ = _split_and_one_device(name, tp, kv_heads=2)
    assert _styles_by_block(split) == [LAYOUT_STYLES[name]] * BLOCKS, split.styles
    _assert_equal_weights(split.plain_model().get_weights(), one_device)


def _layout(entries, shape=(1, 2)):
    import keras

    mesh = keras.distribution.DeviceMesh(
        shape=shape,
        axis_names=("batch", "model"),
        devices=[f"cpu:{i}" for i in range(shape[0] * shape[1])],
    )
    layout_map = keras.distribution.LayoutMap(mesh)
    for key, axes in entries.items():
        layout_map[key] = axes
    return layout_map


@pytest.mark.parametrize(
    "entries, shape, message",
    [
        (
            {"no_such_layer/kernel": ("model", None)},
            (1, 2),
            r"The layout map names variables the model does not have: \['no_such_layer/kernel'\]",
        ),
        (
            {"token_embedding/embeddings": (None, None)},
            (1, 2),
            r"The layout map splits no variable of 'gpt2_causal_lm\w*' over the mesh's model axis",
        ),
        (
            {"token_embedding/embeddings": (None, "model")},
            (1, 2),
            r"variable 'token_embedding/embeddings' \(layout \(None, 'model'\)\) splits an "
            r"embedding",
        ),
        (
            {"transformer_layer_0/feedforward_output_dense/bias": ("model",)},
            (1, 2),
            "belongs to Dense 'feedforward_output_dense'; tfpar splits the kernels",
        ),
        (
            {"token_embedding/embeddings": ("model", None)},
            (2, 2),
            r"The LayoutMap mesh's 'batch' axis is 2: data-parallel replicas, one per worker",
        ),
    ],
)
def test_a_layout_tfpar_cannot_realise_is_refused_naming_the_variable(entries, shape, message):
    model, _, _ = keras_hub_task("gpt2", examples=4)
    with pytest.raises(ValueError, match=message):
        TensorParallel(plan=_layout(entries, shape)).shard(model)


def test_a_degree_against_the_mesh_a_batch_only_mesh_and_a_distribution_as_plan_are_refused():
    import keras

    with pytest.raises(ValueError, match=r"degree is the LayoutMap mesh's model axis \(2\)"):
        TensorParallel(plan=_layout({"token_embedding/embeddings": ("model", None)}), degree=4)
    data_parallel = keras.distribution.DataParallel(devices=["cpu:0", "cpu:1"])
    with pytest.raises(TypeError, match="from_distribution takes a keras.distribution.Model"):
        TensorParallel.from_distribution(data_parallel)
    with pytest.raises(
        TypeError,
        match="For a keras.distribution.ModelParallel use "
        r"TensorParallel.from_distribution\(distribution\)",
    ):
        TensorParallel(plan=data_parallel)
    batch_only = keras.distribution.DeviceMesh(
        shape=(2,), axis_names=("batch",), devices=["cpu:0", "cpu:1"]
    )
    with pytest.raises(ValueError, match="The mesh has only the batch axis 'batch': no model axis"):
        TensorParallel(plan=keras.distribution.LayoutMap(batch_only))


def test_the_plain_gpt2_saves_and_loads_with_the_split_model_s_weights(tmp_path):
    """`plain_model()` gives back KerasHub's own GPT2CausalLM, which Keras saves and loads; the
    split model holds its parts and no whole copy of a split weight besides."""
    import keras

    keras.utils.set_random_seed(0)
    model, x, y = keras_hub_task("gpt2", examples=8)
    split, made = variable_bytes_made_by(lambda: TensorParallel(degree=2).shard(model))
    assert made == sum(held["weights"] for held in split.device_bytes().values())  # no full copy
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    split.compile(keras.optimizers.Adam(1e-2), loss)
    split.fit(x, y, batch_size=4, epochs=1, verbose=0)
    predicted = split.predict(x, verbose=0)
    plain = split.plain_model()
    assert plain is model
    plain.save(tmp_path / "gpt2.keras")
    loaded = keras.saving.load_model(tmp_path / "gpt2.keras")
    assert type(loaded) is type(model)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), predicted, atol=1e-5)


def test_a_layout_map_for_a_tf_keras_model_is_refused():
    import tfpar
    from tfpar.demo.tokens import transformer

    model = transformer(tfpar.keras, blocks=1)  # tf_keras
    with pytest.raises(TypeError, match="A LayoutMap plan names Keras 3 variables by their paths"):
        TensorParallel(plan=_layout({"embed/embeddings": ("model", None)})).shard(model)
