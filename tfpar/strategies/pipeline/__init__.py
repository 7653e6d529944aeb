"""Pipeline parallelism: a tf_keras model cut into stages over devices, fed microbatches.

`schedule` (GPipe and 1F1B as plain data, no TensorFlow), `partition` (where
to cut) and `model` (`Pipeline`, `PipelineModel`: the Keras side).
"""

from tfpar._lazy import exports

__getattr__, __dir__, __all__ = exports(__name__, dict.fromkeys(
    ("Pipeline", "PipelineConfig", "PipelineModel"), "tfpar.strategies.pipeline.model"))
