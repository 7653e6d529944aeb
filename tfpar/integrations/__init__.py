"""tfpar inside other engines' training loops: `ray` (Ray Train's TensorflowTrainer) and `horovod`
(the input of Horovod's elastic API). Each integration loads on first use and imports its engine
only when called."""

from tfpar._lazy import exports

__getattr__, __dir__, __all__ = exports(__name__, {"horovod": None, "ray": None})
