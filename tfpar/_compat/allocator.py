"""The C library's allocation policy under TensorFlow's input pipelines, and whether TensorFlow
runs its oneDNN kernels (part of `tfpar._compat`, which re-exports these).

The first ``GeneratorDataset`` kernel a process builds calls
``mallopt(M_MMAP_THRESHOLD, 128 KiB)`` once for the process (against a memory growth with Python
generators; its log line says M_TRIM_THRESHOLD). tf.distribute builds one for the iterator of
every distributed dataset (its ``MultiDeviceIterator``), so every strategy's ``fit`` has it and a
hand-written loop does not. From then on glibc maps each allocation above 128 KiB from the kernel
and unmaps it when freed, instead of reusing its heap: a step of TensorFlow's Eigen kernels (on
every CPU where TensorFlow leaves oneDNN off, such as AVX2-only ones) spends as long again in page
faults. `keep_malloc_policy` lets TensorFlow do it at once and then gives glibc back the
thresholds its own dynamic rule reaches.
"""

import ctypes
import logging
import os
import platform
import sys
import threading

__all__ = ["keep_malloc_policy", "onednn_enabled"]

_log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
DYNAMIC_MMAP_CEILING = 32 * 2**20
"""glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: where its dynamic mmap threshold stops rising."""

_lock = threading.Lock()
_kept = False


def _let_tensorflow_patch_now():
    """Builds and runs one ``GeneratorDataset`` kernel, whose first construction in the process
    sets TensorFlow's threshold; it is never set again after."""
    import tensorflow as tf

    with tf.device("/cpu:0"):
        nothing = tf.data.Dataset.from_generator(
            lambda: iter(()), output_signature=tf.TensorSpec([], tf.int32)
        )
        for _ in nothing:
            pass


def _mallopt(param, value):
    """glibc's ``mallopt``; False where it refuses."""
    return ctypes.CDLL(None).mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1


def _thresholds():
    """``(param, value)`` to set after TensorFlow's: the user's own ``MALLOC_MMAP_THRESHOLD_``
    where set (TensorFlow's call replaced it), none where they chose only other glibc settings
    (glibc then holds 128 KiB already), else the ceiling of glibc's dynamic rule and twice it as
    the trim threshold, as that rule sets them."""
    own = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    if own is not None:
        return [(M_MMAP_THRESHOLD, int(own))] if own.strip().isdigit() else []
    if os.environ.get("MALLOC_TRIM_THRESHOLD_") is not None:
        return []
    return [(M_MMAP_THRESHOLD, DYNAMIC_MMAP_CEILING), (M_TRIM_THRESHOLD, 2 * DYNAMIC_MMAP_CEILING)]


def keep_malloc_policy():
    """Once per process, before a strategy's input pipeline: where TensorFlow would pin glibc's
    mmap threshold (Linux with glibc), it does so now, and the thresholds of
    `_thresholds` are set after it. Elsewhere (another C library, an allocator preloaded in
    glibc's place: mallopt is then a no-op or refused), nothing changes; in graph mode it waits
    for an eager call."""
    import tensorflow as tf

    global _kept
    with _lock:
        if _kept or not tf.executing_eagerly():  # a graph (TF1) cannot run the dataset now
            return
        _kept = True
        if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
            return
        try:
            _let_tensorflow_patch_now()
        except Exception as error:  # an optimisation: the strategy still works without it
            _log.warning(
                "tfpar could not keep glibc's allocation policy (%s): under TensorFlow's "
                "Eigen kernels a step may spend longer in page faults",
                error,
            )
            return
        for param, value in _thresholds():
            if not _mallopt(param, value):
                _log.debug(
                    "mallopt(%d, %d) was refused; the C library keeps its policy", param, value
                )
                return


def onednn_enabled() -> bool:
    """Whether TensorFlow runs its oneDNN kernels in this process: by default only on CPUs with
    neural-network instructions (AVX-512 VNNI or BF16, AMX; TensorFlow's RFC 400), else its Eigen
    kernels; ``TF_ENABLE_ONEDNN_OPTS`` overrides. No public getter: TensorFlow only logs it."""
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())
