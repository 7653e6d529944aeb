"""Pipeline parallelism: a Keras model (tf_keras or Keras 3) cut into stages over devices, fed
microbatches.

`schedule` (GPipe and 1F1B as plain data, no TensorFlow), `partition` (where
to cut), `config` (`PipelineConfig`: what to cut, where it runs), `staging` (`Pipeline`: the
model cut and placed) and `model` (`PipelineModel`: the staged model that runs the schedule).

The pipeline is not a ``tf.distribute.Strategy``, so it lives here rather than in
`tfpar.strategies`; it offers the same small protocol (`tfpar._parallelism`), so a
script written for a strategy runs on it unchanged.
"""

from tfpar._lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "Pipeline": "tfpar.pipeline.staging",
        "PipelineConfig": "tfpar.pipeline.config",
        "PipelineModel": "tfpar.pipeline.model",
    },
)
