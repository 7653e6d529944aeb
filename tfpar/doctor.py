"""``tfpar doctor``: what this machine offers tfpar (versions, devices, the CPU's vector
instructions, Horovod)."""

import importlib.util
import json
import os
import platform

__all__ = ["cpu_lines", "horovod_keras_report", "horovod_report", "report", "vector_extensions"]

# The CPU's vector instructions that decide how fast tfpar's float32, bfloat16 and int8 paths run.
_VECTOR_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "amx_bf16",
    "amx_int8",
)

# A Horovod Keras script in miniature, run as a user's shell would (no TF_USE_LEGACY_KERAS):
# public API only, one rank.
_KERAS_PROBE = """
import tensorflow as tf
import horovod.tensorflow.keras as hvd
hvd.init()
model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
model.compile(optimizer=hvd.DistributedOptimizer(tf.optimizers.SGD(0.1)), loss="mse",
              experimental_run_tf_function=False)
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
             hvd.callbacks.MetricAverageCallback()]
model.fit(tf.ones((8, 2)), tf.ones((8, 1)), batch_size=4, epochs=1, verbose=0, callbacks=callbacks)
print("tfpar-probe-ok", type(model).__module__.split(".")[0])
"""
_KERAS_PROBE_TIMEOUT_SECONDS = 180


def horovod_report() -> dict:
    """Returns a dict: installed, version, controllers, built_against, patches, error."""
    spec = importlib.util.find_spec("horovod")
    if spec is None:
        return {"installed": False, "error": "not installed"}
    try:
        import horovod
        import horovod.tensorflow as hvd
    except Exception as e:  # an ABI mismatch shows up as any import error
        return {"installed": True, "importable": False, "error": f"{type(e).__name__}: {e}"}
    note_path = os.path.join(list(spec.submodule_search_locations or [""])[0], "_tfpar_build.json")
    note = {}
    if os.path.exists(note_path):
        with open(note_path, encoding="utf-8") as f:
            note = json.load(f)
    controllers = [
        name for name, ok in (("Gloo", hvd.gloo_built()), ("MPI", hvd.mpi_built())) if ok
    ]
    return {
        "installed": True,
        "importable": True,
        "version": horovod.__version__,
        "controllers": controllers,
        "nccl": bool(hvd.nccl_built()),
        "built_against": note.get("tensorflow"),
        "patches": note.get("patches"),
    }


def horovod_keras_report() -> dict:
    """Whether a script written for ``horovod.tensorflow.keras`` runs here unchanged.

    Runs `_KERAS_PROBE` in a fresh process with ``TF_USE_LEGACY_KERAS`` unset.

    Returns:
        a dict: works (bool), keras (the Keras that ran it) or error (its last line).
    """
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    try:
        done = subprocess.run(
            [sys.executable, "-c", _KERAS_PROBE],
            capture_output=True,
            text=True,
            env=env,
            timeout=_KERAS_PROBE_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        return {
            "works": False,
            "error": f"a one-step fit took over {_KERAS_PROBE_TIMEOUT_SECONDS} s",
        }
    for line in done.stdout.splitlines():
        if line.startswith("tfpar-probe-ok"):
            return {"works": True, "keras": line.split()[-1]}
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return {"works": False, "error": lines[-1] if lines else f"exit code {done.returncode}"}


def job_lines():
    """One line per port a running tfpar job listens on (read from /proc: nothing is sent)."""
    from tfpar._local.loopback import job_listeners

    listeners = job_listeners()
    if not listeners:
        return ["jobs:        no running tfpar job (no process with a TF_CONFIG listens)"]
    return [
        f"jobs:        {name} (pid {pid}) listens on {address}:{port} ({_reach(address)})"
        for name, pid, address, port in listeners
    ]


def _reach(address):
    """Who can reach a server listening on ``address``."""
    import ipaddress

    if ipaddress.ip_address(address).is_loopback:
        return "loopback only"
    return "ALL interfaces: see README, Security"


def vector_extensions(flags: set[str] | None = None) -> list[str]:
    """The CPU's vector instructions among those tfpar's speed depends on (default: from
    /proc/cpuinfo), in the order of `cpu_lines`."""
    from tfpar.precision.policy import _cpu_flags

    flags = _cpu_flags() if flags is None else set(flags)
    return [flag for flag in _VECTOR_FLAGS if flag in flags]


def cpu_lines(flags: set[str] | None = None) -> list[str]:
    """What the CPU computes natively, and what follows for int8 TFLite and for precision 'auto'.

    Args:
        flags: the CPU's feature flags (default: from /proc/cpuinfo).
    """
    from tfpar.precision.policy import _cpu_flags, choose

    flags = _cpu_flags() if flags is None else set(flags)
    present = vector_extensions(flags)
    dot = sorted(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})
    if dot:
        int8 = f"int8 dot products in hardware ({', '.join(dot)})"
    else:
        int8 = (
            "no int8 dot-product instructions (no avx512_vnni, avx_vnni or amx_int8): int8 TFLite "
            "may run no faster than float here (bench/quantization.py measures both)"
        )
    policy, reason = choose(cpu_flags=flags)
    return [
        f"cpu:         {', '.join(present) or 'none of ' + ', '.join(_VECTOR_FLAGS)}; {int8}",
        f"precision:   'auto' picks {policy}: {reason}",
    ]


def kernels_line(enabled: bool | None = None) -> str:
    """Which kernels TensorFlow runs here: oneDNN's, on by default only on CPUs with neural-network
    instructions, else Eigen's, whose step a bare tf.distribute strategy's input iterator doubles
    in page faults (tfpar's strategies undo its cause: `tfpar._compat.keep_malloc_policy`).

    Args:
        enabled: whether oneDNN runs (default: this process's TensorFlow).
    """
    from tfpar import _compat

    if enabled is None:
        enabled = _compat.onednn_enabled()
    if enabled:
        return "kernels:     oneDNN's (TF_ENABLE_ONEDNN_OPTS=0 turns them off)"
    return (
        "kernels:     Eigen's (TensorFlow turns oneDNN on by default only on CPUs with AVX-512 "
        "VNNI or BF16, AVX-VNNI or AMX; TF_ENABLE_ONEDNN_OPTS=1 tries it here). Here a bare "
        "tf.distribute strategy's step can spend as long again in page faults; "
        "tfpar's strategies do not"
    )


def report() -> list[str]:
    """Returns the doctor's lines."""
    from tfpar._keras import keras, tf

    gpus = tf.config.list_physical_devices("GPU")
    lines = [
        f"python:      {platform.python_version()}",
        f"tensorflow:  {tf.__version__}",
        f"tf_keras:    {keras.__version__} (tf.keras is {tf.keras.__name__.split('.')[0]})",
        f"devices:     {len(gpus)} GPU(s), {len(tf.config.list_physical_devices('CPU'))} CPU(s), "
        f"{os.cpu_count()} cores",
        *cpu_lines(),
        kernels_line(),
    ]
    lines += job_lines()
    hv = horovod_report()
    if not hv["installed"] or not hv.get("importable"):
        from tfpar.strategies._horovod_init import INSTALL_HINT

        lines.append(f"horovod:     unavailable ({hv['error']}). {INSTALL_HINT}")
    else:
        built = hv["built_against"] or "unknown (not built by tfpar install-horovod)"
        lines.append(
            f"horovod:     {hv['version']}, controllers: {', '.join(hv['controllers']) or 'none'}, "
            f"NCCL: {'yes' if hv['nccl'] else 'no'}, built against TensorFlow {built}"
        )
        keras_api = horovod_keras_report()
        if keras_api["works"]:
            lines.append(
                f"horovod.tensorflow.keras: works, unchanged scripts run on {keras_api['keras']} "
                "(no TF_USE_LEGACY_KERAS needed)"
            )
        else:
            lines.append(
                f"horovod.tensorflow.keras: fails ({keras_api['error']}). Horovod's Keras API "
                "runs on tf_keras in the build `tfpar install-horovod --force` makes."
            )
        lines.append(horovod_core_line(hv["patches"]))
    return lines


def horovod_core_line(patches):
    """Which Keras ``horovod.tensorflow`` scripts get here, and why: theirs, through ``tf.keras``,
    which TensorFlow makes tf_keras only when TF_USE_LEGACY_KERAS is set before it is imported."""
    import tfpar
    from tfpar.install_horovod import PATCH_ID

    legacy = tfpar._SHELL_TF_USE_LEGACY_KERAS in ("1", "true", "True")  # TensorFlow's own test
    keras = (
        "tf_keras (TF_USE_LEGACY_KERAS is set)"
        if legacy
        else "Keras 3 (TF_USE_LEGACY_KERAS is not set)"
    )
    if patches != PATCH_ID:
        return (
            f"horovod.tensorflow: tf.keras is {keras}; this build predates tfpar's Keras 3 patches "
            "(Keras 3 variables fail in its tapes): rebuild with `tfpar install-horovod --force`"
        )
    return (
        f"horovod.tensorflow: takes the script's own Keras; tf.keras is {keras}. Keras 3 "
        "variables, optimizers (DistributedOptimizer), tapes and SyncBatchNormalization work as "
        "tf_keras ones do"
    )
