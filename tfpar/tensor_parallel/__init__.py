"""Tensor parallelism: a Keras model's planned layers split over devices, Megatron-LM style.

`plan` (which layer is split in which style, as data: no TensorFlow), `ops` (the conjugate
communication operators), `layers` (the split layers), `model` (`TensorParallelModel`: the split
model Keras trains) and `sharding` (`TensorParallel`, `TensorParallelConfig`: the plan, the degree
and the devices).

Like the pipeline, tensor parallelism is not a ``tf.distribute.Strategy``: it places each part of a
layer itself, in this process, and offers the same small protocol (`tfpar._parallelism`).
"""

from tfpar._lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "STYLES": "tfpar.tensor_parallel.plan",
        "TensorParallel": "tfpar.tensor_parallel.sharding",
        "TensorParallelConfig": "tfpar.tensor_parallel.sharding",
        "TensorParallelModel": "tfpar.tensor_parallel.model",
    },
)
