"""`tfpar._compat`: every private TensorFlow, tf_keras and TFMOT symbol tfpar uses, touched on real
objects.

A TensorFlow or tf_keras upgrade that moves one fails here, naming it. (It runs in the unit tier:
it builds small objects on the 2 virtual CPU devices of this process, and runs nothing.)
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import tfpar
from tfpar import _compat

keras = tfpar.keras


def test_every_name_of_the_seam_resolves():
    for name in _compat.__all__:
        assert getattr(_compat, name) is not None, name


@pytest.mark.parametrize("hook", _compat.MIRRORED_EXTENDED_HOOKS)
def test_mirrored_extended_still_has_the_hooks_horovod_strategy_uses(hook):
    assert hasattr(_compat.MirroredExtended, hook), (
        f"MirroredExtended.{hook} is gone: HorovodStrategy overrides or calls it"
    )


@pytest.mark.parametrize("hook", _compat.CROSS_DEVICE_OPS_HOOKS)
def test_cross_device_ops_still_has_the_hooks_horovod_strategy_overrides(hook):
    assert hasattr(tf.distribute.CrossDeviceOps, hook), f"CrossDeviceOps.{hook} is gone"


@pytest.mark.parametrize("hook", _compat.KERAS_CALLBACK_HOOKS)
def test_keras_callbacks_still_ask_the_hooks_tfpar_overrides(hook):
    assert isinstance(getattr(keras.callbacks.Callback(), hook)(), bool)
    assert hook in inspect.getsource(keras.callbacks.CallbackList), (
        f"CallbackList no longer asks {hook}"
    )


@pytest.mark.parametrize("member", _compat.KERAS_READS_FROM_EXTENDED)
def test_tf_keras_still_reads_what_horovod_strategy_defines(member):
    from tf_keras.src.distribute import distributed_file_utils

    assert f"extended.{member}" in inspect.getsource(distributed_file_utils), member


def test_mirrored_strategy_members():
    strategy = tfpar.DataParallel(all_reduce="hierarchical", num_packs=2)
    assert isinstance(
        _compat.cross_device_ops_of(strategy), tf.distribute.HierarchicalCopyAllReduce
    )
    assert strategy.extended._collective_key_base >= 100_000  # what set_collective_key_base gave it
    assert "container_strategy._collective_key_base" in inspect.getsource(
        _compat.MirroredExtended.__init__
    )
    with strategy.scope():
        mirrored = tf.Variable(1.0)
        own = _compat.ResourceVariable(2.0)  # not intercepted by the strategy's creator
    assert isinstance(mirrored, _compat.Mirrored)
    assert not isinstance(own, tf.distribute.DistributedValues)
    one = _compat.mirrored([tf.constant(3.0)])  # one device: the tensor itself
    assert float(one) == 3.0
    other = tfpar.DataParallel(devices=["/cpu:0"])
    _compat.set_collective_key_base(other, 7_000_000)
    assert other._collective_key_base == 7_000_000


def test_multi_worker_collective_set_up_still_reads_what_tfpar_sets():
    """A second multi-worker DataParallel keeps the first one's server: TensorFlow still starts it
    only where ``_std_server_started`` is unset, and keeps the server def it was started with."""
    from tensorflow.python.eager import context

    source = inspect.getsource(_compat.CollectiveAllReduceExtended._initialize_multi_worker)
    assert 'getattr(self, "_std_server_started", False)' in source
    assert "collective_key_base" in source
    assert hasattr(context.context(), "_collective_ops_server_def")
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": ["127.0.0.1:1"]}), task_type="worker", task_id=0
    )
    extended = type("Extended", (), {})()
    assert not _compat.keep_started_collective_server(extended, resolver)  # none started here
    assert not hasattr(extended, "_std_server_started")


def test_a_keras3_optimizer_still_counts_every_step_where_it_accumulates():
    import keras as keras3

    optimizer = keras3.optimizers.SGD(gradient_accumulation_steps=2)
    optimizer.build([keras3.Variable(1.0)])
    assert int(_compat.optimizer_steps(optimizer)) == 0
    # iterations: updates
    assert "floor_divide(" in inspect.getsource(type(optimizer).iterations.fget)


def test_keras_hub_fit_is_still_a_wrapper_of_keras_fit():
    """KerasHub's PipelineModel.fit, which tfpar steps past for a distributed dataset: still there,
    still refusing what is neither arrays nor a dataset it can map, with Keras' fit under it."""
    keras_hub = pytest.importorskip("keras_hub")
    from keras_hub.src.utils.pipeline_model import PipelineModel

    assert "fit" in vars(PipelineModel)
    assert "preprocess_samples" in inspect.getsource(PipelineModel.fit)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=8,
        num_layers=1,
        num_heads=1,
        hidden_dim=4,
        intermediate_dim=4,
        max_sequence_length=4,
    )
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    strategy = tfpar.DataParallel()
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.range(4).batch(2))
    fit = _compat.keras_hub_fit(model, dataset)
    assert fit is not None and fit is not PipelineModel.fit and fit.__name__ == "fit"
    assert _compat.keras_hub_fit(model, tf.data.Dataset.range(4)) is None  # KerasHub's own takes it


def test_distributed_dataset_builders_take_the_arguments_tfpar_passes():
    single = inspect.signature(_compat.get_distributed_dataset).parameters
    assert list(single)[:3] == ["dataset", "input_workers", "strategy"] and "options" in single
    from_function = inspect.signature(_compat.get_distributed_datasets_from_function).parameters
    assert {"dataset_fn", "input_workers", "input_contexts", "strategy", "options"} <= set(
        from_function
    )


def test_a_recording_tape_is_seen():
    assert not _compat.tape_recording()
    with tf.GradientTape():
        assert _compat.tape_recording()


@pytest.mark.parametrize("keras3", [False, True], ids=["tf_keras", "keras3"])
def test_a_call_s_training_mode_and_the_losses_its_layer_added(keras3):
    import importlib

    k = importlib.import_module("keras") if keras3 else tfpar.keras
    seen = []

    class Probe(k.layers.Layer):
        def __init__(self):
            super().__init__()
            self.dense = k.layers.Dense(2, kernel_regularizer="l2")

        def call(self, inputs):
            seen.append(_compat.training_of_the_call(keras3))
            self.add_loss(tf.reduce_sum(inputs))
            return self.dense(inputs)

    probe = Probe()
    probe(tf.ones((1, 2)), training=True)
    assert seen[-1] is True  # (Keras 3 calls it once more first, to build it: no call context)
    assert len(_compat.losses_added(probe)) == 1  # not the kernel's regularization
    assert _compat.flatten_layers(probe, include_self=False, recursive=False) == [probe.dense]


def test_xla_context_is_seen():
    assert not _compat.in_xla_context()
    seen = []

    @tf.function(jit_compile=True)
    def compiled(x):
        seen.append(_compat.in_xla_context())
        return x + 1

    compiled(tf.constant(1.0))
    assert seen[-1] is True  # (Keras 3 calls it once more first, to build it: no call context)


def test_checkpoint_initial_values_unwrap():
    from tensorflow.python.trackable.base import CheckpointInitialValue

    assert "self.wrapped_value = " in inspect.getsource(CheckpointInitialValue.__init__)
    tensor = tf.constant(1.0)
    assert _compat.unwrap_initial_value(tensor) is tensor


def test_parameter_server_worker_count_is_kept_where_read():
    from tensorflow.python.distribute import parameter_server_strategy_v2 as ps

    assert "self._num_workers = " in inspect.getsource(
        ps.ParameterServerStrategyV2Extended.__init__
    )


def test_the_dataset_creator_adapter_is_replaced_once_by_tfpars():
    from tf_keras.src.engine import data_adapter

    from tfpar.data import _ps_input

    adapters = data_adapter.ALL_ADAPTER_CLS
    assert (
        _ps_input._StepsExplainingAdapter in adapters
        and _compat.DatasetCreatorAdapter not in adapters
    )
    # again: no-op
    _compat.replace_data_adapter(_compat.DatasetCreatorAdapter, _ps_input._StepsExplainingAdapter)
    assert adapters.count(_ps_input._StepsExplainingAdapter) == 1


def test_the_learning_rate_an_optimizer_was_given():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    assert _compat.given_learning_rate(keras.optimizers.SGD(schedule)) is schedule
    assert _compat.given_learning_rate(keras.optimizers.legacy.SGD(schedule)) is schedule
    assert float(_compat.given_learning_rate(keras.optimizers.SGD(0.25))) == 0.25


def test_functional_graph_queries():
    inputs = keras.Input((3,))
    dense = keras.layers.Dense(2)
    outputs = dense(inputs)
    model = keras.Model(inputs, outputs)
    assert _compat.is_graph_network(model)
    assert _compat.output_structure(model) is outputs
    assert _compat.node_layer(_compat.layer_nodes_in(model, dense)[0]) is dense
    assert _compat.is_graph_network(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    assert not _compat.is_graph_network(Subclassed())
    assert _compat.keras_layer_of(outputs) is dense
    assert len(_compat.layer_nodes_in(model, dense)) == 1
    dense(keras.Input((3,)))  # a second call, outside this model
    assert len(dense.inbound_nodes) == 2 and len(_compat.layer_nodes_in(model, dense)) == 1


def test_keras_printer_goes_quiet_with_keras(capsys):
    _compat.print_msg("shown")
    keras.utils.disable_interactive_logging()
    try:
        _compat.print_msg("hidden")
    finally:
        keras.utils.enable_interactive_logging()
    assert capsys.readouterr().out == "shown\n"


def test_keras3_takes_a_data_adapter_as_it_is_and_asks_its_batches_first():
    """tfpar's parameter-server input relies on both to refuse a Keras 3 model clearly."""
    from keras.src.trainers.data_adapters import get_data_adapter
    from keras.src.trainers.epoch_iterator import EpochIterator

    adapter_class = _compat.keras3_data_adapter_class()
    adapter = adapter_class()
    assert get_data_adapter(adapter) is adapter
    assert "data_adapter.num_batches" in inspect.getsource(EpochIterator.__init__)


def test_keras3_tensors_name_the_layer_that_made_them():
    import keras as keras3

    inputs = keras3.Input((3,))
    dense = keras3.layers.Dense(2)
    assert _compat.keras_layer_of(dense(inputs)) is dense


def test_tf_keras_random_layers_say_how_they_draw():
    stateless = keras.layers.Dropout(0.3, seed=3, rng_type="stateless")
    assert _compat.random_generator_type(stateless) == "stateless"
    assert _compat.random_generator_type(keras.layers.Dropout(0.3)) != "stateless"
    assert _compat.random_generator_type(keras.layers.Dense(2)) is None


def test_tfmot_internals_tfpar_reaches():
    import tensorflow_model_optimization as tfmot

    pruning_wrapper, clustering_wrapper = _compat.tfmot_wrapper_classes()
    dense = keras.layers.Dense(4, input_shape=(3,))
    schedule = tfmot.sparsity.keras.ConstantSparsity(0.5, 0)
    assert isinstance(
        tfmot.sparsity.keras.prune_low_magnitude(dense, pruning_schedule=schedule), pruning_wrapper
    )
    assert isinstance(
        tfmot.clustering.keras.cluster_weights(
            keras.layers.Dense(4, input_shape=(3,)),
            number_of_clusters=2,
            cluster_centroids_init=tfmot.clustering.keras.CentroidInitialization.LINEAR,
        ),
        clustering_wrapper,
    )
    prelu = keras.layers.PReLU()
    prelu.build((None, 3))  # a weight of its own that TFMOT has no clustering for
    assert _compat.tfmot_can_cluster(keras.layers.Dense(4)) and not _compat.tfmot_can_cluster(prelu)
    # the two calls exact ranges intercept, through these names
    quant_ops = _compat.tfmot_quant_ops()
    source = inspect.getsource(quant_ops)
    assert (
        "tf.__internal__.train.assign_moving_average(" in source and "tf_compat.assign(" in source
    )
    assert quant_ops.tf_compat.assign and quant_ops.tf.__internal__.train.assign_moving_average


def test_where_each_keras_resumes_a_backup(tmp_path):
    import keras as keras3

    model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    # no backup restored: fit's own start
    assert _compat.tf_keras_resume_point(model, 10, 3) == (3, 0)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "b"), save_freq=5)
    backup.set_model(model)
    backup.on_train_begin()
    model._training_state._ckpt_saved_epoch.assign(1)  # what a backup after step 5 of epoch 2 holds
    model._training_state._ckpt_saved_batch.assign(4)
    assert _compat.tf_keras_resume_point(model, 10, 0) == (1, 5)
    # step 0 of epoch 2: after epoch 1's last step
    _compat.tf_keras_set_resume_point(model, 2, 0, 10)
    assert _compat.tf_keras_resume_point(model, 10, 0) == (2, 0)
    model3 = keras3.Sequential([keras3.layers.Input((2,)), keras3.layers.Dense(1)])
    _compat.keras3_start_at_epoch(model3, 2)
    model3.compile("sgd", "mse")
    history = model3.fit(np.zeros((4, 2)), np.zeros(4), epochs=4, verbose=0)
    assert history.epoch == [2, 3]  # Keras 3's fit read it


def test_the_remote_function_removal_tfpar_stops_at_exit():
    from tensorflow.python.eager import context
    from tensorflow.python.eager.polymorphic_function import atomic_function

    # what _compat.stop_removing_functions replaces
    assert callable(context.context().remove_function)
    assert "self._bound_context.remove_function(self.name)" in inspect.getsource(
        atomic_function.AtomicFunction
    )
    assert callable(_compat.stop_removing_functions)


def test_every_model_of_each_keras_runs_the_constructor_tfpar_wraps_under_a_scope():
    import keras as keras3

    for k, cls in (
        (keras, _compat.tf_keras_model_class()),
        (keras3, _compat.keras3_trainer_class()),
    ):
        seen, original = [], cls.__dict__["__init__"]

        def init(self, *args, _original=original, **kwargs):
            _original(self, *args, **kwargs)
            seen.append(type(self).__name__)

        class Sub(k.Model):
            def call(self, x):
                return x

        cls.__init__ = init
        try:
            inputs = k.Input((2,))
            k.Model(inputs, k.layers.Dense(1)(inputs))
            k.Sequential([k.Input((2,)), k.layers.Dense(1)])
            Sub()
        finally:
            cls.__init__ = original
        assert {"Functional", "Sequential", "Sub"} <= set(seen), (k.__name__, seen)


@pytest.mark.parametrize("kind", ["tf_keras", "keras"])
def test_fit_arguments_are_read_from_keras_fit_while_it_runs(kind):
    import keras as keras3

    k = keras if kind == "tf_keras" else keras3
    model = k.Sequential([k.Input((2,)), k.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, read = np.zeros((4, 2), "float32"), []

    class Read(k.callbacks.Callback):
        def on_train_begin(self, logs=None):
            read.append(_compat.fit_arguments(self.model))

    model.fit(x, np.zeros(4), epochs=3, initial_epoch=2, verbose=0, callbacks=[Read()])
    assert read[0]["x"] is x and read[0]["initial_epoch"] == 2
    assert _compat.fit_arguments(model) is None  # outside fit


def test_the_keras_internals_tfpar_reads_in_a_step_and_a_callback():
    import keras as keras3

    inner = keras.Sequential([keras.layers.Dense(1)], name="inner")
    outer = keras.Sequential([keras.Input((2,)), inner], name="outer")
    names = [layer.name for layer in _compat.flatten_layers(outer)]
    # the nested layer too
    assert names[0] == "outer" and {"inner", inner.layers[0].name} <= set(names)
    model = keras3.Sequential([keras3.Input((2,)), keras3.layers.Dense(1, kernel_regularizer="l2")])
    model.compile("sgd", "mse")
    y, y_pred = np.ones((4, 1), "float32"), np.zeros((4, 1), "float32")
    loss = float(_compat.keras3_compute_loss(model, y, y_pred, None))
    assert loss > 1.0  # the mse, 1, plus the kernel's l2
    tracker = _compat.keras3_loss_tracker(model)
    tracker.update_state(2.0)
    assert float(tracker.result()) == 2.0
    callback = _compat.take_logs_as_they_are(keras.callbacks.Callback())
    assert keras.callbacks.CallbackList([callback])._supports_tf_logs  # tf_keras hands over tensors


def test_the_moving_average_the_exact_ranges_replace_and_ray_s_placement():
    from ray.train import ScalingConfig

    variable = tf.Variable(0.0)
    _compat.assign_moving_average(variable, tf.constant(10.0), 0.5, zero_debias=False)
    assert float(variable.numpy()) == 5.0
    assert dict(_compat.ray_resources_per_worker(ScalingConfig(num_workers=2))) == {"CPU": 1}


def test_the_graph_walk_gives_each_layer_s_arguments_from_the_computed_values(any_keras):
    """graph_steps over both Kerases: a layer called with two arguments and a keyword (attention),
    one tensor used twice (a residual), each step's fill() giving the values it was called with."""
    k = any_keras
    inputs = k.Input((4, 8))
    attention = k.layers.MultiHeadAttention(2, 4, name="attention")
    h = attention(inputs, inputs, use_causal_mask=True)
    outputs = k.layers.Add(name="residual")([inputs, h])
    model = k.Model(inputs, outputs)
    input_keys, steps, output_keys = _compat.graph_steps(model)
    assert [layer.name for layer, *_ in steps] == ["attention", "residual"]
    values = {input_keys[0]: "x"}
    for layer, inputs_of, outputs_of, fill in steps:
        args, kwargs = fill(values)
        if layer.name == "attention":
            assert args[:2] == ("x", "x") and kwargs.get("use_causal_mask") is True, (args, kwargs)
        else:
            assert list(args[0]) == ["x", "h"], args
        values.update({key: "h" if layer.name == "attention" else "out" for key in outputs_of})
    assert [values[key] for key in output_keys] == ["out"]


@pytest.mark.parametrize(
    "environment, expected",
    [
        ({}, [(-3, 32 * 2**20), (-1, 64 * 2**20)]),  # the ceiling of glibc's dynamic rule
        ({"MALLOC_MMAP_THRESHOLD_": "1048576"}, [(-3, 1048576)]),  # the user's, which TF replaced
        ({"MALLOC_TRIM_THRESHOLD_": "0"}, []),  # the user chose glibc's fixed policy: 128 KiB stays
    ],
)
def test_the_malloc_thresholds_set_after_tensorflow_keep_what_the_user_chose(
    monkeypatch, environment, expected
):
    from tfpar._compat import allocator

    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert allocator._thresholds() == expected


def test_the_values_checkpoint_base_and_collectives_tfpar_builds_on():
    pair = _compat.PerReplica((tf.constant(1.0), tf.constant(2.0)))
    assert [float(v) for v in pair.values] == [1.0, 2.0]
    assert issubclass(tf.train.Checkpoint, _compat.Trackable)
    t = tf.constant([[1.0, 2.0]])
    for key, collective in enumerate(
        (
            _compat.collective_all_reduce,
            _compat.collective_all_gather,
            _compat.collective_all_to_all,
        )
    ):
        # A group of one: each collective gives the tensor back, as TensorFlow's own ops do.
        out = collective(t, group_size=1, group_key=7, instance_key=100 + key)
        np.testing.assert_array_equal(out.numpy(), t.numpy())


def test_the_optimizer_internals_of_each_keras():
    import keras as keras3

    schedule = keras3.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    optimizer = keras3.optimizers.SGD(schedule)
    assert float(_compat.current_learning_rate(optimizer)) == pytest.approx(0.1)
    optimizer.iterations.assign(1)
    assert float(_compat.current_learning_rate(optimizer)) == pytest.approx(0.05)
    legacy = keras.optimizers.SGD(0.2)
    assert float(_compat.current_learning_rate(legacy)) == pytest.approx(0.2)
    base = _compat.keras3_tf_optimizer_class(keras3)
    assert isinstance(optimizer, base) and hasattr(base, "_all_reduce_sum_gradients")
    assert _compat.keras3_tf_optimizer_class(keras) is None  # tf_keras has no such base


def test_a_keras3_layer_keeps_its_remat_scope_and_keras_stops_recomputing_it_on_request():
    import keras as keras3

    with keras3.RematScope(mode="list_of_layers", layer_names=["chosen"]):
        layer = keras3.layers.Dense(2, name="chosen")
    scope = _compat.keras3_remat_mode(layer)
    assert scope.mode == "list_of_layers" and scope.layer_names == ["chosen"]
    assert _compat.keras3_remat_mode(keras3.layers.Dense(2)) is None
    assert _compat.keras3_remat_mode(keras.layers.Dense(2)) is None  # tf_keras has no scope
    call = layer.call
    assert layer.rematerialized_call(call) is not call  # Keras' tf.recompute_grad of the call
    _compat.stop_keras3_remat(layer)
    assert layer.rematerialized_call(call) is call
    assert _compat.keras3_remat_mode(layer) is scope


def test_a_keras3_layer_s_own_variables_and_a_variable_s_storage():
    import keras as keras3

    block = keras3.Sequential([keras3.Input((3,)), keras3.layers.Dense(2)])
    dense = block.layers[0]
    assert _compat.keras3_own_trainable_variables(block) == []
    assert _compat.keras3_own_trainable_variables(dense) == [dense.kernel, dense.bias]
    storage = tf.Variable(tf.ones([3, 2]))
    _compat.keras3_replace_storage(dense.kernel, storage)
    assert dense.kernel.handle is storage.handle
    np.testing.assert_array_equal(dense(np.ones((1, 3), "float32")), np.full((1, 2), 3.0))


def test_a_tf_keras_layer_s_own_weights_replaced_and_its_optimizer_marked_built():
    block = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    dense = block.layers[0]
    assert _compat.tf_keras_own_trainable_weights(block) == []
    assert _compat.tf_keras_own_trainable_weights(dense) == [dense.kernel, dense.bias]
    old = dense.kernel
    new = tf.Variable(tf.ones([3, 2]), name="replaced")
    assert not _compat.tf_keras_replace_weight(block, old, new)  # the block does not hold it
    assert _compat.tf_keras_replace_weight(dense, old, new)
    assert dense.kernel is new and dense.trainable_weights == [new, dense.bias]
    names = {ref.name: ref.ref for ref in dense._checkpoint_dependencies}
    assert names["kernel"] is new
    np.testing.assert_array_equal(dense(np.ones((1, 3), "float32")), np.full((1, 2), 3.0))
    optimizer = keras.optimizers.Adam()
    _compat.tf_keras_mark_optimizer_built(optimizer)
    assert getattr(optimizer, "_built", False)


def test_tf_keras_trains_the_variables_trainable_at_compile():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.layers[0].trainable = False
    trained = _compat.tf_keras_trained_variables(model)
    assert len(trained) == 4 and len(model.trainable_variables) == 2
    assert not model.layers[0].trainable  # put back as the user set it


def test_the_parameter_server_worker_count_and_the_cpu_s_kernels():
    from tensorflow.python.distribute import parameter_server_strategy_v2 as ps

    extended = ps.ParameterServerStrategyV2Extended.__new__(ps.ParameterServerStrategyV2Extended)
    extended._num_workers = 3
    assert _compat.ps_num_workers(type("Strategy", (), {"extended": extended})()) == 3
    assert isinstance(_compat.onednn_enabled(), bool)
    assert _compat.keep_malloc_policy() is None  # once per process; again, a no-op


def test_every_name_of_the_seam_is_touched_by_a_test_of_its_own():
    import re

    with open(__file__, encoding="utf-8") as f:
        source = f.read().replace("for name in _compat.__all__", "")
    untouched = [name for name in _compat.__all__ if not re.search(rf"_compat\.{name}\b", source)]
    assert untouched == []
