"""tfpar's strategies: real `tf.distribute.Strategy` objects (the pipeline is `tfpar.pipeline`).

`HorovodStrategy` lives in `tfpar.strategies.horovod`: Horovod itself is imported
only when one is built, and without it that says how to install it; `auto()` picks it
under horovodrun. Names load on first use, so that pure modules such as
`tfpar.pipeline.schedule` import without TensorFlow. (`auto` lives in the
private `_auto` module: a submodule named ``auto`` would replace the function on the
package once imported.)
"""

from tfpar._lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "auto": "tfpar.strategies._auto",
        "DataParallel": "tfpar.strategies.data_parallel",
        "DataParallelConfig": "tfpar.strategies.data_parallel",
        "MirroredDataParallel": "tfpar.strategies.data_parallel",
        "HorovodConfig": "tfpar.strategies.horovod",
        "HorovodStrategy": "tfpar.strategies.horovod",
        "MultiWorkerDataParallel": "tfpar.strategies.data_parallel",
        "ParameterServer": "tfpar.strategies.parameter_server",
        "ParameterServerConfig": "tfpar.strategies.parameter_server",
        "ParameterServerLostError": "tfpar.strategies._ps_failures",
        "ClusterUnreachableError": "tfpar.strategies._ps_failures",
    },
)
