"""Bad input, one row per case: refused at once, by tfpar's own code, naming the parameter and the
value received, with nothing started or left behind.

Python rows run here (2 virtual CPU devices); command-line rows run the real ``tfpar`` command.
A row's ``names`` are strings its message must contain: the parameter and the value received.
"""

import json
import math
import os
import re
import sys
import traceback

import numpy as np
import pytest

import tfpar
from tests.conftest import run_command, tfpar_command
from tests.models import pipeline_model, qat_model

tf = pytest.importorskip("tensorflow")
PY = sys.executable
LOCAL = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}


def _children():
    """Pids of this process's live children (read from /proc)."""
    me, found = str(os.getpid()), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            found.add(int(pid))
    return found


def _cluster_info(cluster, task_type="worker", task_index=0):
    from tfpar.cluster import ClusterInfo

    return ClusterInfo(cluster=cluster, task_type=task_type, task_index=task_index)


def _tf_config(raw):
    from tfpar.cluster import ClusterInfo

    return ClusterInfo.from_tf_config(raw)


def _cluster_file(tmp_path, content):
    from tfpar.launch import load_cluster_file

    path = tmp_path / "cluster.json"
    path.write_text(content)
    return load_cluster_file(str(path))


def _fault_tolerance(tmp_path, **kwargs):
    return tfpar.callbacks.FaultTolerance(str(tmp_path / "backup"), **kwargs)


def _fault_tolerance_without_index(tmp_path):
    os.environ["TF_CONFIG"] = json.dumps({"cluster": LOCAL, "task": {"type": "worker"}})
    try:
        return _fault_tolerance(tmp_path)
    finally:
        del os.environ["TF_CONFIG"]


def _k3():
    import keras as keras3

    return keras3


def _accumulated_twice():
    """A Keras 3 optimizer that accumulates itself, compiled under a strategy that accumulates
    (Keras 3 loaded before the scope, as a user's script does: `tfpar._owned`)."""
    keras3 = _k3()
    strategy = tfpar.DataParallel(gradient_accumulation_steps=2)
    with strategy.scope():
        model = _keras3_model()
        model.compile(keras3.optimizers.SGD(gradient_accumulation_steps=3), "mse")


def _keras3_model():
    keras3 = _k3()
    return keras3.Sequential(
        [keras3.layers.Input((4,)), keras3.layers.Dense(3), keras3.layers.Dense(2)]
    )


def _holding_the_other_kerass_layer(model_keras, layer_keras):
    """A subclassed model of ``model_keras`` with a Dense of ``layer_keras``, built and compiled
    under a tfpar strategy (a model tfpar does not own is Keras' business)."""

    class Mixed(model_keras.Model):
        def __init__(self):
            super().__init__(name="mixed")
            self.dense = layer_keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    with tfpar.DataParallel().scope():
        Mixed().compile("sgd", "mse")


def _fit_with_the_other_kerass_callback(model_keras, callback_keras):
    strategy = tfpar.DataParallel()
    with strategy.scope():
        model = model_keras.Sequential(
            [model_keras.layers.Input((4,)), model_keras.layers.Dense(2)], name="plain"
        )
        model.compile("sgd", "mse")
    x = np.zeros((8, 4), "float32")
    model.fit(
        x,
        x[:, :2],
        epochs=1,
        verbose=0,
        callbacks=[
            tfpar.callbacks.NaNGuard(),
            callback_keras.callbacks.EarlyStopping(monitor="loss"),
        ],
    )


def _compiled_after_use(model_keras):
    model = model_keras.Sequential(
        [model_keras.layers.Input((4,)), model_keras.layers.Dense(2)], name="early"
    )
    tfpar.precision.use("mixed_bfloat16")
    try:
        model.compile("sgd", "mse")
    finally:
        tfpar.precision.use("float32")


def _distribute(**options):
    x = np.zeros((8, 2), "float32")
    return tfpar.data.distribute(
        tf.data.Dataset.from_tensor_slices((x, x)), tf.distribute.get_strategy(), 4, **options
    )


def _missing_files(tmp_path):
    return tfpar.data.distribute(
        [str(tmp_path / "a.tfrecord"), str(tmp_path / "b.tfrecord")],
        tf.distribute.get_strategy(),
        4,
    )


def _pipeline_partial_batch():
    from tfpar.pipeline import Pipeline

    model = Pipeline(num_stages=2, num_microbatches=4).stage(pipeline_model())
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = np.zeros((102, 8, 8, 1), "float32"), np.zeros(102, "int64")
    try:
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    finally:
        assert int(model.optimizer.iterations) == 0  # refused before any step was applied


def _with_prelu():
    inputs = keras.Input((4,))
    return keras.Model(
        inputs, keras.layers.PReLU(name="prelu")(keras.layers.Dense(4, name="dense")(inputs))
    )


def _under_mixed_precision(make):
    tfpar.precision.use("mixed_bfloat16")
    try:
        return make()
    finally:
        tfpar.precision.use("float32")


keras = tfpar.keras
ROWS = {
    # Cluster specs
    "duplicate-address": (
        lambda tmp: _cluster_info({"worker": ["127.0.0.1:2222", "127.0.0.1:2222"]}),
        ValueError,
        ["worker 0 and worker 1", "'127.0.0.1:2222'"],
    ),
    "port-not-a-number": (
        lambda tmp: _cluster_info({"worker": ["host:notaport"]}),
        ValueError,
        ["worker 0", "'host:notaport'", "port in 1..65535"],
    ),
    "colon-only": (lambda tmp: _cluster_info({"worker": [":"]}), ValueError, ["worker 0", "':'"]),
    "port-out-of-range": (
        lambda tmp: _cluster_info({"worker": ["h:70000"]}),
        ValueError,
        ["'h:70000'"],
    ),
    "two-chiefs": (
        lambda tmp: _cluster_info({"chief": ["a:1", "b:1"], "worker": ["c:1"]}, "chief"),
        ValueError,
        ["at most one chief", "['a:1', 'b:1']"],
    ),
    "missing-index": (
        lambda tmp: _tf_config(json.dumps({"cluster": LOCAL, "task": {"type": "worker"}})),
        ValueError,
        ['"index"', "2 'worker' tasks", "TF_CONFIG="],
    ),
    "cluster-null": (
        lambda tmp: _tf_config('{"cluster": null, "task": {"type": "worker", "index": 0}}'),
        ValueError,
        ['"cluster"', '"cluster": null'],
    ),
    "cluster-file-null": (
        lambda tmp: _cluster_file(tmp, '{"cluster": null}'),
        ValueError,
        ["cluster.json", "Received: None"],
    ),
    "task-type-list": (
        lambda tmp: _tf_config(
            json.dumps({"cluster": LOCAL, "task": {"type": ["worker"], "index": 0}})
        ),
        ValueError,
        ["task type", "['worker']"],
    ),
    "empty-role": (lambda tmp: _cluster_info({"worker": []}), ValueError, ["'worker'", "[]"]),
    # A string where a list belongs
    "devices-string": (
        lambda tmp: tfpar.DataParallel(devices="/cpu:0"),
        TypeError,
        ["devices", "'/cpu:0'", "['/cpu:0']"],
    ),
    "pipeline-devices-string": (
        lambda tmp: tfpar.pipeline.Pipeline(devices="/cpu:0"),
        TypeError,
        ["devices", "'/cpu:0'"],
    ),
    "metric-average-keys-string": (
        lambda tmp: tfpar.callbacks.MetricAverage(keys="loss"),
        TypeError,
        ["keys", "'loss'", "['loss']"],
    ),
    # Devices that do not exist
    "gpu-on-cpu-machine": (
        lambda tmp: tfpar.DataParallel(devices=["/gpu:0"]),
        ValueError,
        ["devices", "'/gpu:0'", "No device"],
    ),
    "cpu-7-of-2": (
        lambda tmp: tfpar.DataParallel(devices=["/cpu:7"]),
        ValueError,
        ["'/cpu:7'", "CPU:1"],
    ),
    "pipeline-cpu-7": (
        lambda tmp: tfpar.pipeline.Pipeline(devices=["/cpu:0", "/cpu:7"]),
        ValueError,
        ["'/cpu:7'"],
    ),
    # Wrong types or values accepted until fit
    "save-freq-string": (
        lambda tmp: _fault_tolerance(tmp, save_freq="10"),
        TypeError,
        ["save_freq", "'10'"],
    ),
    "fault-tolerance-several-chiefs": (
        _fault_tolerance_without_index,
        ValueError,
        ['"index"', "TF_CONFIG="],
    ),
    "save-freq-negative": (
        lambda tmp: _fault_tolerance(tmp, save_freq=-5),
        ValueError,
        ["save_freq", "-5"],
    ),
    "warmup-nan": (
        lambda tmp: tfpar.callbacks.LearningRateWarmup(warmup_epochs=math.nan),
        ValueError,
        ["warmup_epochs", "nan"],
    ),
    "schedule-multiplier-string": (
        lambda tmp: tfpar.callbacks.LearningRateSchedule("0.5", initial_lr=0.1),
        TypeError,
        ["multiplier", "'0.5'"],
    ),
    "schedule-initial-lr-string": (
        lambda tmp: tfpar.callbacks.LearningRateSchedule(0.5, initial_lr="0.1"),
        TypeError,
        ["initial_lr", "'0.1'"],
    ),
    "seed-string": (lambda tmp: _distribute(seed="1"), TypeError, ["seed", "'1'"]),
    "shuffle-buffer-float": (
        lambda tmp: _distribute(shuffle_buffer=2.5),
        TypeError,
        ["shuffle_buffer", "2.5"],
    ),
    "missing-tfrecord": (_missing_files, ValueError, ["a.tfrecord", "b.tfrecord", "do not exist"]),
    "connect-timeout-nan": (
        lambda tmp: tfpar.strategies.ParameterServerConfig(connect_timeout_seconds=math.nan),
        ValueError,
        ["connect_timeout_seconds", "nan"],
    ),
    "connect-timeout-bool": (
        lambda tmp: tfpar.strategies.ParameterServerConfig(connect_timeout_seconds=True),
        TypeError,
        ["connect_timeout_seconds", "True"],
    ),
    "ps-gradient-accumulation": (
        lambda tmp: tfpar.strategies.ParameterServerConfig(gradient_accumulation_steps=4),
        ValueError,
        [
            "cannot accumulate gradients",
            "gradient_accumulation_steps=4",
            "DataParallel(gradient_accumulation_steps=4)",
        ],
    ),
    # Pipeline
    "pipeline-partial-last-batch": (
        lambda tmp: _pipeline_partial_batch(),
        ValueError,
        ["batch_size=32", "102 examples", "(6)"],
    ),
    # Keras 3 where it cannot go
    "quantize-keras3": (
        lambda tmp: tfpar.quantization.quantize(_keras3_model()),
        TypeError,
        ["Keras 3 model", "Quantization-aware training needs a tf_keras", "tfpar.keras"],
    ),
    "prune-keras3": (
        lambda tmp: tfpar.quantization.prune(_keras3_model(), 0.5, end_step=10),
        TypeError,
        ["Keras 3 model", "Pruning needs a tf_keras"],
    ),
    "cluster-keras3": (
        lambda tmp: tfpar.quantization.cluster(_keras3_model()),
        TypeError,
        ["Keras 3 model", "Clustering needs a tf_keras"],
    ),
    # A mix of the two Kerases, and a policy set after the model was built
    "keras3-model-tf-keras-layer": (
        lambda tmp: _holding_the_other_kerass_layer(_k3(), keras),
        TypeError,
        ["Keras 3 model", "tf_keras layer at mixed.dense", "tf_keras.src.layers"],
    ),
    "tf-keras-model-keras3-layer": (
        lambda tmp: _holding_the_other_kerass_layer(keras, _k3()),
        TypeError,
        ["tf_keras model", "Keras 3 layer at mixed.dense", "keras.src.layers"],
    ),
    "keras3-model-tf-keras-callback": (
        lambda tmp: _fit_with_the_other_kerass_callback(_k3(), keras),
        TypeError,
        ["callbacks[1]", "tf_keras callback", "keras.callbacks.EarlyStopping"],
    ),
    "tf-keras-model-keras3-callback": (
        lambda tmp: _fit_with_the_other_kerass_callback(keras, _k3()),
        TypeError,
        ["callbacks[1]", "Keras 3 callback", "tf_keras.callbacks.EarlyStopping"],
    ),
    "keras3-model-tf-keras-optimizer": (
        lambda tmp: (
            tfpar.DataParallel()
            .build(lambda: _k3().Sequential([_k3().layers.Dense(2)]))
            .compile(keras.optimizers.SGD(), "mse")
        ),
        TypeError,
        ["optimizer", "tf_keras.src.optimizers", "keras.optimizers.SGD"],
    ),
    "accumulated-twice-keras3": (
        lambda tmp: _accumulated_twice(),
        ValueError,
        ["gradient_accumulation_steps=3", "Accumulate in one place"],
    ),
    "precision-after-keras3-model": (
        lambda tmp: _compiled_after_use(_k3()),
        ValueError,
        ["'early'", "built under the dtype policy 'float32'", "'mixed_bfloat16'"],
    ),
    "precision-after-tf-keras-model": (
        lambda tmp: _compiled_after_use(keras),
        ValueError,
        ["'early'", "built under the dtype policy 'float32'", "'mixed_bfloat16'"],
    ),
    # Added
    "distribute-strategy-string": (
        lambda tmp: tfpar.data.distribute(tf.data.Dataset.range(8), "mirrored", 4),
        TypeError,
        ["strategy", "'mirrored'"],
    ),
    "build-with-a-model": (
        lambda tmp: tfpar.DataParallel().build(pipeline_model()),
        TypeError,
        ["model_fn"],
    ),
    "tune-timeout-zero": (
        lambda tmp: tfpar.tune.tune("a:b", "c:d", {"per_replica_batch": [8]}, timeout_seconds=0),
        ValueError,
        ["timeout_seconds", "0"],
    ),
    # Compression (tfpar.quantization)
    "cluster-one-cluster": (
        lambda tmp: tfpar.quantization.cluster(qat_model(), clusters=1),
        ValueError,
        ["clusters=1", ">= 2"],
    ),
    "cluster-sparse-two-clusters": (
        lambda tmp: tfpar.quantization.cluster(qat_model(), 2, preserve_sparsity=True),
        ValueError,
        ["clusters=2", ">= 3", "zero cluster"],
    ),
    "cluster-unclusterable-layer": (
        lambda tmp: tfpar.quantization.cluster(_with_prelu()),
        ValueError,
        ["'prelu' (PReLU)", "exclude=['prelu']", "Received: exclude=[]"],
    ),
    "cluster-unknown-init": (
        lambda tmp: tfpar.quantization.cluster(qat_model(), init="random"),
        ValueError,
        ["init='random'", "kmeans++"],
    ),
    "cluster-mixed-precision": (
        lambda tmp: _under_mixed_precision(lambda: tfpar.quantization.cluster(qat_model())),
        ValueError,
        ["Clustering runs in float32", "'mixed_bfloat16'"],
    ),
    "cqat-on-unclustered": (
        lambda tmp: tfpar.quantization.quantize(qat_model(), preserve="clusters"),
        ValueError,
        ["not clustered", "preserve='clusters'", "tfpar.quantization.cluster(model"],
    ),
    "pqat-mixed-precision": (
        lambda tmp: _under_mixed_precision(
            lambda: tfpar.quantization.quantize(qat_model(), preserve="sparsity")
        ),
        ValueError,
        ["Quantization-aware training runs in float32", "'mixed_bfloat16'"],
    ),
    "quantize-unknown-preserve": (
        lambda tmp: tfpar.quantization.quantize(qat_model(), preserve="zeros"),
        ValueError,
        ["preserve='zeros'", "('clusters', 'sparsity')"],
    ),
    "quantize-unknown-ranges": (
        lambda tmp: tfpar.quantization.quantize(qat_model(), ranges="minmax"),
        ValueError,
        ["ranges='minmax'", "'exact'"],
    ),
    "export-compress-without-reference": (
        lambda tmp: tfpar.quantization.export_tflite(
            qat_model(),
            str(tmp / "m.tflite"),
            int8=False,
            compress=True,
            validation_data=(np.zeros((2, 8, 8, 1)), [0, 1]),
        ),
        ValueError,
        ["reference=None", "reference=float_model"],
    ),
    "export-validation-without-compress": (
        lambda tmp: tfpar.quantization.export_tflite(
            qat_model(),
            str(tmp / "m.tflite"),
            int8=False,
            validation_data=(np.zeros((2, 8, 8, 1)), [0, 1]),
        ),
        ValueError,
        ["validation_data", "compress=False", "compress=True"],
    ),
    "export-max-drop-above-one": (
        lambda tmp: tfpar.quantization.export_tflite(
            qat_model(),
            str(tmp / "m.tflite"),
            int8=False,
            compress=True,
            reference=qat_model(),
            validation_data=(np.zeros((2, 8, 8, 1)), [0, 1]),
            max_accuracy_drop=5,
        ),
        ValueError,
        ["max_accuracy_drop=5", "[0, 1]"],
    ),
    "tflite-path-in-missing-folder": (
        lambda tmp: tfpar.quantization.export_tflite(
            pipeline_model(), str(tmp / "no" / "m.tflite"), int8=False
        ),
        ValueError,
        ["path", "m.tflite", "does not exist"],
    ),
}


@pytest.mark.parametrize("case", sorted(ROWS))
def test_bad_input_is_refused_at_once_by_tfpar(case, tmp_path):
    make, kind, names = ROWS[case]
    before, files_before = _children(), sorted(os.listdir(tmp_path))
    with pytest.raises((TypeError, ValueError)) as info:
        make(tmp_path)
    assert type(info.value) is kind, f"{type(info.value).__name__}: {info.value}"
    raised_in = traceback.extract_tb(info.value.__traceback__)[-1].filename
    assert f"{os.sep}tfpar{os.sep}" in raised_in, (
        f"raised in {raised_in}, not by tfpar: {info.value}"
    )
    message = str(info.value)
    assert "Received" in message, message
    for name in names:
        assert name in message, f"{name!r} not in: {message}"
    assert _children() <= before  # nothing started (and left running)
    # nothing written
    assert sorted(os.listdir(tmp_path)) == files_before or case == "cluster-file-null"


@pytest.mark.parametrize(
    "args, names",
    [
        (
            ["launch", "-n", "2", "--", "/nonexistent/cmd"],
            ["'/nonexistent/cmd'", "is not an executable file"],
        ),
        (
            ["launch", "-n", "1", "--", "no-such-program-here"],
            ["'no-such-program-here'", "is not on PATH"],
        ),
        (
            ["launch", "-n", "1", "--grace", "nan", "--", PY, "-c", "pass"],
            ["grace_seconds=nan", "finite"],
        ),
        (
            ["launch", "-n", "1", "--grace", "inf", "--", PY, "-c", "pass"],
            ["grace_seconds=inf", "finite"],
        ),
        (
            ["launch", "-n", "1", "--grace", "-1", "--", PY, "-c", "pass"],
            ["grace_seconds=-1", ">= 0"],
        ),
        (
            ["launch", "--horovod", "-n", "1", "--grace", "nan", "--", PY, "-c", "pass"],
            ["grace_seconds=nan"],
        ),
        (
            ["launch", "--hosts", "h:notaport", "--task-index", "0", "--", PY, "-c", "pass"],
            ["'h:notaport'"],
        ),
        (
            ["launch", "-n", "1", "--max-restarts", "-1", "--", PY, "-c", "pass"],
            ["max_restarts", "-1", ">= 0"],
        ),
        *[
            (
                ["launch", "-n", "1", "--heartbeat-timeout", value, "--", PY, "-c", "pass"],
                ["heartbeat_timeout", value],
            )
            for value in ("0", "nan", "inf", "-3")
        ],
        (
            [
                "launch",
                "--horovod",
                "-n",
                "1",
                "--heartbeat-timeout",
                "nan",
                "--",
                PY,
                "-c",
                "pass",
            ],
            ["heartbeat_timeout=nan"],
        ),
        (
            [
                "launch",
                "--hosts",
                "h:2222,g:2222",
                "--task-index",
                "0",
                "--max-restarts",
                "2",
                "--",
                PY,
                "-c",
                "pass",
            ],
            ["max_restarts=2", "SLURM --requeue"],
        ),
        (
            ["launch", "--slurm", "-n", "2", "--", PY, "-c", "pass"],
            ["--slurm with -n", "Leave those out"],
        ),
        (
            ["launch", "--slurm", "--", PY, "-c", "pass"],
            ["SLURM_JOB_NODELIST", "Start the job with srun"],
        ),
        (["tune", "--trial-timeout", "0"], ["timeout_seconds=0"]),
        (
            ["tune", "--json", "/nonexistent/dir/out.json"],
            ["--json", "/nonexistent/dir/out.json", "does not exist"],
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0] in ("launch", "tune") else None,
)
def test_bad_command_line_is_refused_at_once(args, names):
    # As on a machine outside SLURM, even when the tests run in a SLURM allocation.
    result = run_command(
        tfpar_command(*args),
        timeout=60,
        env=dict.fromkeys(k for k in os.environ if k.startswith("SLURM_")),
    )
    assert result.returncode == 3, result.output
    assert "Traceback" not in result.output, result.output
    line = [
        printed
        for printed in result.output.splitlines()
        if re.match(r"tfpar \w+: error: ", printed)
    ]
    assert line, result.output
    for name in names:
        assert name in line[-1], f"{name!r} not in: {line[-1]}"


@pytest.mark.parametrize("command", ["demo", "verify"])
def test_a_strategy_name_outside_the_vocabulary_is_a_usage_error_listing_the_names(command, capsys):
    from tfpar import cli
    from tfpar._factory import STRATEGIES

    with pytest.raises(SystemExit) as exit_:
        cli.main(
            [command, "--strategy", "ps", "--model", "m:f", "--data", "m:f"][
                : 3 if command == "demo" else 7
            ]
        )
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --strategy: invalid choice: 'ps'" in err and all(
        repr(name) in err for name in STRATEGIES
    ), err


@pytest.mark.parametrize(
    "args, message",
    [
        (["demo", "--batch-size", "65"], "global_batch_size=65 with 2 replicas"),
        (["demo", "--precision", "half"], "Unknown precision policy 'half'"),
        (
            ["demo", "--qat", "--strategy", "parameter_server"],
            "--qat runs with the data_parallel or horovod strategy",
        ),
        (
            ["demo", "--compress", "--strategy", "pipeline"],
            "--compress runs with the data_parallel or horovod strategy",
        ),
        (
            ["demo", "--keras", "3", "--strategy", "parameter_server"],
            "Received: --keras 3 --strategy parameter_server",
        ),
        (["demo", "--keras", "3", "--qat"], "Received: --keras 3 --strategy data_parallel --qat"),
        (
            ["demo", "--keras", "3", "--compress"],
            "Received: --keras 3 --strategy data_parallel --compress",
        ),
        (
            [
                "verify",
                "--model",
                "tfpar.demo:compiled_model",
                "--data",
                "tfpar.demo:digits_dataset",
                "--steps",
                "0",
            ],
            "steps must be an int >= 1. Received: steps=0",
        ),
        (
            ["verify", "--model", "tfpar.demo", "--data", "tfpar.demo:digits_dataset"],
            "--model takes module:function. Received: --model='tfpar.demo'",
        ),
        (
            [
                "verify",
                "--model",
                "tfpar.demo:compiled_model",
                "--data",
                "tfpar.demo:digits_dataset",
                "--paths",
                "all",
                "--steps",
                "3",
            ],
            "Received: steps=3. Use steps=4",
        ),
        (
            [
                "verify",
                "--model",
                "tfpar.demo:compiled_model",
                "--data",
                "tfpar.demo:digits_dataset",
                "--paths",
                "zero1",
                "--zero-stage",
                "2",
            ],
            "Received: zero_stage=2 with paths='zero1'",
        ),
        (
            ["tune", "--space", '{"per_replica_batch": []}'],
            "The tune axis 'per_replica_batch' is empty",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_flags_of_the_training_commands_are_refused_before_any_training(args, message, capsys):
    """The commands that train (their TensorFlow start shared with this process, so called as the
    entry point calls them: ``sys.exit(tfpar.cli.main())``): exit code 3, one error line, no
    traceback, no step trained."""
    from tfpar import cli

    assert cli.main(args) == 3
    out, err = capsys.readouterr()
    assert f"tfpar {args[0]}: error: " in err and message in err, err
    assert "Traceback" not in out + err and "Epoch 1" not in out + err
