"""`tfpar.report`: the plots of runs traced in this process (2 replicas, a pipeline, a skipped
step)."""

import struct

import numpy as np
import pytest

import tfpar
from tests.models import equivalence_data, verify_model
from tfpar.report import SIZE, report


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", head
    return struct.unpack(">II", head[16:24])


def _fit(model, parallelism, folder, x=None, y=None, before=()):
    import tensorflow as tf

    if x is None:
        x, y = equivalence_data(192)
    train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), parallelism, 32)
    return model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=2,
        verbose=0,
        shuffle=False,
        callbacks=[*before, tfpar.callbacks.Timeline(str(folder / "timeline.json"))],
    )


def test_a_data_parallel_run_gets_its_throughput_plot_with_scaling_efficiency(tmp_path):
    from tfpar.report import _tracks, load_timeline

    alone = tfpar.strategies.DataParallel(devices=["/cpu:0"])  # one replica: the reference
    (tmp_path / "one").mkdir()
    one = _fit(
        alone.build(verify_model), alone, tmp_path / "one", before=[tfpar.callbacks.Throughput(32)]
    )
    reference = one.history["examples_per_second"][-1]
    strategy = tfpar.DataParallel()
    history = _fit(
        strategy.build(verify_model),
        strategy,
        tmp_path,
        before=[tfpar.callbacks.Throughput(32, reference_examples_per_second=reference)],
    )
    _, counters = _tracks(load_timeline(str(tmp_path)))
    assert [v for _, v in counters["scaling_efficiency"][0]] == pytest.approx(
        history.history["scaling_efficiency"]
    )
    assert [v for _, v in counters["loss"][0]] == pytest.approx(history.history["loss"])
    written = report(str(tmp_path))
    assert written == [str(tmp_path / "throughput.png")]  # no pipeline, no loss scale
    assert _png_size(written[0]) == SIZE


def test_a_pipeline_run_gets_its_schedule_as_a_gantt_chart(tmp_path):
    pipeline = tfpar.pipeline.Pipeline(num_stages=2, num_microbatches=4)
    model = pipeline.stage(verify_model())
    model.compile(
        tfpar.keras.optimizers.SGD(0.1),
        tfpar.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    _fit(model, pipeline, tmp_path)
    written = report(str(tmp_path), out=str(tmp_path / "plots"))
    assert sorted(written) == [
        str(tmp_path / "plots" / name) for name in ("pipeline.png", "throughput.png")
    ]
    assert all(_png_size(path) == SIZE for path in written)


def test_a_skipped_step_shows_in_the_loss_scale_plot(tmp_path):
    keras = tfpar.keras
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = verify_model()
        model.compile(
            keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1)), model.loss
        )
    x, y = equivalence_data(192)
    x[100] = 3e38  # its gradients overflow: that step is skipped and the scale halves
    _fit(model, strategy, tmp_path, x, y)
    from tfpar.report import _tracks, load_timeline

    _, counters = _tracks(load_timeline(str(tmp_path)))
    scale = np.array([v for _, v in counters["loss scale"][0]])
    assert len(scale) == 12 and np.sum(scale[1:] < scale[:-1]) >= 1, scale
    written = report(str(tmp_path))
    assert (
        str(tmp_path / "loss_scale.png") in written
        and _png_size(str(tmp_path / "loss_scale.png")) == SIZE
    )


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing", "which is not a folder"),
        (lambda p: p, "holds no run: no timeline.json in it"),
    ],
)
def test_a_folder_without_a_run_is_refused(tmp_path, make, message):
    with pytest.raises(ValueError) as info:
        report(str(make(tmp_path)))
    assert message in str(info.value)


def test_the_bandwidth_plot_draws_measured_all_reduces_against_a_measured_link(tmp_path):
    """As `bench/data_parallel.py --plot` draws it; here 2 devices of this process and a socket
    pair."""
    import socket
    import threading
    import time

    import tensorflow as tf

    from tfpar.report import bandwidth_plot

    strategy = tfpar.DataParallel()
    busbw = {}
    for size in (2**20, 4 * 2**20):
        value = strategy.run(lambda: tf.ones([size // 4], tf.float32))
        strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)  # warm up
        start = time.perf_counter()
        strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None).numpy()
        busbw[size] = size * 2 * (2 - 1) / 2 / (time.perf_counter() - start)
    a, b = socket.socketpair()
    a.settimeout(30)
    b.settimeout(30)
    buffer = bytearray(2**20)

    def drain():
        while b.recv_into(buffer):
            pass

    reader = threading.Thread(target=drain, daemon=True)
    start = time.perf_counter()
    reader.start()
    for _ in range(16):
        a.sendall(bytes(2**20))
    a.close()
    reader.join(timeout=30)
    b.close()
    assert not reader.is_alive()
    limit = 16 * 2**20 / (time.perf_counter() - start)
    path = bandwidth_plot(str(tmp_path / "busbw.png"), busbw, limit)
    assert _png_size(path) == SIZE


def test_the_pipeline_plot_takes_its_theory_from_the_schedule_the_trace_recorded():
    from tfpar.report import _bubble_theory

    def recorded(name, v=1):
        return {"name": name, "num_stages": 2, "num_microbatches": 2, "virtual_stages": v}

    assert _bubble_theory(recorded("1f1b")) == (pytest.approx(1 / 3), "(p-1)/(m+p-1)", 2)
    assert _bubble_theory(recorded("gpipe")) == (pytest.approx(1 / 3), "(p-1)/(m+p-1)", 2)
    assert _bubble_theory(recorded("zb-h1")) == (pytest.approx(1 / 7), "(p-1)/(3m+p-1)", 2)
    assert _bubble_theory(recorded("interleaved", 2)) == (pytest.approx(1 / 5), "(p-1)/(2m+p-1)", 2)
