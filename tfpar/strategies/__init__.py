"""tfpar's strategies: real `tf.distribute.Strategy` objects, and the pipeline.

`HorovodStrategy` lives in `tfpar.strategies.horovod` (imported on use, as it
needs Horovod); `auto()` picks it under horovodrun. Names load on first use,
so that pure modules such as `tfpar.strategies.pipeline.schedule` import
without TensorFlow.
"""

import importlib

_LAZY = {
    "auto": "tfpar.strategies.auto",
    "DataParallel": "tfpar.strategies.data_parallel",
    "DataParallelConfig": "tfpar.strategies.data_parallel",
    "MirroredDataParallel": "tfpar.strategies.data_parallel",
    "MultiWorkerDataParallel": "tfpar.strategies.data_parallel",
    "ParameterServer": "tfpar.strategies.parameter_server",
    "ParameterServerConfig": "tfpar.strategies.parameter_server",
    "Pipeline": "tfpar.strategies.pipeline.model",
    "PipelineConfig": "tfpar.strategies.pipeline.model",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfpar.strategies' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *__all__])
