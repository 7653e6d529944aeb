"""Keras is touched only for what tfpar owns (`tfpar._owned`): a model built under a tfpar strategy,
staged or quantized runs tfpar's checks; every other model, and both Kerases' classes, are as Keras
made them, in a process that imported every tfpar module."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tfpar
from tests.conftest import ROOT
from tfpar import _owned

METHODS = ("compile", "fit", "evaluate", "predict")

_PLAIN_PROCESS = """
import importlib, json, os, pkgutil, sys, traceback
import numpy as np
import keras, tf_keras

def defined(k):  # the objects each Keras' Model class has, before tfpar is imported
    return {m: getattr(k.Model, m) for m in %(methods)r}

kerases = {"keras": keras, "tf_keras": tf_keras}
before = {name: defined(k) for name, k in kerases.items()}
import tfpar
imported, skipped = [], []
for info in pkgutil.walk_packages(tfpar.__path__, "tfpar."):
    if info.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(info.name)
        imported.append(info.name)
    except ImportError as error:  # an optional dependency this machine lacks
        skipped.append([info.name, str(error)])
with tfpar.DataParallel().scope():  # a tfpar scope entered and left: Keras' classes come back
    keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(2)])
tfpar.precision.use("mixed_bfloat16")
tfpar.precision.use("float32")
result = {"imported": len(imported), "skipped": skipped, "same": {}, "instance": {}, "trained": \
{}, "frames": {}}
x, y = np.zeros((8, 4), "float32"), np.zeros((8, 2), "float32")
for name, k in kerases.items():
    result["same"][name] = {m: getattr(k.Model, m) is before[name][m] for m in %(methods)r}
    model = k.Sequential([k.layers.Input((4,)), k.layers.Dense(2)])
    model.compile(k.optimizers.SGD(0.1), "mse")
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    result["trained"][name] = int(model.optimizer.iterations.numpy())
    result["instance"][name] = sorted(m for m in %(methods)r if m in vars(model))
    try:
        model.fit(np.zeros((8, 5), "float32"), y, verbose=0)  # the wrong width
    except Exception:
        frames = traceback.extract_tb(sys.exc_info()[2])
        result["frames"][name] = [f.filename for f in frames if os.sep + "tfpar" + os.sep in \
f.filename]
print("RESULT " + json.dumps(result))
"""


def test_a_process_that_imported_every_tfpar_module_trains_plain_keras_as_keras_made_it():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFPAR_")}
    done = subprocess.run(
        [sys.executable, "-c", _PLAIN_PROCESS % {"methods": METHODS}],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["imported"] > 60 and result["skipped"] == [], result["skipped"]
    for name in ("keras", "tf_keras"):
        assert result["same"][name] == dict.fromkeys(METHODS, True), name
        assert result["instance"][name] == [] and result["trained"][name] == 2, name
        assert result["frames"][name] == [], f"{name}: tfpar frames in a plain model's traceback"


def _dense(k, name):
    return k.Sequential([k.layers.Input((4,)), k.layers.Dense(2)], name=name)


def test_a_model_built_under_a_tfpar_strategy_is_owned_and_one_built_outside_is_not(any_keras):
    k = any_keras
    strategy = tfpar.DataParallel()
    outside = _dense(k, "outside")
    with strategy.scope():
        inside = _dense(k, "inside")
    built = strategy.build(lambda: _dense(k, "built"))
    assert _owned.checks_of(outside) == ()
    assert set(vars(outside)) & set(METHODS) == set()
    for model in (inside, built):
        assert set(strategy.model_checks()) <= set(_owned.checks_of(model))
        assert all(getattr(model, m).__func__ is not getattr(type(model), m) for m in METHODS)
    # Keras' classes are as they were once the scope is left.
    assert all(getattr(type(outside), m) is getattr(type(inside), m) for m in METHODS)
    with strategy.scope():
        inside.compile(k.optimizers.SGD(0.1), "mse")
    x = np.zeros((8, 4), "float32")
    inside.fit(x, x[:, :2], batch_size=4, epochs=1, verbose=0)
    assert int(inside.optimizer.iterations.numpy()) == 2


def test_an_owned_model_deep_copied_runs_its_own_checks_on_the_copy(any_keras):
    import copy

    k = any_keras
    model = tfpar.DataParallel().build(lambda: _dense(k, "original"))
    seen = []
    _owned.own(model, [("compile", "before", lambda m, arguments: seen.append(m))])
    twin = copy.deepcopy(model)
    if "compile" in vars(twin):  # Keras 3 copies the instance; tf_keras rebuilds it, unowned
        twin.compile("sgd", "mse")
        assert seen == [twin]


def test_checks_are_refused_unless_they_are_method_when_function_triples(any_keras):
    model = _dense(any_keras, "m")
    with pytest.raises(
        ValueError, match=r"\(method, when, function\) triples.*Received: \('fit', 'during'"
    ):
        _owned.own(model, [("fit", "during", print)])
    assert _owned.checks_of(model) == ()


def test_the_keras3_global_policy_set_without_tfpar_is_respected_after_a_timeline(tmp_path):
    """A Timeline traces a loss-scale read (tfpar.precision); the policy set through Keras 3 itself
    is then still Keras 3's own: a model built under it compiles and trains in it."""
    import keras

    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = _dense(keras, "timed")
        model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.zeros((8, 4), "float32")
    model.fit(
        x,
        x[:, :2],
        batch_size=4,
        epochs=1,
        verbose=0,
        callbacks=[tfpar.callbacks.Timeline(str(tmp_path / "t.json"))],
    )
    assert (tmp_path / "t.json").exists()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        late = keras.Sequential(
            [
                keras.layers.Input((4,)),
                keras.layers.Dense(2),
                keras.layers.Activation("linear", dtype="float32"),
            ]
        )
        late.compile("sgd", "mse")  # tf_keras' global policy is float32: no refusal
        late.fit(x, x[:, :2], batch_size=4, epochs=1, verbose=0)
        assert (
            late.layers[0].compute_dtype == "bfloat16"
            and int(late.optimizer.iterations.numpy()) == 2
        )
    finally:
        keras.mixed_precision.set_global_policy("float32")
