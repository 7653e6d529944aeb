"""Type hints: mypy passes over the package, and every callable a user reaches (the exported
functions, classes and their public methods of the modules below) is annotated, so that help(),
an IDE and the API pages give the types. Methods that override TensorFlow's or Keras' own
(``scope``, ``call``, ``fit``, ``reduce``...) keep those libraries' signatures."""

import importlib
import inspect
import subprocess
import sys

from tests.conftest import ROOT

USER_MODULES = ("tfpar", "tfpar.strategies", "tfpar.callbacks", "tfpar.precision", "tfpar.quantization",
                "tfpar.integrations.ray", "tfpar.pipeline")
USER_FUNCTIONS = ("tfpar.data.distribute", "tfpar.data.check_coverage", "tfpar.verify.verify", "tfpar.tune.tune",
                  "tfpar.report.report", "tfpar.launch.launch")
KERAS_HOOKS = ("on_", "set_model", "set_params")  # a callback's hooks: Keras calls them
MADE_BY_TFPAR = {"tfpar.pipeline.model.PipelineModel.__init__"}  # Pipeline.stage makes it
KERAS_MODEL_METHODS = {"call", "fit", "get_config", "train_step"}  # PipelineModel's Keras base is chosen per model


def _overrides_a_library_method(klass, name):
    if klass.__name__ == "PipelineModel" and name in KERAS_MODEL_METHODS:
        return True
    return any(name in vars(base) for base in klass.__mro__ if not base.__module__.startswith("tfpar"))


def _user_callables():
    objects = []
    for module in USER_MODULES:
        loaded = importlib.import_module(module)
        objects += [getattr(loaded, name) for name in loaded.__all__]
    for function in USER_FUNCTIONS:
        module, name = function.rsplit(".", 1)
        objects.append(getattr(importlib.import_module(module), name))
    found = {}
    for obj in objects:
        if inspect.isclass(obj) and obj.__module__.startswith("tfpar"):
            for klass in (k for k in obj.__mro__ if k.__module__.startswith("tfpar")):
                for name, member in vars(klass).items():
                    member = getattr(member, "__func__", member)  # classmethods, staticmethods
                    public = not name.startswith(("_",) + KERAS_HOOKS) or name == "__init__"
                    if inspect.isfunction(member) and public and not _overrides_a_library_method(obj, name):
                        found[f"{klass.__module__}.{klass.__qualname__}.{name}"] = member
        elif inspect.isfunction(obj) and obj.__module__.startswith("tfpar"):
            found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_callable_a_user_reaches_is_annotated():
    callables = _user_callables()
    assert len(callables) > 50
    missing = {}
    for name, function in callables.items():
        signature = inspect.signature(function)
        unannotated = [p.name for p in signature.parameters.values()
                       if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
        if function.__name__ != "__init__" and signature.return_annotation is inspect.Signature.empty:
            unannotated.append("return")
        if unannotated and name not in MADE_BY_TFPAR:
            missing[name] = unannotated
    assert missing == {}


def test_mypy_passes_over_the_package():
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
