"""tfpar: distributed training for tf_keras models.

Importing tfpar before TensorFlow makes ``tf.keras`` the Keras 2 API
(tf_keras), which ParameterServerStrategy in ``fit``,
tensorflow-model-optimization and Horovod need (see `tfpar._keras`). The
package itself loads TensorFlow only when a name that needs it is first used,
so ``tfpar launch`` starts at once.

Example:
    >>> import tfpar
    >>> tfpar.configure_devices(2)  # doctest: +SKIP
    >>> strategy = tfpar.DataParallel()  # doctest: +SKIP
"""

import os
import sys

# What the environment said before the line below: the Keras a script that does not import tfpar
# gets here (`tfpar doctor` reports it).
_SHELL_TF_USE_LEGACY_KERAS = os.environ.get("TF_USE_LEGACY_KERAS")
if "tensorflow" not in sys.modules:  # the Keras choice of tfpar._keras, made before any import
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = "0.1.0"

from tfpar._lazy import exports as _exports

__getattr__, __dir__, __all__ = _exports(__name__, {
    "ClusterInfo": "tfpar.cluster",
    "DataParallel": "tfpar.strategies",
    "check_tf_keras_model": "tfpar._keras",
    "configure_devices": "tfpar.devices",
    "keras": "tfpar._keras",
    "local_devices": "tfpar.devices",
    **dict.fromkeys(("callbacks", "cluster", "data", "devices", "integrations", "launch", "pipeline", "precision",
                     "quantization", "strategies", "tune")),  # submodules
})
