"""Tensor parallelism on KerasHub's own task models (issue 48): the default plan reaches inside
their nested backbone and their decoder and encoder blocks, and 3 steps of `fit` with Adam end where
one device ends. Tiny configs, random weights, no download (`tests.gradient_paths.keras_hub_task`).
"""

import numpy as np
import pytest

from tests.gradient_paths import keras_hub_task
from tfpar.tensor_parallel import TensorParallel
from tfpar.tensor_parallel.ops import GATHER, count_communication

BLOCKS = 2  # keras_hub_task's num_layers
# What the default plan splits in each block (by the path inside the block); and the embedding.
_LLAMA_ATTENTION = {f"self_attention/{name}": "column" for name in ("query", "key", "value")}
_GEMMA_ATTENTION = {f"attention/{name}": "column" for name in ("query", "key", "value")}
SPLIT_IN_EACH_BLOCK = {
    "gpt2": {"self_attention": "heads", "feedforward_intermediate_dense": "column",
             "feedforward_output_dense": "row"},
    "bert": {"self_attention_layer": "heads", "feedforward_intermediate_dense": "column",
             "feedforward_output_dense": "row"},
    # KerasHub's own attention (grouped-query, rotary): its projections, gathered around the
    # attention itself; the gated MLP: the gate and up projections by columns, down by rows.
    "llama": {**_LLAMA_ATTENTION, "self_attention/attention_output": "row",
              "feedforward_gate_dense": "column", "feedforward_intermediate_dense": "column",
              "feedforward_output_dense": "row"},
    "gemma": {**_GEMMA_ATTENTION, "attention/attention_output": "row", "ffw_gating": "column",
              "ffw_gating_2": "column", "ffw_linear": "row"},
}


def _split_and_one_device(name):
    """(split model, plain model's weights after 3 steps on one device, x, y)."""
    import keras

    model, x, y = keras_hub_task(name, examples=12)
    split = TensorParallel(degree=2).shard(model)  # the model itself is left as it is
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    one_device = model.get_weights()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    split.compile(keras.optimizers.Adam(1e-2), loss)
    split.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    return split, one_device, x, y


@pytest.mark.parametrize("name", list(SPLIT_IN_EACH_BLOCK))
def test_keras_hub_task_models_split_inside_their_blocks_and_train_like_one_device(name):
    split, one_device, x, _ = _split_and_one_device(name)
    blocks = {}
    for path, style in split.styles.items():
        parts = path.split("/")
        if len(parts) >= 3:  # backbone/block/layer...
            blocks.setdefault(parts[1], {})["/".join(parts[2:])] = style
    assert len(blocks) == BLOCKS, split.styles
    assert all(block == SPLIT_IN_EACH_BLOCK[name] for block in blocks.values()), split.styles
    embeddings = [p for p, style in split.styles.items() if style == "vocab"]
    assert any(path.endswith("/token_embedding") for path in embeddings), split.styles
    held = split.device_bytes()
    assert len(held) == 2 and all(h["weights"] > 0 and h["optimizer"] > 0 for h in held.values())

    predicted = split.predict(x, verbose=0)
    plain = split.plain_model()
    trained = plain.get_weights()
    assert len(trained) == len(one_device) > 0
    differences = [float(np.max(np.abs(a - b))) for a, b in zip(trained, one_device)]
    assert max(differences) <= 1e-5, differences
    np.testing.assert_allclose(plain.predict(x, verbose=0), predicted, atol=1e-5)


def test_a_gpt2_step_holds_megatron_s_two_reductions_forward_and_two_backward_per_block():
    """From the ops of a traced training step: per block, the attention's and the MLP's all-reduce
    forward and the backward all-reduce of each one's input. The tied embedding adds one each way
    (the lookup's sum forward; the logits' input backward). The MLP's gathered activation has no
    reader, so TensorFlow never runs that gather; the logits' gather is the one that runs."""
    import keras
    import tensorflow as tf

    model, x, y = keras_hub_task("gpt2", examples=4)
    split = TensorParallel(degree=2).shard(model)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, split(x, training=True))
        return tape.gradient(value, split.trainable_variables)

    graph = step.get_concrete_function(x, y).graph
    counts = count_communication(graph.as_graph_def())
    assert counts["tp_allreduce_forward"] == 2 * BLOCKS + 1
    assert counts["tp_allreduce_backward"] == 2 * BLOCKS + 1
    ops = graph.get_operations()
    gathers = [op for op in ops if op.name.rsplit("/", 1)[-1].startswith(GATHER)]
    read = [op for op in gathers if any(t.consumers() for t in op.outputs)]
    assert len(gathers) == BLOCKS + 1 and len(read) == 1, [op.name for op in read]


@pytest.mark.parametrize("plan, message", [
    ({".*/no_such_layer": "column"}, r"plan names layer\(s\) the model does not have: \['\.\*/no_"),
    ({".*transformer_layer_0/self_attention": "column"}, "is a CachedMultiHeadAttention, and style"),
    ({".*transformer_layer_0/feedforward_output_dense": "row"}, None),
])
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
