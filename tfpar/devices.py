"""Device discovery: the local GPUs, or the CPU split into virtual devices.

Virtual CPU devices are tfpar's embedded default: with no GPU, the CPU is split
into N logical devices so that every strategy runs on a laptop with the same
code it runs on a GPU server.
"""

import logging
from collections.abc import Sequence

from tfpar._checks import check_int, check_names, env_int
from tfpar._keras import tf

__all__ = [
    "check_devices",
    "DEFAULT_NUM_CPU_DEVICES",
    "DevicesAlreadyInitializedError",
    "configure_devices",
    "local_devices",
]

DEFAULT_NUM_CPU_DEVICES = 2
_ENV = "TFPAR_NUM_CPU_DEVICES"
_log = logging.getLogger(__name__)


class DevicesAlreadyInitializedError(RuntimeError):
    """TensorFlow initialised its devices before tfpar could configure them."""


def _resolve_count(num_cpu_devices):
    if num_cpu_devices is None:
        return env_int(
            _ENV,
            DEFAULT_NUM_CPU_DEVICES,
            1,
            " Set it to a number of virtual CPU devices, or unset it.",
        )
    return check_int("num_cpu_devices", num_cpu_devices, 1)


def local_devices() -> list[str]:
    """Returns the names of this process's compute devices: GPUs, else CPUs.

    Unlike `configure_devices` this changes nothing (but it initialises the
    TensorFlow runtime if that had not happened yet).
    """
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [d.name for d in gpus]
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def check_devices(name: str, devices: Sequence[str]) -> Sequence[str]:
    """Returns ``devices`` as a tuple after checking that each one exists in this process.

    A name TensorFlow would not find (``"/gpu:0"`` with no GPU, ``"/cpu:7"`` with 2 CPU
    devices) would otherwise be placed on another device without a word.

    Raises:
        TypeError: a string, or not a list of strings.
        ValueError: an empty list, a name that is not a device name, or a device that does not
            exist.
    """
    devices = check_names(name, devices)
    if not devices:
        raise ValueError(
            f"{name} must name at least one device. Received: {name}=[]. Leave it None for all."
        )
    specs = [tf.DeviceSpec.from_string(d.name) for d in tf.config.list_logical_devices()]
    present = {(s.device_type, s.device_index) for s in specs}
    # a connected cluster's too
    remote = {(s.job, s.task or 0, s.device_type, s.device_index) for s in specs}
    for device in devices:
        try:
            spec = tf.DeviceSpec.from_string(device)
        except ValueError:
            spec = None
        if spec is None or spec.device_type is None:
            raise ValueError(
                f"{device!r} is not a device name. Received: {name}={list(devices)!r}. "
                f"Use names such as {local_devices()[:2]}."
            )
        kind, index = spec.device_type.upper(), spec.device_index or 0
        known = (
            (kind, index) in present
            if spec.job is None
            else (spec.job, spec.task or 0, kind, index) in remote
        )
        if not known:
            raise ValueError(
                f"No device {device!r} in this process. Received: {name}={list(devices)!r}; the "
                f"devices are {sorted(d.name for d in tf.config.list_logical_devices())}. Use "
                "those, or tfpar.configure_devices(N) before TensorFlow starts for N virtual CPU "
                "devices."
            )
    return devices


def configure_devices(num_cpu_devices: int | None = None) -> list[str]:
    """Finds the local GPUs or splits the CPU into virtual devices.

    Call it before anything else touches TensorFlow's devices (building a
    tensor or a strategy initialises them). With GPUs present the GPUs are
    used and ``num_cpu_devices`` is ignored.

    Args:
        num_cpu_devices: how many virtual CPU devices to create when there is
            no GPU. Defaults to the split an earlier call made, else
            ``$TFPAR_NUM_CPU_DEVICES``, else 2.

    Returns:
        The device names, e.g. ``["/device:CPU:0", "/device:CPU:1"]``.

    Raises:
        ValueError: if the count is below 1 or the variable is not a number.
        TypeError: if the count is not an int.
        DevicesAlreadyInitializedError: if TensorFlow's devices were already
            initialised with a different number of CPU devices.

    Examples:
        >>> import tfpar
        >>> devices = tfpar.configure_devices(2)  # doctest: +SKIP
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    if num_cpu_devices is None:  # keep a split made earlier (by a call with a count)
        existing = tf.config.get_logical_device_configuration(cpu)
        if existing:
            num_cpu_devices = len(existing)
    count = _resolve_count(num_cpu_devices)
    # Listing physical devices and naming logical ones does not initialise the
    # runtime, so a multi-worker strategy can still be created afterwards.
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        _log.info("Using %d GPU(s); num_cpu_devices=%d ignored.", len(gpus), count)
        return [f"/device:GPU:{i}" for i in range(len(gpus))]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    except RuntimeError:
        existing = tf.config.list_logical_devices("CPU")
        if len(existing) == count:
            return [d.name for d in existing]
        raise DevicesAlreadyInitializedError(
            f"TensorFlow already initialised its devices with {len(existing)} "
            f"CPU device(s), so tfpar cannot create the {count} requested. "
            "Call tfpar.configure_devices() at the start of the program, "
            "before creating any tensor, model or strategy (or set "
            f"{_ENV}={count} and let tfpar configure them first)."
        ) from None
    return [f"/device:CPU:{i}" for i in range(count)]
