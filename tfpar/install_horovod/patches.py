"""What `tfpar install-horovod` changes in Horovod 0.28.1's sdist before it builds it.

Every change must match the sdist exactly as written, so that another Horovod fails loudly
instead of building something half-patched:
- `PATCHES`: a text found exactly once, replaced;
- `REF_PATCHES`: in a file, every ``<name>.ref()`` (the hashable handle of a ``tf.Variable``)
  becomes ``_tfpar_ref(<name>)``, with the number of them given; a Keras 3 variable has no
  ``.ref()``, its ``tf.Variable`` (``.value``) has (horovod/horovod#4290);
- `ADDED_MODULES`: tfpar's modules copied in whole.

It imports nothing of TensorFlow: `tfpar.install_horovod` runs before Horovod exists.
"""

import hashlib
import os
import re

from tfpar.install_horovod.cache import InstallError

__all__ = ["ADDED_MODULES", "PATCHES", "REF_PATCHES", "apply_patches", "patch_id"]

# tfpar's modules copied into the Horovod package:
# {path in the sdist: the file in tfpar/install_horovod/}
ADDED_MODULES = {
    "horovod/_tfpar_keras.py": "_copied_into_horovod/keras.py",
    "horovod/_tfpar_build.py": "_copied_into_horovod/build.py",
    "horovod/_tfpar_keras3.py": "_copied_into_horovod/keras3.py",
}
_SYNC_BN_LAZY = """\
def __getattr__(name):  # tfpar: imported on first use, so that tf.keras stays unresolved
    if name == "SyncBatchNormalization":
        from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError(f"module 'horovod.tensorflow' has no attribute {name!r}")
"""
_REF = """\
def _tfpar_ref(variable):  # tfpar: a Keras 3 variable has no .ref(); the tf.Variable it holds has
    return variable.ref() if hasattr(variable, "ref") else variable.value.ref()


def vars_to_refs(vars):
"""
_IMPORT_REF = (
    "import tensorflow as tf\n"
    "from horovod.tensorflow.util import _tfpar_ref  # tfpar: Keras 3 variables\n"
)
_SYNC_BN_KERAS = """\
# tfpar: tf.keras is Keras 3 unless TF_USE_LEGACY_KERAS=1. Keras 3's BatchNormalization takes no
# `fused` (it never fuses), and calls _moments(inputs, mask): the override below takes either call.
_TFPAR_KERAS_3 = tf.keras.layers.BatchNormalization.__module__.startswith("keras.")


class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
"""
# (file, text found exactly once, replacement)
PATCHES = (
    (
        "horovod/tensorflow/xla_mpi_ops.cc",
        "#if TENSORFLOW_VERSION >= 2006000000\n",
        "// tfpar: TensorFlow >= 2.19 wheels lack the XLA headers this part needs.\n"
        "#if TENSORFLOW_VERSION >= 2006000000 && TENSORFLOW_VERSION < 2019000000\n",
    ),
    (  # -g costs 16 % of the compile's CPU and makes a 16 MB wheel of a 1.1 MB one (measured
        # 2026-12-08, 2 cores: 268 -> 225 CPU-s, 154 -> 128 s)
        "setup.py",
        "else 'RelWithDebInfo'",
        "else 'Release'  # tfpar: no debug information",
    ),
    (
        "horovod/tensorflow/__init__.py",
        "from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization\n",
        _SYNC_BN_LAZY,
    ),
    (
        "horovod/tensorflow/keras/__init__.py",
        "from tensorflow import keras\n",
        "from horovod._tfpar_keras import keras  # tfpar: tf_keras\n",
    ),
    (
        "horovod/tensorflow/keras/__init__.py",
        "    from keras import backend as K\n",
        "    K = keras.backend  # tfpar: not Keras 3's\n",
    ),
    (
        "horovod/tensorflow/keras/callbacks.py",
        "from tensorflow import keras\n",
        "from horovod._tfpar_keras import keras  # tfpar: tf_keras\n",
    ),
    (
        "horovod/tensorflow/keras/callbacks.py",
        "    from keras import backend as K\n",
        "    K = keras.backend  # tfpar: not Keras 3's\n",
    ),
    (
        "horovod/common/util.py",
        "    # 'fork' is required because horovodrun is a frozen executable\n",
        "    from horovod._tfpar_build import ASK, recorded  # tfpar: the install's answers, no "
        "new process\n"
        "    answer = recorded(ext_base_name, fn_desc)\n"
        "    if answer is not ASK:\n"
        "        return answer\n"
        "    # 'fork' is required because horovodrun is a frozen executable\n",
    ),
    # Keras 3 variables in horovod.tensorflow (with REF_PATCHES)
    ("horovod/tensorflow/util.py", "def vars_to_refs(vars):\n", _REF),
    ("horovod/tensorflow/util.py", "    return vars.ref()\n", "    return _tfpar_ref(vars)\n"),
    ("horovod/tensorflow/__init__.py", "import tensorflow as tf\n", _IMPORT_REF),
    ("horovod/tensorflow/gradient_aggregation.py", "import tensorflow as tf\n", _IMPORT_REF),
    ("horovod/tensorflow/gradient_aggregation_eager.py", "import tensorflow as tf\n", _IMPORT_REF),
    # horovod.tensorflow.DistributedOptimizer takes a Keras 3 optimizer
    (
        "horovod/tensorflow/__init__.py",
        "        import horovod.tensorflow.keras as hvd_k\n        return "
        "hvd_k.DistributedOptimizer(\n",
        "        from horovod._tfpar_keras3 import distributed_optimizer, is_keras3_optimizer  # "
        "tfpar: Keras 3\n"
        "        if is_keras3_optimizer(optimizer):\n"
        "            return distributed_optimizer(optimizer, _make_allreduce_grads_fn(\n"
        "                name or 'Distributed' + type(optimizer).__name__, device_dense, "
        "device_sparse, compression,\n"
        "                sparse_as_dense, op, gradient_predivide_factor, groups, process_set), "
        "backward_passes_per_step)\n"
        "        import horovod.tensorflow.keras as hvd_k\n        return "
        "hvd_k.DistributedOptimizer(\n",
    ),
    # SyncBatchNormalization on Keras 3 too
    (
        "horovod/tensorflow/sync_batch_norm.py",
        "class SyncBatchNormalization(tf.keras.layers.BatchNormalization):\n",
        _SYNC_BN_KERAS,
    ),
    (
        "horovod/tensorflow/sync_batch_norm.py",
        "    super(SyncBatchNormalization, self).__init__(fused=fused, **kwargs)\n",
        "    super(SyncBatchNormalization, self).__init__(**({} if _TFPAR_KERAS_3 else {'fused': "
        "fused}), **kwargs)\n",
    ),
    (
        "horovod/tensorflow/sync_batch_norm.py",
        "  def _moments(self, inputs, reduction_axes, keep_dims, **kwargs):\n",
        "  def _moments(self, inputs, *args, **kwargs):  # tfpar: (reduction_axes, keep_dims) or "
        "Keras 3's (mask)\n",
    ),
    (
        "horovod/tensorflow/sync_batch_norm.py",
        "      inputs, reduction_axes, keep_dims=keep_dims, **kwargs)\n",
        "      inputs, *args, **kwargs)\n",
    ),
    (
        "horovod/tensorflow/sync_batch_norm.py",
        "  def call(self, *args, **kwargs):\n    outputs = super(SyncBatchNormalization, "
        "self).call(*args, **kwargs)\n",
        "  # tfpar: named arguments: Keras 3 builds a layer from its call's first one, and passes "
        "`training`\n"
        "  # only to a call that names it.\n"
        "  def call(self, inputs, training=None, **kwargs):\n"
        "    outputs = super(SyncBatchNormalization, self).call(inputs, training=training, "
        "**kwargs)\n",
    ),
)
_REF_CALL = re.compile(r"\b(\w+)\.ref\(\)")
# (file, how many `<name>.ref()` it has): each becomes _tfpar_ref(<name>)
REF_PATCHES = (
    ("horovod/tensorflow/__init__.py", 11),
    ("horovod/tensorflow/gradient_aggregation.py", 5),
    ("horovod/tensorflow/gradient_aggregation_eager.py", 5),
)


def _added_source(module):
    with open(os.path.join(os.path.dirname(__file__), module), encoding="utf-8") as f:
        return f.read()


def patch_id() -> str:
    """A digest of every change: new patches, a new build (the cache entry and the build note
    carry it)."""
    changes = repr((PATCHES, REF_PATCHES)) + "".join(map(_added_source, ADDED_MODULES.values()))
    return hashlib.sha256(changes.encode()).hexdigest()[:12]


def _mismatch(what, path, found, version):
    return InstallError(
        f"expected {what} in {path}, found it {found} time(s). This command knows Horovod "
        f"{version}; check the file by hand before building another."
    )


def apply_patches(source_dir: str, version: str) -> list[str]:
    """Applies every change to the sdist extracted in ``source_dir``.

    Raises:
        InstallError: a change does not match exactly, naming the file and what it expected.
    """
    texts = {}

    def text(path):
        if path not in texts:
            with open(os.path.join(source_dir, path), encoding="utf-8") as f:
                texts[path] = f.read()
        return texts[path]

    for path, old, new in PATCHES:
        if text(path).count(old) != 1:
            raise _mismatch(f"{old.strip()!r} exactly once", path, text(path).count(old), version)
        texts[path] = text(path).replace(old, new)
    for path, count in REF_PATCHES:
        found = len(_REF_CALL.findall(text(path)))
        if found != count:
            raise _mismatch(f"`<name>.ref()` {count} times", path, found, version)
        texts[path] = _REF_CALL.sub(r"_tfpar_ref(\1)", text(path))
    for path, patched in texts.items():  # written once every change matched
        with open(os.path.join(source_dir, path), "w", encoding="utf-8") as f:
            f.write(patched)
    for path, module in ADDED_MODULES.items():
        with open(os.path.join(source_dir, path), "w", encoding="utf-8") as f:
            f.write(_added_source(module))
    return sorted(texts)
