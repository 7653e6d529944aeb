"""``tfpar doctor``: what this machine offers tfpar (versions, devices, Horovod)."""

import importlib.util
import json
import os
import platform

__all__ = ["horovod_report", "report"]


def horovod_report():
    """Returns a dict: installed, version, controllers, built_against, error."""
    spec = importlib.util.find_spec("horovod")
    if spec is None:
        return {"installed": False, "error": "not installed"}
    try:
        import horovod
        import horovod.tensorflow as hvd
    except Exception as e:  # an ABI mismatch shows up as any import error
        return {"installed": True, "importable": False, "error": f"{type(e).__name__}: {e}"}
    note_path = os.path.join(spec.submodule_search_locations[0], "_tfpar_build.json")
    built = None
    if os.path.exists(note_path):
        with open(note_path, encoding="utf-8") as f:
            built = json.load(f).get("tensorflow")
    controllers = [name for name, ok in (("Gloo", hvd.gloo_built()), ("MPI", hvd.mpi_built())) if ok]
    return {
        "installed": True,
        "importable": True,
        "version": horovod.__version__,
        "controllers": controllers,
        "nccl": bool(hvd.nccl_built()),
        "built_against": built,
    }


def report():
    """Returns the doctor's lines."""
    from tfpar._keras import keras, tf

    gpus = tf.config.list_physical_devices("GPU")
    lines = [
        f"python:      {platform.python_version()}",
        f"tensorflow:  {tf.__version__}",
        f"tf_keras:    {keras.__version__} (tf.keras is {tf.keras.__name__.split('.')[0]})",
        f"devices:     {len(gpus)} GPU(s), {len(tf.config.list_physical_devices('CPU'))} CPU(s), "
        f"{os.cpu_count()} cores",
    ]
    hv = horovod_report()
    if not hv["installed"] or not hv.get("importable"):
        from tfpar.strategies.horovod import INSTALL_HINT

        lines.append(f"horovod:     unavailable ({hv['error']}). {INSTALL_HINT}")
    else:
        built = hv["built_against"] or "unknown (not built by scripts/install_horovod.py)"
        lines.append(
            f"horovod:     {hv['version']}, controllers: {', '.join(hv['controllers']) or 'none'}, "
            f"NCCL: {'yes' if hv['nccl'] else 'no'}, built against TensorFlow {built}")
    return lines
