"""One script, unchanged, on any tfpar parallelism: a strategy, the pipeline or tensor parallelism
(`tfpar._parallelism`).

Run on 2 virtual CPU devices: DataParallel (2 replicas), the pipeline (2 stages), tensor parallelism
and TensorFlow's default strategy give the same losses on the same global batches.
"""

import numpy as np
import pytest

import tfpar
from tests.models import compile_for_equivalence, equivalence_data, pipeline_model
from tfpar.pipeline import Pipeline
from tfpar.tensor_parallel import TensorParallel

tf = pytest.importorskip("tensorflow")


def _script(parallelism, global_batch_size=32):
    """What demo and tune run: build, compile under scope, feed through tfpar.data, fit."""
    model = parallelism.build(pipeline_model)
    with parallelism.scope():
        compile_for_equivalence(model)
    x, y = equivalence_data()
    train = tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, y)), parallelism, global_batch_size
    )
    history = model.fit(train.dataset, steps_per_epoch=train.steps_per_epoch, epochs=3, verbose=0)
    return model, train, history.history["loss"]


@pytest.fixture(scope="module")
def reference():
    return _script(tfpar.DataParallel(devices=["/cpu:0"]))[2]


@pytest.mark.parametrize(
    "make, replicas, kind, described",
    [
        (lambda: tfpar.DataParallel(), 2, "Functional", "16 per replica"),
        (lambda: Pipeline(num_stages=2, num_microbatches=4), 1, "PipelineModel", "stage 1"),
        (
            lambda: TensorParallel(degree=2),
            1,
            "TensorParallelModel",
            "'dense_a': 'column', 'dense_b': 'row'",
        ),
    ],
    ids=["data_parallel", "pipeline", "tensor_parallel"],
)
def test_the_same_script_trains_the_same_on_a_strategy_and_on_the_pipeline(
    reference, make, replicas, kind, described
):
    parallelism = make()
    model, train, losses = _script(parallelism)
    assert parallelism.num_replicas_in_sync == replicas
    assert kind in [cls.__name__ for cls in type(model).__mro__]
    assert train.steps_per_epoch == 3  # 96 examples in global batches of 32, whatever the replicas
    np.testing.assert_allclose(losses, reference, rtol=1e-4)
    assert losses[-1] < losses[0]
    text = parallelism.describe(global_batch_size=32, model=model)
    assert "32" in text and described in text, text


def test_strategies_build_their_variables_under_their_scope():
    strategy = tfpar.DataParallel()
    model = strategy.build(pipeline_model)
    assert all(isinstance(v, tf.distribute.DistributedValues) for v in model.trainable_variables)
    assert strategy.input_strategy is strategy


def test_build_wants_the_function_and_the_pipeline_stays_out_of_other_scopes():
    with pytest.raises(
        TypeError, match=r"model_fn must be a function .* Received: model_fn=<tf_keras"
    ):
        tfpar.DataParallel().build(pipeline_model())
    with pytest.raises(TypeError, match=r"model_fn must be a function"):
        Pipeline(num_stages=2).build(pipeline_model())
    strategy = tfpar.DataParallel()
    with (
        strategy.scope(),
        pytest.raises(
            ValueError,
            match=r"cannot run inside another strategy's scope\. "
            r"Received: a call inside MirroredDataParallel",
        ),
    ):
        Pipeline(num_stages=2).build(pipeline_model)


def test_distribute_names_a_wrong_strategy():
    with pytest.raises(
        TypeError,
        match=r"strategy must be a tf.distribute.Strategy .* Received: strategy='mirrored'",
    ):
        tfpar.data.distribute(tf.data.Dataset.range(8), "mirrored", 4)


def test_every_parallelism_and_tensorflow_strategy_answers_its_topology():
    from tfpar._topology import Topology, topology_of
    from tfpar.strategies.horovod import HorovodStrategy

    mirrored = tfpar.DataParallel()
    assert mirrored.topology == topology_of(mirrored) == Topology(1, 0, 2, False)
    assert (
        mirrored.topology.is_chief
        and mirrored.topology.num_replicas == mirrored.num_replicas_in_sync == 2
    )
    assert topology_of(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])) == Topology(
        1, 0, 2, False
    )
    assert topology_of() == Topology()  # the default strategy, outside any scope
    with mirrored.scope():
        assert topology_of() is not None and topology_of().replicas_per_worker == 2
    pipeline = Pipeline(num_stages=2, num_microbatches=2)
    assert topology_of(pipeline) == Topology(1, 0, 1, False)
    assert topology_of(HorovodStrategy()) == Topology(1, 0, 1, False)  # one rank, alone


@pytest.mark.parametrize(
    "spec, code",
    [
        (dict(), "tfpar.DataParallel()"),
        (
            dict(compression="bf16", num_packs=2),
            "tfpar.DataParallel(compression='bf16', num_packs=2, all_reduce='hierarchical')",
        ),
        (
            dict(kind="horovod", compression="fp16"),
            "tfpar.strategies.HorovodStrategy(compression='fp16')",
        ),
        (
            dict(kind="pipeline", microbatches=4, schedule="interleaved", virtual_stages=2),
            "tfpar.pipeline.Pipeline(num_stages=2, num_microbatches=4, schedule='interleaved', "
            "virtual_stages=2)",
        ),
        (
            dict(kind="parameter_server", devices=3),
            "tfpar.strategies.ParameterServer.local(num_workers=3, num_ps=1)",
        ),
        (dict(kind="tensor_parallel", devices=2), "tfpar.tensor_parallel.TensorParallel(degree=2)"),
    ],
)
def test_one_spec_builds_a_parallelism_and_prints_the_code_that_builds_the_same(spec, code):
    from tfpar._factory import ParallelismSpec

    spec = ParallelismSpec(**spec)
    assert spec.code() == code
    if spec.kind == "parameter_server":
        return  # its build starts a local cluster (tests/multiproc)
    built, again = spec.build(), eval(code, {"tfpar": tfpar})  # noqa: S307 (our own code string)
    assert type(built) is type(again) and built.config == again.config
