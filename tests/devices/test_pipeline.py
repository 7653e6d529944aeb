"""Pipeline on 2 virtual CPU devices: same training as the plain model, partitions, errors.

3 stages and the 2 x 2 hybrid need 3-4 devices: tests/multiproc/test_pipeline.py.
"""

import logging

import numpy as np
import pytest

import tfpar
from tests.models import (
    compile_for_equivalence,
    equivalence_data,
    max_weight_difference,
    pipeline_model,
)
from tfpar.pipeline import Pipeline

keras = tfpar.keras


def _train(model, epochs=3, k=keras, **fit):
    x, y = equivalence_data()
    compile_for_equivalence(model, k)
    return model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0, **fit)


_PLAIN = {}


def _plain(k):
    """The plain model trained in Keras ``k`` (once per Keras)."""
    if k not in _PLAIN:
        model = pipeline_model(k=k)
        _PLAIN[k] = model, _train(model, k=k)
    return _PLAIN[k]


@pytest.mark.parametrize(
    "schedule, recompute",
    [
        ("gpipe", False),
        ("1f1b", False),
        ("interleaved", False),
        ("zb-h1", False),
        ("1f1b", True),
        ("interleaved", True),
        ("zb-h1", True),
    ],
)
def test_two_stage_pipeline_trains_exactly_like_the_plain_model(any_keras, schedule, recompute):
    """Every schedule: "interleaved" cuts the model into 4 chunks, 2 per device; "zb-h1" takes
    each chunk's input gradient and its weight gradients in two separate calls. Recomputation is a
    chunk's own (tfpar.pipeline.executor.run_stage, whatever the order the schedule calls chunks
    in): under 1F1B (GPipe's chunks are its chunks, in another order), interleaved's 2 chunks a
    device, and ZB-H1, whose split backward it changes."""
    k = any_keras
    reference, history = _plain(k)
    staged = Pipeline(
        num_stages=2, num_microbatches=4, schedule=schedule, recompute=recompute
    ).stage(pipeline_model(k=k))
    assert isinstance(staged, k.Model)
    staged_history = _train(staged, k=k)
    assert max_weight_difference(staged.plain_model(), reference) < 1e-5
    np.testing.assert_allclose(staged_history.history["loss"], history.history["loss"], rtol=1e-5)
    x, y = equivalence_data()
    np.testing.assert_allclose(
        staged.evaluate(x, y, verbose=0), reference.evaluate(x, y, verbose=0), rtol=1e-5
    )
    # ZB-H1 splits B from W layer by layer in every chunk (each a chain of layers), except under
    # recompute, where one tape per chunk serves both.
    assert [chain is not None for chain in staged._chains] == [
        schedule == "zb-h1" and not recompute
    ] * len(staged.stages)
    # Each stage's variables live on its own device (chunk c on stage c mod 2).
    assert len(staged.stages) == (4 if schedule == "interleaved" else 2)
    for index, stage in enumerate(staged.stages):
        # Keras 3: .value
        devices = [v.device if hasattr(v, "device") else v.value.device for v in stage.variables]
        assert all(d.endswith(f"device:CPU:{index % 2}") for d in devices), devices


def test_partition_auto_and_explicit_cuts_and_its_description():
    model = pipeline_model()
    staged = Pipeline(num_stages=2, cut_points=["dense_a"]).stage(model)
    assert [s.layers for s in staged.partition.stages] == [
        ("conv", "flatten", "dense_a"),
        ("dense_b", "logits"),
    ]
    text = staged.partition.describe()
    assert "stage 0:" in text and "[conv, flatten, dense_a]" in text and "parameters" in text
    auto = Pipeline(num_stages=2).stage(pipeline_model()).partition
    costs = [s.parameters for s in auto.stages]
    assert sum(costs) == model.count_params()
    # "auto" picks the cut whose larger stage is smallest, among every valid cut.
    layers = [layer for layer in model.layers[1:]]
    best = min(
        max(
            sum(layer.count_params() for layer in layers[:k]),
            sum(layer.count_params() for layer in layers[k:]),
        )
        for k in range(1, len(layers))
    )
    assert max(costs) == best


def test_saved_plain_model_loads_and_predicts_like_the_pipeline(tmp_path):
    staged = Pipeline(num_stages=2, num_microbatches=2).stage(pipeline_model())
    _train(staged, epochs=1)
    x, _ = equivalence_data()
    path = str(tmp_path / "model.keras")
    staged.plain_model().save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(
        loaded.predict(x, verbose=0), staged.predict(x, verbose=0), rtol=1e-5, atol=1e-6
    )


def test_bubble_callback_logs_measured_and_theoretical_bubble(tmp_path, any_keras):
    staged = Pipeline(num_stages=2, num_microbatches=4, schedule="1f1b").stage(
        pipeline_model(k=any_keras)
    )
    steps = []  # the last epoch's steps' device_trace: a (start, end) row per instruction
    traces = any_keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: steps.clear(),
        on_train_batch_end=lambda b, logs: steps.append(staged.device_trace.numpy()),
    )
    history = _train(
        staged,
        epochs=2,
        k=any_keras,
        callbacks=[tfpar.callbacks.PipelineBubble(log_dir=str(tmp_path)), traces],
    )
    assert history.history["bubble_theory"] == [pytest.approx(1 / 5)] * 2
    # The measured bubble is the last epoch's instruction timestamps: 1 - the stages' mean busy
    # time over the steps' span (first start to last end). How near it lands to the theory depends
    # on the machine's load; bench/pipeline.py measures that ratio.
    assert len(steps) == -(-len(equivalence_data()[0]) // 32)
    assert all(
        trace.shape == (2 * 2 * 4, 2) and (trace[:, 1] >= trace[:, 0]).all() for trace in steps
    )
    busy = sum((trace[:, 1] - trace[:, 0]).sum() / 2 for trace in steps)
    span = sum(trace[:, 1].max() - trace[:, 0].min() for trace in steps)
    assert 0.0 < history.history["bubble"][-1] < 1.0
    assert history.history["bubble"][-1] == pytest.approx(1 - busy / span, rel=1e-6)
    assert list(tmp_path.rglob("events.out.tfevents*"))
    with pytest.raises(TypeError, match="PipelineBubble needs a model from Pipeline.stage"):
        _train(pipeline_model(), epochs=1, callbacks=[tfpar.callbacks.PipelineBubble()])


def test_batch_normalization_warns_once_at_staging(caplog):
    model = keras.Sequential(
        [
            keras.layers.Input((4,)),
            keras.layers.Dense(4),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(2),
        ]
    )
    with caplog.at_level(logging.WARNING, logger="tfpar.pipeline"):
        Pipeline(num_stages=2, num_microbatches=4).stage(model)
    assert [r.message for r in caplog.records if "BatchNormalization" in r.message] and len(
        caplog.records
    ) == 1


def test_batch_normalization_in_a_pipeline_uses_per_microbatch_statistics():
    def build():
        keras.utils.set_random_seed(0)
        return keras.Sequential(
            [
                keras.layers.Input((3,)),
                keras.layers.BatchNormalization(momentum=0.5, name="bn"),
                keras.layers.Dense(2, name="out"),
            ]
        )

    # Two microbatches with different means: the first 4 examples around 1, the last 4 around 5.
    x = np.concatenate([np.full((4, 3), 1.0), np.full((4, 3), 5.0)]).astype("float32")
    x += np.random.default_rng(0).normal(scale=0.1, size=x.shape).astype("float32")
    y = np.zeros((8, 2), "float32")
    staged = Pipeline(num_stages=2, num_microbatches=2, cut_points=["bn"]).stage(build())
    staged.compile("sgd", "mse")
    staged.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    moving_mean = staged.stages[0].get_layer("bn").moving_mean.numpy()
    first, second = x[:4].mean(0), x[4:].mean(0)
    # Two updates, one per microbatch: 0.5 * (0.5 * 0 + 0.5 * first) + 0.5 * second ...
    np.testing.assert_allclose(moving_mean, 0.25 * first + 0.5 * second, rtol=1e-5)
    # ... where the plain model makes one update with the whole batch's mean.
    plain = build()
    plain.compile("sgd", "mse")
    plain.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(
        plain.get_layer("bn").moving_mean.numpy(), 0.5 * x.mean(0), rtol=1e-5
    )


def test_fewer_microbatches_than_stages_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="tfpar.pipeline"):
        Pipeline(num_stages=2, num_microbatches=1)
    assert "the pipeline bubble (50% of the time) will dominate" in caplog.text


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.a, self.b = keras.layers.Dense(4), keras.layers.Dense(2)

    def call(self, x):
        return self.b(self.a(x))


def _skip_model():
    inputs = keras.Input((4,))
    a = keras.layers.Dense(4, name="a")(inputs)
    b = keras.layers.Dense(4, name="b")(a)
    c = keras.layers.Add(name="c")([a, b])
    return keras.Model(inputs, keras.layers.Dense(2, name="d")(c))


@pytest.mark.parametrize(
    "make_model, kwargs, error, match",
    [
        (
            pipeline_model,
            dict(num_stages=3),
            ValueError,
            r"needs replicas × num_stages = 1 × 3 = 3 devices. Received: 2",
        ),
        (
            lambda: keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(2)]),
            dict(num_stages=2, devices=("/cpu:0", "/cpu:1")),
            ValueError,
            r"num_stages=2 is more than the 1 layers",
        ),
        (
            pipeline_model,
            dict(num_microbatches=0),
            ValueError,
            r"num_microbatches must be an int >= 1. Received: num_microbatches=0",
        ),
        (
            pipeline_model,
            dict(schedule="zigzag"),
            ValueError,
            r"Unknown pipeline schedule 'zigzag'",
        ),
        (
            pipeline_model,
            dict(schedule="interleaved", virtual_stages=3),
            ValueError,
            r"virtual_stages=3 cuts 'pipeline_model' into num_stages × virtual_stages = 6 chunks, "
            r"and it has 4 valid cut "
            r"point\(s\), so at most 5 chunks. Received: virtual_stages=3 with num_stages=2. "
            r"Valid: virtual_stages in \[2\]",
        ),
        (
            pipeline_model,
            dict(schedule="interleaved", num_microbatches=3),
            ValueError,
            r"'interleaved' schedule needs num_microbatches a multiple of the 2 stages. Received: "
            r"num_microbatches=3",
        ),
        (
            pipeline_model,
            dict(schedule="zb-h1", num_microbatches=1),
            ValueError,
            r"'zb-h1' schedule needs num_microbatches at least the 2 stages. Received: "
            r"num_microbatches=1",
        ),
        (
            pipeline_model,
            dict(schedule="1f1b", virtual_stages=2),
            ValueError,
            r"virtual_stages applies to schedule='interleaved'",
        ),
        (
            pipeline_model,
            dict(cut_points=["nope"]),
            ValueError,
            r"Cut point 'nope' names no layer of 'pipeline_model'",
        ),
        (
            _skip_model,
            dict(cut_points=["b"]),
            ValueError,
            r"Cannot cut 'model.*' after 'b': more than one tensor crosses .* \['a', 'c'\]",
        ),
        (
            _Subclassed,
            dict(),
            ValueError,
            r"Cannot cut the subclassed model .* Write it as a Sequential or Functional model",
        ),
        (
            pipeline_model,
            dict(span_workers="yes"),
            TypeError,
            r"span_workers must be True or False. Received: span_workers='yes'",
        ),
        (
            pipeline_model,
            dict(span_workers=True, connect_timeout_seconds=0),
            ValueError,
            r"connect_timeout_seconds",
        ),
        (
            pipeline_model,
            dict(span_workers=True),
            ValueError,
            r"this process is in no job of several workers. Received: "
            r"span_workers=True with TF_CONFIG=unset. Start the script with tfpar launch -n N",
        ),
    ],
)
def test_bad_pipeline_input_gets_a_clear_error(make_model, kwargs, error, match):
    with pytest.raises(error, match=match):
        Pipeline(**kwargs).stage(make_model())


def test_zero_bubble_on_a_chunk_with_branches_warns_and_still_trains_like_the_plain_model(caplog):
    """The skip model's first chunk (a, b, c = a + b) is no chain: B and W split with one tape of
    the chunk there (W recomputes its backward chain), which a warning says; the result is exact."""
    import numpy as np

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(32, 4)).astype("float32"), rng.normal(size=(32, 2)).astype("float32")
    keras.utils.set_random_seed(5)
    plain = _skip_model()
    keras.utils.set_random_seed(5)
    source = _skip_model()
    with caplog.at_level(logging.WARNING, logger="tfpar.pipeline.model"):
        staged = Pipeline(
            num_stages=2, num_microbatches=4, schedule="zb-h1", cut_points=["c"]
        ).stage(source)
    assert "zb-h1: chunk(s) [0] are not a chain of one-input layers" in caplog.text
    assert staged._chains[0] is None and staged._chains[1] is not None
    for model in (plain, staged):
        model.compile(keras.optimizers.SGD(0.1), "mse")
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert max_weight_difference(staged.plain_model(), plain) < 1e-5


def test_microbatches_that_do_not_divide_the_batch_are_refused_before_a_step():
    import tensorflow as tf

    staged = Pipeline(num_stages=2, num_microbatches=4).stage(pipeline_model())
    x, y = equivalence_data(30)
    compile_for_equivalence(staged)
    # Arrays: by fit, from their sizes; a dataset of fixed batches: when the step is traced.
    with pytest.raises(
        ValueError,
        match=r"= 4 equal microbatches. Received: 30 examples in batches of batch_size=30",
    ):
        staged.fit(x, y, batch_size=30, epochs=1, verbose=0)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(30, drop_remainder=True)
    with pytest.raises(
        ValueError, match=r"replicas × num_microbatches = 1 × 4 must divide the batch"
    ):
        staged.fit(batches, epochs=1, verbose=0)
    assert int(staged.optimizer.iterations) == 0


def test_balance_by_measured_time_cuts_where_the_time_is(any_keras):
    """A 64x64 convolution is slow but small (1.8k parameters); the Dense after it is large
    (16.6k) but quick. By parameters the first stage takes the Dense too; by measured time the
    convolution is a stage of its own."""
    from tfpar.pipeline.costs import measure_layer_costs
    from tfpar.pipeline.partition import partition_model

    keras = any_keras
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64, 64, 3))
    h = keras.layers.Conv2D(64, 3, padding="same", name="conv")(inputs)
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    h = keras.layers.Dense(256, name="wide")(h)
    model = keras.Model(inputs, keras.layers.Dense(10, name="out")(h))
    costs = measure_layer_costs(model)
    assert costs["conv"] > 10 * max(costs["wide"], costs["out"]), costs
    by_params = partition_model(model, 2, balance="params")
    by_time = partition_model(model, 2, balance="time")
    assert by_params.stages[0].layers == ("conv", "pool", "wide")
    assert by_time.stages[0].layers == ("conv",) and by_time.balance == "time"  # measured by itself
    assert "balanced by time" in by_time.describe()
    given = partition_model(model, 2, balance="time", layer_costs=costs)
    assert given.stages[0].layers == ("conv",) and given.stages[0].cost == pytest.approx(
        costs["conv"]
    )


class _VShape:
    """A schedule with its own chunk placement (ARCHITECTURE.md's walk-through: a schedule is a
    subclass and its test): 2p chunks, stage s holding chunks s and 2p-1-s (a V, as the ZB-V
    schedule places them), run GPipe-like: both chunks' forwards, then both backwards."""

    @staticmethod
    def make():
        from tfpar.pipeline import schedule

        class VShape(schedule.Schedule):
            name = "v-shape"
            default_virtual_stages = 2

            def stage_of(self, chunk):
                p = self.num_stages
                return chunk if chunk < p else 2 * p - 1 - chunk

            def stage_instructions(self, stage):
                p, m = self.num_stages, self.num_microbatches
                first, second = stage, 2 * p - 1 - stage
                for kind, chunks in (
                    (schedule.FORWARD, (first, second)),
                    (schedule.BACKWARD, (second, first)),
                ):
                    for chunk in chunks:
                        for i in range(m):
                            yield schedule.Instruction(kind, chunk, i)

        return VShape


def test_a_schedule_with_its_own_chunk_placement_is_one_class_and_trains_like_the_plain_model(
    monkeypatch,
):
    from tfpar.pipeline import schedule

    monkeypatch.setitem(schedule.SCHEDULES, "v-shape", _VShape.make())
    reference, history = _plain(keras)
    staged = Pipeline(num_stages=2, num_microbatches=4, schedule="v-shape").stage(pipeline_model())
    assert [staged.schedule.stage_of(c) for c in range(4)] == [0, 1, 1, 0]
    _train(staged)
    assert max_weight_difference(staged.plain_model(), reference) < 1e-5
    # chunk c's variables on the device the schedule placed it on
    for chunk, stage in enumerate(staged.stages):
        assert all(v.device.endswith(f"device:CPU:{[0, 1, 1, 0][chunk]}") for v in stage.variables)
    timeline = staged.schedule.simulate()
    # 2 chunks x 4 microbatches x (F, B), half a stage each
    assert timeline.busy(0) == timeline.busy(1) == 16 * 0.5


def test_a_pipeline_over_workers_spreads_its_stages_and_refuses_what_cannot_be_spread(monkeypatch):
    """`spread` (span_workers=True): stage s on worker s × W // S, a stage's tensor-parallel devices
    inside one worker, replica-major; too few stages or devices refused naming the fix; and
    horovodrun (no TensorFlow servers) refused at once."""
    from tfpar.pipeline.spanning import spread

    workers = [[f"w{w}:{d}" for d in range(4)] for w in range(2)]
    assert spread(workers, 1, 4, 1) == ["w0:0", "w0:1", "w1:0", "w1:1"]
    # tensor inside a host, pipeline across
    assert spread(workers, 1, 2, 2) == ["w0:0", "w0:1", "w1:0", "w1:1"]
    # each replica's stages on both workers
    assert spread(workers, 2, 2, 1) == ["w0:0", "w1:0", "w0:1", "w1:1"]
    assert spread([["a"], ["b"], ["c"]], 1, 3, 1) == ["a", "b", "c"]
    with pytest.raises(
        ValueError,
        match=r"at least one stage on each of the 3 workers.*num_stages=2.*Use num_stages >= 3",
    ):
        spread([["a"], ["b"], ["c"]], 1, 2, 1)
    with pytest.raises(
        ValueError,
        match=r"Worker 0 holds stages \[0, 1\] of each of the 2 replica\(s\), 2 device\(s\) a "
        r"stage: 8 devices, and it has 4 .*tfpar.configure_devices\(8\)",
    ):
        spread(workers, 2, 4, 2)
    with pytest.raises(
        ValueError, match=r"No device '/job:worker/replica:0/task:1/device:CPU:0' in this process"
    ):
        # no cluster connected: no worker 1
        Pipeline(devices=("/job:worker/replica:0/task:1/device:CPU:0", "/cpu:0"))
    monkeypatch.setenv("HOROVOD_RANK", "0")
    with pytest.raises(
        ValueError, match=r"horovodrun starts none. Received: span_workers=True under horovodrun"
    ):
        Pipeline(span_workers=True)
