"""Every name a public tfpar module exports resolves, and to the same object the second time.

Lazy packages (``tfpar``, ``tfpar.strategies``, ``tfpar.pipeline``) load names on
first use; a submodule with an exported name (``strategies/auto.py`` once was) would replace
that name on the package after the first access.
"""

import importlib
import inspect

import pytest

import tfpar
from tests.conftest import public_modules


@pytest.mark.parametrize("module_name", public_modules())
def test_every_exported_name_resolves_twice_to_the_same_object(module_name):
    module = importlib.import_module(module_name)
    assert hasattr(module, "__all__"), f"{module_name} has no __all__"
    for name in module.__all__:
        first = getattr(module, name)
        second = getattr(module, name)
        assert first is second, f"{module_name}.{name} changed between two reads"
        again = getattr(importlib.import_module(module_name), name)
        assert again is first


def test_auto_is_the_function_on_every_access():
    from tfpar import strategies

    for _ in range(3):
        assert inspect.isfunction(strategies.auto) and strategies.auto.__name__ == "auto"
    importlib.import_module("tfpar.strategies._auto")
    assert inspect.isfunction(strategies.auto)


def test_horovod_strategy_is_reachable_like_data_parallel():
    from tfpar import strategies
    from tfpar.strategies.horovod import HorovodConfig, HorovodStrategy

    assert (
        strategies.HorovodStrategy is HorovodStrategy and strategies.HorovodConfig is HorovodConfig
    )
    assert "HorovodStrategy" in strategies.__all__ and "HorovodStrategy" in dir(strategies)


@pytest.mark.parametrize(
    "code, expected",
    [
        ("import tfpar, tensorflow as tf; print(tf.keras.Model.__module__)", "tf_keras."),
        # without tfpar: Keras 3
        ("import tensorflow as tf; print(tf.keras.Model.__module__)", "keras."),
        # keras first loads TensorFlow first: tf.keras stays Keras 3, tfpar.keras is tf_keras, and a
        # Keras 3 model trains under tfpar's strategies all the same
        (
            "import keras, tfpar, tensorflow as tf; print(tfpar.keras.__name__, "
            "tf.keras.Model.__module__)",
            "tf_keras keras.",
        ),
    ],
    ids=["with-tfpar-first", "without-tfpar", "keras-first"],
)
def test_importing_tfpar_first_makes_tf_keras_the_keras_2_api(code, expected):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].startswith(expected), done.stdout


def test_the_pure_modules_load_no_tensorflow():
    import subprocess
    import sys

    from tests.unit.test_layers import PURE

    code = (
        f"import sys, {', '.join(sorted(PURE | {'tfpar.cli'}))}; "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tf_keras', "
        "'keras')); "
        "print('LOADED', loaded)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout, done.stdout


def test_the_version_is_defined_once_and_the_package_says_its_licence_and_python():
    import importlib.metadata
    import os
    import subprocess
    import sys

    metadata = importlib.metadata.metadata("tfpar")
    # pyproject.toml reads tfpar/__init__.py
    assert importlib.metadata.version("tfpar") == tfpar.__version__
    assert metadata["License-Expression"] == "Apache-2.0" and "LICENSE" in metadata.get_all(
        "License-File"
    )
    assert set(metadata.get_all("Provides-Extra")) == {
        "gpu",
        "horovod",
        "ray",
        "report",
        "docs",
        "dev",
    }
    root = os.path.dirname(os.path.dirname(tfpar.__file__))
    assert os.path.exists(os.path.join(root, "pyproject.toml")) and not os.path.exists(
        os.path.join(root, "setup.py")
    )
    assert sorted(metadata["Requires-Python"].split(",")) == ["<3.12", ">=3.11"]  # what CI tests:
    assert sys.version_info[:2] == (3, 11)
    assert os.path.exists(os.path.join(os.path.dirname(tfpar.__file__), "py.typed"))
    done = subprocess.run(
        [sys.executable, "-m", "tfpar.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"tfpar {tfpar.__version__}"), done.stderr


def test_one_vocabulary_every_strategy_and_documented_exception_under_tfpar():
    """The strategy names the CLI and tune take, the classes they build, and the exceptions the
    documentation names: all reachable after ``import tfpar``, each the object of its own module."""
    import subprocess
    import sys

    from tfpar._factory import STRATEGIES

    assert STRATEGIES == (
        "data_parallel",
        "horovod",
        "parameter_server",
        "pipeline",
        "tensor_parallel",
    )
    code = (
        "import tfpar, inspect\n"
        "from tfpar import strategies, pipeline, devices, quantization\n"
        "assert tfpar.DataParallel is strategies.DataParallel and tfpar.Pipeline is "
        "pipeline.Pipeline\n"
        "assert tfpar.HorovodStrategy is strategies.HorovodStrategy and tfpar.ParameterServer is "
        "strategies.ParameterServer\n"
        "assert tfpar.DevicesAlreadyInitializedError is devices.DevicesAlreadyInitializedError\n"
        "assert tfpar.ParameterServerLostError is strategies.ParameterServerLostError\n"
        "assert tfpar.AccuracyDropError is quantization.AccuracyDropError and "
        "issubclass(tfpar.AccuracyDropError, ValueError)\n"
        "print(tfpar.verify.verify.__name__, tfpar.report.report.__name__, "
        "tfpar.doctor.report.__name__,\n"
        "      tfpar.tune.tune.__name__, tfpar.demo.run_demo.__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["verify", "report", "report", "tune", "run_demo"]


@pytest.mark.parametrize(
    "name, options",
    [
        (
            "DataParallel",
            [
                "all_reduce: str = 'auto'",
                "compression: str = 'none'",
                "gradient_accumulation_steps: int = 1",
            ],
        ),
        ("HorovodStrategy", ["op: str = 'average'", "backward_passes_per_step: int = 1"]),
        (
            "ParameterServer",
            ["variable_partitioner: object = 'auto'", "connect_timeout_seconds: float = 60.0"],
        ),
        (
            "Pipeline",
            ["num_stages: int = 2", "num_microbatches: int = 4", "schedule: str = '1f1b'"],
        ),
    ],
)
def test_help_of_a_strategy_lists_its_options(name, options):
    """``help(tfpar.DataParallel)`` shows the options of its config dataclass, not ``**kwargs``."""
    import pydoc

    text = pydoc.render_doc(getattr(tfpar, name), renderer=pydoc.plaintext)
    header = next(line for line in text.splitlines() if f"{name}(config" in line)
    assert "**kwargs" not in header and all(option in header for option in options), header


@pytest.mark.parametrize(
    "path",
    [
        "tfpar.launch.launch",
        "tfpar.launch.LaunchOptions",
        "tfpar.launch.LaunchError",
        "tfpar.launch.Task",
        "tfpar.launch.run_tasks",
        "tfpar.cluster.ClusterInfo",
        "tfpar.cluster.free_ports",
        "tfpar.cluster.expand_hostlist",
        "tfpar.install_horovod.main",
        "tfpar.demo.run_demo",
        "tfpar.demo.transformer",
    ],
)
def test_the_public_paths_the_docs_show_lead_where_they_did_before_the_launcher_got_its_rooms(path):
    module_name, _, name = path.rpartition(".")
    assert callable(getattr(importlib.import_module(module_name), name))


def test_python_m_tfpar_install_horovod_still_runs_the_installer():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "tfpar.install_horovod", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m tfpar.install_horovod")
