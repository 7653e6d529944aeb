"""What a `DataParallel` is made of beyond TensorFlow's strategies: their extendeds with tfpar's
gradient reduction mixed in (`tfpar.strategies._gradients`), and the collective keys that keep
several strategies of one process apart."""

import itertools

from tfpar import _compat
from tfpar.strategies._gradients import GradientReduction

__all__ = ["KEY_BASES", "MultiWorkerExtended", "OneHostExtended"]

KEY_BASES = itertools.count(100_000, 100_000)
"""Each DataParallel's collective keys: they must not repeat between strategies of one process. Two
MirroredStrategy objects both start at group key 1 and the second one's all-reduce meets the first
one's tensors ("Shape mismatch in the collective instance"); two MultiWorkerMirroredStrategy ones
meet a broadcast where a reduction was expected. TensorFlow's own tests shift the base by 100000
per strategy. Every worker of a job makes its strategies in the same order, so their keys agree."""


class OneHostExtended(GradientReduction, _compat.MirroredExtended):
    """MirroredStrategy's extended, with `DataParallelConfig`'s gradient compression and
    accumulation."""


class MultiWorkerExtended(GradientReduction, _compat.CollectiveAllReduceExtended):
    """MultiWorkerMirroredStrategy's extended, with the same. A second one in a process of the same
    cluster (``tfpar verify --paths``: a strategy per path) keeps the server the first started."""

    def __init__(self, container_strategy, config, **kwargs):
        _compat.keep_started_collective_server(self, kwargs["cluster_resolver"])
        super().__init__(container_strategy, config, **kwargs)
