"""`tfpar.callbacks.Timeline` in this process: 2 replicas (both Kerases) and a 2-stage pipeline."""

import json

import numpy as np
import pytest

import tfpar
from tests.conftest import trace_tracks as _tracks
from tests.keras_tutorial import two_block_model
from tests.models import equivalence_data, pipeline_model, verify_model
from tfpar.callbacks import Timeline


def _fit(model, parallelism, path, epochs=2, examples=96, batch=16, exchange=False):
    import tensorflow as tf

    x, y = equivalence_data(examples)
    train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), parallelism, batch)
    model.fit(
        train.dataset,
        steps_per_epoch=train.steps_per_epoch,
        epochs=epochs,
        verbose=0,
        shuffle=False,
        callbacks=[Timeline(str(path), exchange=exchange)],
    )
    return train.steps_per_epoch * epochs


@pytest.mark.parametrize("exchange,accumulation", [(False, 1), (True, 1), (True, 2)])
def test_each_step_shows_its_phases_in_order_within_it(any_keras, exchange, accumulation, tmp_path):
    """Every step, with accumulation too (the optimizer's iterations then count updates, and two
    steps share one: the trace counts steps)."""
    strategy = tfpar.DataParallel(gradient_accumulation_steps=accumulation)
    model = strategy.build(lambda: verify_model(k=any_keras))
    steps = _fit(model, strategy, tmp_path / "timeline.json", exchange=exchange)
    tracks = _tracks(json.loads((tmp_path / "timeline.json").read_text()))
    phases = (
        ["input wait", "forward+backward", "exchange+apply"]
        if exchange
        else ["input wait", "compute"]
    )
    assert {name for _, name in tracks} == {"step", "epoch", *phases}
    step = tracks[0, "step"]
    assert [e["name"] for e in tracks[0, "epoch"]] == ["epoch 1", "epoch 2"]
    slack = 2000  # microseconds: the host's callbacks run after the step's last op
    for s, *spans in zip(step, *(tracks[0, name] for name in phases)):
        assert spans[0]["ts"] == s["ts"]
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1 for a, b in zip(spans, spans[1:]))
        assert spans[-1]["ts"] + spans[-1]["dur"] <= s["ts"] + s["dur"] + slack
    assert all(len(tracks[0, name]) == steps for name in ["step", *phases])
    # one step after another
    assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(step, step[1:]))
    # fit without a Timeline afterwards: the training function is Keras' own again
    assert "train_step" not in model.__dict__ and "apply_gradients" not in model.optimizer.__dict__


def test_with_steps_per_execution_a_step_is_one_call_of_the_training_function(tmp_path):
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = verify_model()
        model.compile(model.optimizer, model.loss, steps_per_execution=3)
    # 24 steps: 8 calls
    calls = _fit(model, strategy, tmp_path / "timeline.json", examples=192) // 3
    tracks = _tracks(json.loads((tmp_path / "timeline.json").read_text()))
    assert (
        len(tracks[0, "step"]) == len(tracks[0, "input wait"]) == len(tracks[0, "compute"]) == calls
    )
    for s, w, c in zip(tracks[0, "step"], tracks[0, "input wait"], tracks[0, "compute"]):
        assert w["ts"] == s["ts"] and w["ts"] + w["dur"] <= c["ts"] + 1


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "zb-h1"])
def test_a_pipeline_trace_shows_each_stage_running_the_schedule_in_order(tmp_path, schedule):
    """Every schedule's instructions (with W under zero bubble, chunk numbers under interleaving)
    appear on their stage's track in the schedule's order, each after the one it depends on."""
    pipeline = tfpar.pipeline.Pipeline(num_stages=2, num_microbatches=4, schedule=schedule)
    model = pipeline.stage(pipeline_model())
    model.compile(
        tfpar.keras.optimizers.SGD(0.1),
        tfpar.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    steps = _fit(model, pipeline, tmp_path / "timeline.json", epochs=1)
    trace = json.loads((tmp_path / "timeline.json").read_text())
    assert trace["otherData"]["pipeline_schedule"] == {  # what tfpar report reads its theory from
        "name": schedule,
        "num_stages": 2,
        "num_microbatches": 4,
        "virtual_stages": 2 if schedule == "interleaved" else 1,
    }
    tracks = _tracks(trace)
    streams = model.schedule.streams()
    label = (lambda i: f"{i}c{i.stage}") if schedule == "interleaved" else str
    first_step = {}
    for stage, expected in enumerate(streams):
        events = tracks[0, f"stage {stage}"]
        assert len(events) == steps * len(expected)
        per_step = [events[i : i + len(expected)] for i in range(0, len(events), len(expected))]
        for run in per_step:
            assert [e["name"] for e in run] == [label(i) for i in expected]
            assert all(a["ts"] + a["dur"] <= b["ts"] + 1 for a, b in zip(run, run[1:]))
        first_step.update(zip(expected, per_step[0]))
    # an instruction starts after the one of another stage it depends on ends
    for instruction, event in first_step.items():
        dependency = instruction.dependency(model.schedule.num_chunks)
        if dependency is not None:
            before = first_step[dependency]
            assert event["ts"] >= before["ts"] + before["dur"] - 1, (instruction, dependency)


@pytest.mark.parametrize(
    "path, message",
    [
        ("/nonexistent-folder/timeline.json", "path cannot be written"),
        ("/etc/hostname/timeline.json", "path cannot be written"),
        ("/tmp", "path is a folder"),
        (None, "Timeline needs a file to write"),
    ],
)
def test_a_path_that_cannot_be_written_is_refused_at_once(path, message, monkeypatch):
    monkeypatch.delenv("TFPAR_TIMELINE", raising=False)
    with pytest.raises(ValueError) as info:
        Timeline(path)
    assert message in str(info.value) and "Received: path=" in str(info.value)


@pytest.mark.parametrize("stage, accumulation", [(2, 1), (2, 2), (1, 2)])
def test_a_sharded_state_shows_each_buckets_exchange_in_order(
    stage, accumulation, monkeypatch, tmp_path
):
    """ZeRO's track (buckets of at most 256 bytes: the model's 1,024 + 16 + 48 + 3 parameters in 3
    buckets): each update's steps show every bucket's reduce-scatter in turn, then each bucket's
    update and all-gather in turn, inside the step's compute. Accumulating 2 steps, stage 2
    reduce-scatters at every step and updates at every other; stage 1 does all of it at every
    other step only."""
    from tfpar.strategies import _zero_state

    monkeypatch.setattr(_zero_state, "BUCKET_BYTES", 256)
    strategy = tfpar.DataParallel(zero_stage=stage, gradient_accumulation_steps=accumulation)
    model = strategy.build(verify_model)
    steps = _fit(model, strategy, tmp_path / "timeline.json")
    assert len(model._tfpar_zero.buckets) == 3
    tracks = _tracks(json.loads((tmp_path / "timeline.json").read_text()))
    events = tracks[0, "ZeRO exchange"]
    scatters = [f"reduce-scatter {i}" for i in range(3)]
    written = [name for i in range(3) for name in (f"update {i}", f"all-gather {i}")]
    updates = steps // accumulation
    every_step = stage == 2 and accumulation > 1
    expected = (scatters * (steps if every_step else updates)) + written * updates
    assert sorted(e["name"] for e in events) == sorted(expected)
    for step, compute in zip(tracks[0, "step"], tracks[0, "compute"]):
        inside = [
            e["name"]
            for e in events
            if compute["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"]
        ]
        assert inside in ([], scatters, scatters + written), inside
    assert sum(1 for e in events if e["name"] == "update 0") == updates
    ends = [e["ts"] + e["dur"] for e in events]
    assert all(end <= e["ts"] + 1 for end, e in zip(ends, events[1:]))  # one after another
    # read once: a step that writes no rows (one a loss scale skips) adds none
    assert np.isnan(model._tfpar_zero.device_trace.numpy()).all()


def test_fully_sharded_parameters_show_each_gather_and_reduce_scatter_inside_the_step(tmp_path):
    """zero_stage=3 (Keras 3; the Dense layers' 4 variables, every unit under 64 KiB, so none
    gathered again in the backward): each step shows each variable's all-gather, then its
    reduce-scatter once the backward reaches it, then each variable's update, all in the step."""
    import keras

    strategy = tfpar.DataParallel(zero_stage=3)
    model = strategy.build(lambda: verify_model(k=keras))
    steps = _fit(model, strategy, tmp_path / "timeline.json")
    tracks = _tracks(json.loads((tmp_path / "timeline.json").read_text()))
    assert (0, "recomputed forwards") not in tracks  # no unit of 64 KiB: none recomputed
    events = tracks[0, "ZeRO exchange"]
    paths = [v.path for v in model.trainable_variables]
    per_step = [f"{kind} {path}" for kind in ("all-gather", "reduce-scatter") for path in paths]
    per_step += [f"update {i}" for i in range(len(paths))]
    assert sorted(e["name"] for e in events) == sorted(per_step * steps)
    for step in tracks[0, "step"]:
        inside = [e for e in events if step["ts"] - 1 <= e["ts"] <= step["ts"] + step["dur"]]
        assert sorted(e["name"] for e in inside) == sorted(per_step)
        at = {e["name"]: e for e in inside}
        for path in paths:
            gathered = at[f"all-gather {path}"]
            assert gathered["ts"] + gathered["dur"] <= at[f"reduce-scatter {path}"]["ts"] + 1
        last_scatter = max(at[f"reduce-scatter {path}"]["ts"] for path in paths)
        assert all(at[f"update {i}"]["ts"] + 1 >= last_scatter for i in range(len(paths)))


def test_recomputed_blocks_show_their_second_forward_in_each_step_s_backward(any_keras, tmp_path):
    """remat="blocks" on two of keras.io's tutorial TransformerBlocks (both Kerases): each step's
    backward runs block_b's forward again, then block_a's (the forward's order reversed), each
    named on the first replica's "recomputed forwards" track inside its step."""
    import tensorflow as tf

    strategy = tfpar.DataParallel(remat="blocks")
    with strategy.scope():
        model, _ = two_block_model(any_keras, 0.0)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, (64, 8)).astype("int32")
    y = rng.integers(0, 3, (64,))
    train = tfpar.data.distribute(tf.data.Dataset.from_tensor_slices((x, y)), strategy, 16)
    path = tmp_path / "timeline.json"
    timeline = Timeline(str(path))
    model.fit(train.dataset, steps_per_epoch=4, epochs=1, verbose=0, callbacks=[timeline])
    tracks = _tracks(json.loads(path.read_text()))
    steps = tracks[0, "step"]
    recomputed = tracks[0, "recomputed forwards"]
    assert len(steps) == 4
    assert [e["name"] for e in recomputed] == ["block_b", "block_a"] * 4
    slack = 2000  # microseconds: the host's callbacks run after the step's last op
    for step, second, first in zip(steps, recomputed[::2], recomputed[1::2]):
        assert step["ts"] <= second["ts"]
        assert second["ts"] + second["dur"] <= first["ts"] + 1  # the backward's order
        assert first["ts"] + first["dur"] <= step["ts"] + step["dur"] + slack  # inside its step


def test_a_fully_sharded_layer_of_64_kib_shows_its_recomputed_forward(tmp_path):
    """zero_stage=3 recomputes a layer of 64 KiB of parameters or more in the backward (it gathers
    them again there): Keras 3's Dense of 128 x 160 float32 (80 KiB) is on the track once a step;
    the small one is not."""
    import keras

    strategy = tfpar.DataParallel(zero_stage=3)
    with strategy.scope():
        inputs = keras.Input((128,))
        hidden = keras.layers.Dense(160, activation="relu", name="wide")(inputs)
        model = keras.Model(inputs, keras.layers.Dense(3, name="small")(hidden))
        model.compile(keras.optimizers.Adam(1e-3), "mse")
    x = np.random.default_rng(0).normal(size=(64, 128)).astype("float32")
    path = tmp_path / "timeline.json"
    model.fit(x, x[:, :3], batch_size=16, epochs=1, verbose=0, callbacks=[Timeline(str(path))])
    tracks = _tracks(json.loads(path.read_text()))
    assert [e["name"] for e in tracks[0, "recomputed forwards"]] == ["wide"] * 4
