"""tfpar: distributed training for tf_keras models.

Importing tfpar before TensorFlow makes ``tf.keras`` the Keras 2 API
(tf_keras), which ParameterServerStrategy in ``fit``,
tensorflow-model-optimization and Horovod need (see `tfpar._keras`). The
package itself loads TensorFlow only when a name that needs it is first used,
so ``tfpar launch`` starts at once.

Examples:
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

# Every strategy, and every exception the documentation names, under `tfpar` too (each also where
# it is defined: tfpar.strategies, tfpar.pipeline, tfpar.tensor_parallel, tfpar.devices,
# tfpar.quantization).
__getattr__, __dir__, __all__ = _exports(
    __name__,
    {
        "ClusterInfo": "tfpar.cluster",
        "DataParallel": "tfpar.strategies",
        "HorovodStrategy": "tfpar.strategies",
        "ParameterServer": "tfpar.strategies",
        "Pipeline": "tfpar.pipeline",
        "TensorParallel": "tfpar.tensor_parallel",
        "AccuracyDropError": "tfpar.quantization",
        "ClusterUnreachableError": "tfpar.strategies",
        "DevicesAlreadyInitializedError": "tfpar.devices",
        "ParameterServerLostError": "tfpar.strategies",
        "check_tf_keras_model": "tfpar._keras",
        "configure_devices": "tfpar.devices",
        "keras": "tfpar._keras",
        "local_devices": "tfpar.devices",
        # submodules
        **dict.fromkeys(
            (
                "callbacks",
                "cluster",
                "data",
                "demo",
                "devices",
                "doctor",
                "integrations",
                "launch",
                "optimizers",
                "pipeline",
                "precision",
                "quantization",
                "remat",
                "report",
                "strategies",
                "tensor_parallel",
                "tune",
                "verify",
            )
        ),
    },
)

from tfpar._tasks.env import ELASTIC_VARIABLE as _ELASTIC
from tfpar._tasks.env import HEARTBEAT_VARIABLE as _HEARTBEAT
from tfpar._tasks.env import TIMELINE_VARIABLE as _TIMELINE

# a task of `tfpar launch` with those options
if os.environ.get(_HEARTBEAT) or os.environ.get(_TIMELINE):

    def _launched(method):
        def add(model, arguments):
            from tfpar.callbacks._launched import add_launch_callbacks

            add_launch_callbacks(model, arguments, method)

        return add

    from tfpar import _owned

    for _method in ("fit", "evaluate", "predict"):
        _owned.add_process_check(_method, "before", _launched(_method))


def _elastic_fit(model, arguments):
    """Before the ``fit`` of a model tfpar owns, in a worker of an elastic `tfpar launch` (read at
    each fit: a test sets it in-process): every size the job may have takes the batch; under
    ``--elastic-batch scale-lr`` the learning rate follows the global batch."""
    if os.environ.get(_ELASTIC):
        from tfpar.callbacks.elastic_rate import elastic_learning_rate
        from tfpar.data.resume import check_elastic_batch

        check_elastic_batch(model, arguments)
        elastic_learning_rate(model, arguments)


from tfpar import _owned as _owned_models  # noqa: E402

_owned_models.add_process_check("fit", "before", _elastic_fit)
