"""Pipeline parallelism: a tf_keras model cut into stages over devices, fed microbatches.

`schedule` (GPipe and 1F1B as plain data, no TensorFlow), `partition` (where
to cut) and `model` (`Pipeline`, `PipelineModel`: the Keras side).
"""

import importlib

_LAZY = {"Pipeline": "model", "PipelineConfig": "model", "PipelineModel": "model"}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"tfpar.strategies.pipeline.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'tfpar.strategies.pipeline' has no attribute {name!r}")
