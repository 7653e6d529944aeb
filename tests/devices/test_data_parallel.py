"""DataParallel on 2 virtual CPU devices in this process."""

import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfpar
from tests.conftest import run_command
from tests.models import compile_for_equivalence, equivalence_data, equivalence_model
from tfpar.cluster import ClusterInfo
from tfpar.devices import DevicesAlreadyInitializedError
from tfpar.strategies import DataParallel, DataParallelConfig, MirroredDataParallel

_model, _data, _compile = equivalence_model, equivalence_data, compile_for_equivalence


def test_is_a_real_strategy_with_a_summary():
    strategy = DataParallel()
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert isinstance(strategy, DataParallel) and isinstance(strategy, MirroredDataParallel)
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        model = _model()
    text = strategy.describe(global_batch_size=64, model=model)
    for part in (
        "workers:    1",
        "replicas:   2",
        "CPU:0",
        "CPU:1",
        "CollectiveAllReduce",
        "32 per replica, 64 global",
        f"{model.count_params():,} parameters",
    ):
        assert part in text


@pytest.mark.parametrize(
    "options, examples",
    [
        ({}, 96),
        ({}, 90),  # the sixth step: 10 real examples, 6 padding rows
        ({"all_reduce": "hierarchical", "num_packs": 2}, 90),
        ({"all_reduce": "reduce_to_one"}, 96),
    ],
    ids=["auto", "auto-padded", "hierarchical-2packs-padded", "reduce_to_one"],
)
def test_two_replicas_train_exactly_like_one_device_with_the_same_global_batch(options, examples):
    x, y = _data(examples)
    global_batch = 16
    single = _model()
    _compile(single)
    single.fit(x, y, batch_size=global_batch, epochs=2, shuffle=False, verbose=0)

    strategy = DataParallel(**options)
    if options.get("num_packs"):
        assert "HierarchicalCopyAllReduce, num_packs=2" in strategy.describe(global_batch_size=16)
    with strategy.scope():
        parallel = _model()
        _compile(parallel)
    np.testing.assert_array_equal(parallel.get_weights()[0], _model().get_weights()[0])
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch
    )
    assert train.steps_per_epoch == -(-len(x) // global_batch)
    parallel.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=2, verbose=0)
    # Its momentum slots were made before the first step, so the step was traced once (a first
    # trace that makes variables is traced again: tfpar.strategies._prebuild).
    assert parallel.train_function.experimental_get_tracing_count() == 1

    for a, b in zip(single.get_weights(), parallel.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    # The weights moved: the comparison is not between two untouched models.
    assert not np.allclose(single.get_weights()[0], _model().get_weights()[0], atol=1e-3)


@pytest.mark.parametrize("all_reduce", ["auto", "reduce_to_one"])
def test_all_reduce_choices_reduce_correctly(all_reduce):
    strategy = DataParallel(all_reduce=all_reduce)

    @tf.function
    def step():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce("sum", tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32))

    values = strategy.experimental_local_results(strategy.run(step))
    assert [float(v) for v in values] == [3.0, 3.0]


def test_num_packs_with_an_all_reduce_that_ignores_it_is_refused():
    with pytest.raises(
        ValueError,
        match=r"num_packs applies to all_reduce='nccl' or 'hierarchical' only.*"
        r"Received: all_reduce='auto', num_packs=4",
    ):
        DataParallelConfig(num_packs=4)


def test_explicit_devices_and_config_object():
    strategy = DataParallel(DataParallelConfig(devices=["/device:CPU:1"]))
    assert strategy.num_replicas_in_sync == 1
    assert strategy.extended.worker_devices[0].endswith("CPU:1")


def test_multi_worker_cluster_selects_multi_worker_class_without_starting(monkeypatch):
    # Choosing the class is pure; constructing it would start a server.
    from tfpar.strategies.data_parallel import _build_config

    cluster = ClusterInfo(
        cluster={"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, task_type="worker", task_index=1
    )
    assert _build_config(None, {"cluster": cluster}).multi_worker
    monkeypatch.setenv("TF_CONFIG", cluster.to_tf_config())
    assert _build_config(None, {}).multi_worker
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}),
    )
    assert not _build_config(None, {}).multi_worker


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            dict(all_reduce="allgather"),
            ValueError,
            r"Unknown all_reduce 'allgather'. Received: all_reduce='allgather'",
        ),
        (dict(all_reduce="nccl"), ValueError, r"all_reduce='nccl' needs GPUs"),
        (dict(all_reduce="ring"), ValueError, r"all_reduce='ring' needs several workers"),
        (dict(num_packs=-1), ValueError, r"num_packs must be an int >= 0. Received: num_packs=-1"),
        (
            dict(timeout_seconds=0),
            ValueError,
            r"timeout_seconds must be a number > 0. Received: timeout_seconds=0",
        ),
        (
            dict(devices=[]),
            ValueError,
            r"devices must name at least one device. Received: devices=\[\]",
        ),
        (
            dict(cluster={"worker": ["a:1"]}),
            TypeError,
            r"cluster must be a tfpar.cluster.ClusterInfo",
        ),
        (dict(bogus=1), TypeError, r"bogus"),
    ],
)
def test_bad_configuration(kwargs, error, match):
    with pytest.raises(error, match=match):
        DataParallel(**kwargs)


def test_multi_worker_rejects_one_host_options():
    cluster = ClusterInfo(
        cluster={"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, task_type="worker", task_index=0
    )
    with pytest.raises(ValueError, match=r"works on one host only; this cluster has 2 workers"):
        DataParallel(cluster=cluster, all_reduce="hierarchical")
    with pytest.raises(ValueError, match=r"devices applies to one host only"):
        DataParallel(cluster=cluster, devices=["/device:CPU:0"])


@pytest.mark.parametrize(
    "raw, match",
    [
        ("not json", r"TF_CONFIG must be JSON"),
        (
            '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 5}}',
            r"task index must be an int in \[0, 2\)",
        ),
    ],
)
def test_bad_tf_config_is_reported_by_the_strategy(monkeypatch, raw, match):
    monkeypatch.setenv("TF_CONFIG", raw)
    with pytest.raises(ValueError, match=match):
        DataParallel()


def test_global_batch_must_divide_by_replicas():
    strategy = DataParallel()
    with pytest.raises(
        ValueError, match=r"Received: global_batch_size=33 with 2 replicas. Use e.g. 32 or 34"
    ):
        strategy.describe(global_batch_size=33)
    with pytest.raises(ValueError, match=r"global_batch_size=33 with 2 replicas"):
        tfpar.data.distribute(tf.data.Dataset.range(10), strategy, 33)


def test_describe_counts_a_model_of_either_keras_and_refuses_anything_else():
    import keras as keras3

    for k in (keras3, tfpar.keras):
        model = k.Sequential([k.layers.Input((2,)), k.layers.Dense(1)], name=f"m_{k.__name__}")
        assert f"model:      m_{k.__name__}, 3 parameters" in DataParallel().describe(model=model)
    with pytest.raises(
        TypeError, match=r"model must be a Keras model .* Received: model=builtins.str"
    ):
        DataParallel().describe(model="model")
    with pytest.raises(TypeError, match=r"Expected a tf_keras.Model, received builtins.str"):
        tfpar.check_tf_keras_model("model")


def test_devices_configured_too_late_is_a_clear_error():
    assert tfpar.configure_devices(2) == ["/device:CPU:0", "/device:CPU:1"]  # what is there: fine
    with pytest.raises(
        DevicesAlreadyInitializedError, match=r"already initialised its devices with 2 CPU"
    ):
        tfpar.configure_devices(3)


@pytest.mark.parametrize(
    "value, error, match",
    [
        (0, ValueError, r"num_cpu_devices must be an int >= 1. Received: num_cpu_devices=0"),
        ("2", TypeError, r"num_cpu_devices must be an int. Received: num_cpu_devices='2' \(str\)"),
    ],
)
def test_bad_device_counts(value, error, match):
    with pytest.raises(error, match=match):
        tfpar.configure_devices(value)


def test_device_count_from_the_environment():
    """A fresh process, since this one's devices are configured already."""
    code = "import tfpar; print(tfpar.configure_devices()); print(len(tfpar.local_devices()))"
    result = run_command(
        [sys.executable, "-c", code], timeout=120, env={"TFPAR_NUM_CPU_DEVICES": "3"}
    )
    assert result.returncode == 0 and result.output.rstrip().endswith("3"), result.output
    result = run_command(
        [sys.executable, "-c", code], timeout=120, env={"TFPAR_NUM_CPU_DEVICES": "two"}
    )
    assert result.returncode != 0 and "TFPAR_NUM_CPU_DEVICES='two'" in result.output


def test_an_all_reduce_is_one_entry_of_the_table(monkeypatch):
    """ARCHITECTURE.md's walk-through: a new all-reduce is an entry of ALL_REDUCES; the choice, the
    messages that list the one-host and multi-worker ones, and describe() follow from it."""
    from tfpar.strategies import _all_reduce

    entry = _all_reduce.AllReduce(
        "to_first_device",
        one_host=lambda packs: tf.distribute.ReductionToOneDevice(reduce_to_device="/device:CPU:0"),
    )
    monkeypatch.setitem(_all_reduce.ALL_REDUCES, entry.name, entry)
    strategy = DataParallel(all_reduce="to_first_device")
    assert "ReductionToOneDevice (all_reduce='to_first_device')" in strategy.describe()
    with strategy.scope():
        model = tfpar.keras.Sequential([tfpar.keras.Input((2,)), tfpar.keras.layers.Dense(1)])
        model.compile(tfpar.keras.optimizers.SGD(0.1), "mse")
    model.fit(np.ones((8, 2), "float32"), np.ones(8, "float32"), batch_size=4, epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2
    with pytest.raises(
        ValueError,
        match=r"one host uses 'auto', 'nccl', 'hierarchical', 'reduce_to_one' or "
        r"'to_first_device'",
    ):
        DataParallel(all_reduce="ring")
    cluster = ClusterInfo(
        cluster={"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, task_type="worker", task_index=0
    )
    with pytest.raises(
        ValueError,
        match=r"all_reduce='to_first_device' works on one host only; .* Use 'auto', "
        r"'nccl' or 'ring'\.",
    ):
        DataParallel(cluster=cluster, all_reduce="to_first_device")


def test_fit_under_a_tfpar_strategy_reuses_freed_memory_where_tf_distribute_maps_it_anew():
    """The first iterator of a distributed dataset pins glibc's mmap threshold to 128 KiB (a
    TensorFlow patch for Python 3.11), so a step under bare MirroredStrategy takes every block
    above it from the kernel anew: page faults that doubled a step of Eigen's kernels. tfpar's
    strategies give glibc back its thresholds (`_compat.keep_malloc_policy`). A fresh process."""
    script = os.path.join(
        os.path.dirname(__file__), "..", "multiproc", "scripts", "malloc_policy.py"
    )
    result = run_command([sys.executable, script], timeout=240, env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert result.returncode == 0, result.output[-4000:]
    faults = json.loads(result.output.strip().splitlines()[-1])
    assert faults["onednn"] is False  # _compat.onednn_enabled reads TF_ENABLE_ONEDNN_OPTS=0
    assert faults["mirrored_faults_per_step"] > 1000, (
        f"{faults}: TensorFlow no longer pins the threshold; keep_malloc_policy can go"
    )
    # about 1 a step here in the steady state (the fewest of epochs 2-4), against 13,000
    assert faults["tfpar_faults_per_step"] * 10 < faults["mirrored_faults_per_step"], faults


def test_a_train_step_of_the_users_keeps_its_optimizer_to_the_variables_it_updates():
    """A ``train_step`` written as Keras' guide to customizing ``fit`` writes it, updating only the
    last layer: the optimizer is built by that step, with that layer's variables, as without
    tfpar (tfpar builds it before the first step only under Keras' own ``train_step``)."""
    keras = tfpar.keras

    class LastLayerOnly(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compiled_loss(y, self(x, training=True))
            head = self.layers[-1].trainable_variables
            self.optimizer.apply_gradients(zip(tape.gradient(loss, head), head))
            return {"loss": loss}

    x, y = _data(32)
    with DataParallel().scope():
        inputs = keras.Input((8, 8, 1))
        hidden = keras.layers.Dense(4, activation="relu")(keras.layers.Flatten()(inputs))
        model = LastLayerOnly(inputs, keras.layers.Dense(3)(hidden))
        model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy())
    body = [v.numpy() for v in model.layers[2].trainable_variables]
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    moments = [v for v in model.optimizer.variables() if "/m/" in v.name]
    assert [m.shape for m in moments] == [v.shape for v in model.layers[-1].trainable_variables]
    for before, after in zip(body, model.layers[2].trainable_variables):
        np.testing.assert_array_equal(before, after.numpy())


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_the_optimizer_built_before_fit_is_the_one_the_first_step_builds(policy):
    """A layer frozen after ``compile`` (``fit`` trains it, as compiled), a learning-rate schedule,
    and under mixed_float16 the LossScaleOptimizer compile wraps Adam in: the optimizer tfpar builds
    before ``fit`` has the variables, names and order of the one a plain tf_keras ``fit`` builds in
    its first step, the step is traced once, and the weights end as one device's."""
    keras = tfpar.keras
    x, y = _data(32)

    def build():
        keras.utils.set_random_seed(3)
        inputs = keras.Input((8, 8, 1))
        flat = keras.layers.Flatten()(inputs)
        hidden = keras.layers.Dense(4, activation="relu", name="body")(flat)
        model = keras.Model(inputs, keras.layers.Dense(3, name="head", dtype="float32")(hidden))
        rate = keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=1, decay_rate=0.9)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(keras.optimizers.Adam(rate), loss)
        model.get_layer("body").trainable = False  # after compile: fit trains it all the same
        return model

    keras.mixed_precision.set_global_policy(policy)
    try:
        single = build()
        start = single.get_layer("body").get_weights()[0]
        single.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        with DataParallel().scope():
            parallel = build()
        parallel.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert parallel.train_function.experimental_get_tracing_count() == 1
    names = [[v.name for v in model.optimizer.variables()] for model in (single, parallel)]
    assert names[0] == names[1] and len(names[1]) == 1 + 2 * 4, names  # iterations, m and v
    assert not np.array_equal(parallel.get_layer("body").get_weights()[0], start)
    tolerance = 1e-5 if policy == "float32" else 1e-2  # float16 sums the replicas' halves apart
    for a, b in zip(single.get_weights(), parallel.get_weights()):
        np.testing.assert_allclose(a, b, atol=tolerance, rtol=0)
