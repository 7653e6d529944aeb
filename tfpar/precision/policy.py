"""Mixed precision for tfpar: pick the Keras policy, and check models compiled under it.

`use` sets the global dtype policy of tf_keras and of Keras 3; ``"auto"`` picks float16 on GPUs with
tensor cores, bfloat16 on CPUs that compute it natively (AVX512_BF16 or AMX),
float32 otherwise, and logs why. Under ``mixed_float16`` each Keras wraps the
optimizer in one `LossScaleOptimizer` of its own at ``compile`` (never twice); its
finiteness check runs on the gradients after they were reduced across replicas
(tfpar's strategies, Horovod's included, reduce inside the optimizer's
``apply_gradients``), so one replica's overflow makes every replica skip the step
and change the loss scale the same way.

While a mixed policy set by `use` is in force, ``Model.compile`` of either Keras refuses a
model built before it (its layers keep the policy they were built under), and runs
`check_output_precision` after compiling: an output computed in 16 bits (a final softmax
without ``dtype="float32"``) warns with the fix, or raises with ``strict=True``. Neither Keras
has a hook at compile, so `use` wraps both Kerases' ``Model.compile`` while its mixed policy
is set, and ``use("float32")`` puts Keras' own back (ARCHITECTURE.md, "Where tfpar touches
Keras"). A policy set through Keras itself is Keras' business: tfpar checks nothing then.

Examples:
    >>> tfpar.precision.use("auto")  # doctest: +SKIP
    'mixed_bfloat16'
"""

import contextlib
import functools
import logging
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

from tfpar import _compat
from tfpar._checks import check_choice
from tfpar._keras import is_keras3, keras, keras3, keras_of, tf

__all__ = [
    "POLICIES",
    "PrecisionWarning",
    "check_output_precision",
    "choose",
    "current",
    "kept_policy",
    "loss_scale_of",
    "use",
]

POLICIES = ("auto", "mixed_float16", "mixed_bfloat16", "float32")
"""Names `use` accepts."""

_log = logging.getLogger("tfpar.precision")
_state = {"strict": False}  # use(..., strict=): what the compile check does with a 16-bit output
_wrapped: dict = {}  # Keras Model class -> its own compile, while use()'s mixed policy is set


class PrecisionWarning(UserWarning):
    """A valid but slow or unsafe precision set-up."""


def _cpu_flags(path="/proc/cpuinfo"):
    try:
        with open(path) as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _gpu_capabilities():
    capabilities = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        capabilities.append(
            (details.get("device_name", gpu.name), details.get("compute_capability"))
        )
    return capabilities


def choose(
    gpus: Sequence[tuple] | None = None, cpu_flags: set[str] | None = None
) -> tuple[str, str]:
    """The policy ``"auto"`` means here, and why: ``(name, reason)``.

    Args:
        gpus: ``[(name, (major, minor)), ...]`` (default: this machine's GPUs).
        cpu_flags: the CPU's feature flags (default: from /proc/cpuinfo).
    """
    gpus = _gpu_capabilities() if gpus is None else gpus
    if gpus:
        slow = [(name, cc) for name, cc in gpus if not cc or tuple(cc) < (7, 0)]
        if not slow:
            return (
                "mixed_float16",
                f"every GPU has float16 tensor cores ({gpus[0][0]}, compute capability "
                f"{'.'.join(map(str, gpus[0][1]))})",
            )
        return (
            "float32",
            f"GPU {slow[0][0]} (compute capability {slow[0][1]}) has no float16 tensor cores",
        )
    flags = _cpu_flags() if cpu_flags is None else set(cpu_flags)
    native = sorted(flags & {"avx512_bf16", "amx_bf16"})
    if native:
        return "mixed_bfloat16", f"no GPU; the CPU computes bfloat16 natively ({', '.join(native)})"
    return "float32", "no GPU, and the CPU has no native bfloat16 (no avx512_bf16 or amx_bf16)"


def use(policy: str = "auto", *, strict: bool = False) -> str:
    """Sets the global dtype policy of tf_keras and of Keras 3; returns the policy's name.

    Both Kerases read their own global policy when a layer is built, so a model of either
    built afterwards computes in it (under ``mixed_float16`` both wrap the optimizer in their
    LossScaleOptimizer at ``compile``).

    Args:
        policy: one of `POLICIES`.
        strict: with a mixed policy, make the compile-time check raise instead of warn.

    Raises:
        ValueError: an unknown policy name.
    """
    check_choice("policy", policy, POLICIES, what="precision policy")
    if policy == "auto":
        policy, reason = choose()
        _log.info("precision 'auto' -> %s: %s", policy, reason)
    elif policy == "mixed_float16" and not any(
        cc and tuple(cc) >= (7, 0) for _, cc in _gpu_capabilities()
    ):
        warnings.warn(
            "mixed_float16 without a GPU that has float16 tensor cores: it runs, emulated, slower "
            "than float32. Use 'mixed_bfloat16' on a CPU with AVX512_BF16/AMX, or 'float32' "
            "(tfpar.precision.use('auto') picks for you).",
            PrecisionWarning,
            stacklevel=2,
        )
    keras.mixed_precision.set_global_policy(policy)
    keras3().mixed_precision.set_global_policy(policy)
    _state["strict"] = strict
    _check_compiles(policy != "float32")
    return policy


@contextlib.contextmanager
def kept_policy() -> Iterator[None]:
    """Puts back on exit both Kerases' global policies, `use`'s strictness and its compile checks
    as they were on entry (``tfpar verify --paths`` sets a policy per path)."""
    policies = (keras.mixed_precision.global_policy(), keras3().mixed_precision.global_policy())
    strict = _state["strict"]
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(policies[0])
        keras3().mixed_precision.set_global_policy(policies[1])
        _state["strict"] = strict
        _check_compiles(any(p.name != "float32" for p in policies))


def _check_compiles(on):
    """Wraps both Kerases' ``Model.compile`` with the policy checks (``on``), or puts Keras' own
    back."""
    for model_class in (keras.Model, keras3().Model):
        if on and model_class not in _wrapped:
            _wrapped[model_class] = model_class.__dict__.get("compile")
            model_class.compile = _checked_compile(getattr(model_class, "compile"))
        elif not on and model_class in _wrapped:
            original = _wrapped.pop(model_class)
            if original is None:
                del model_class.compile
            else:
                model_class.compile = original


def _checked_compile(compile_method):
    @functools.wraps(compile_method)
    def compile(self, *args, **kwargs):
        _check_built_under_the_policy(self)
        result = compile_method(self, *args, **kwargs)
        if _global_policy(self) != "float32":
            check_output_precision(self, strict=_state["strict"])
        return result

    return compile


def loss_scale_of(optimizer: Any) -> float | None:
    """A LossScaleOptimizer's current loss scale (a variable or tensor: ``dynamic_scale`` in Keras
    3, ``loss_scale`` in tf_keras), or None for any other optimizer."""
    for name in ("dynamic_scale", "loss_scale"):
        value = getattr(optimizer, name, None)
        if value is not None and not callable(value):
            return value
    return None


def current() -> str:
    """The name of tf_keras' global dtype policy."""
    return keras.mixed_precision.global_policy().name


def check_output_precision(model: Any, strict: bool = False) -> list[str]:
    """Finds outputs computed in 16 bits: warns (or raises) with the fix; returns the messages."""
    problems = []
    # a PipelineModel: its last stage computes the output
    model = getattr(model, "stages", [model])[-1]
    for tensor in model.outputs or []:
        dtype = tf.as_dtype(tensor.dtype)  # a tf.DType in tf_keras, a name in Keras 3
        if dtype in (tf.float16, tf.bfloat16):
            layer = _compat.keras_layer_of(tensor)
            problems.append(
                f"Output {layer.name!r} of {model.name!r} is computed in {dtype.name}, so the loss "
                "is too (it loses precision, and float16 overflows). Give the last layer "
                "dtype='float32' (e.g. keras.layers.Activation('softmax', dtype='float32') after "
                "a Dense) so that only the inner layers run in 16 bits."
            )
    for message in problems:
        if strict:
            raise ValueError(
                message + f" Received: policy {_global_policy(model)!r} with strict=True."
            )
        warnings.warn(message, PrecisionWarning, stacklevel=3)
    return problems


def _global_policy(model):
    """The global dtype policy of ``model``'s Keras."""
    return keras_of(model).mixed_precision.global_policy().name


def _check_built_under_the_policy(model):
    """A model built before `use` keeps the policy it was built under: refuse to compile it then."""
    built_under = getattr(getattr(model, "dtype_policy", None), "name", None)
    policy = _global_policy(model)
    if built_under is not None and built_under != policy:
        raise ValueError(
            f"Model {model.name!r} was built under the dtype policy {built_under!r} and is "
            f"compiled under {policy!r}: its layers keep the policy they were built under, so it "
            f"would train in {built_under}, not in {policy}. Build the model after "
            f"tfpar.precision.use({policy!r}) (or call use({built_under!r}) before compiling it). "
            f"Received: model {model.name!r} ({type(model).__module__.split('.')[0]}), built under "
            f"{built_under!r}."
        )


def agree_on_overflow(model, arguments=None):
    """After ``compile`` of a model of a tfpar strategy: Keras 3's LossScaleOptimizer decides to
    skip a step from each replica's own gradients before they are reduced (TensorFlow's multi-worker
    strategy and Horovod reduce them in the step it applies, MirroredStrategy takes the first
    replica's decision): one replica's overflow would make the replicas part ways, and the next
    collective hang or apply an inf. Its check here is reduced over the replicas, so they all skip,
    or all apply, together."""
    optimizer = getattr(model, "optimizer", None)
    if not (is_keras3(optimizer) and isinstance(optimizer, keras3().optimizers.LossScaleOptimizer)):
        return
    local_check = type(optimizer).check_finite.__get__(optimizer)

    def check_finite(grads):
        finite = local_check(grads)
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return finite
        overflows = context.all_reduce(
            tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.float32)
        )
        return tf.equal(overflows, 0.0)

    optimizer.check_finite = check_finite
