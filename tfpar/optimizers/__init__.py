"""Optimizers for large global batches: LARS and LAMB, for both Kerases
(`tfpar.optimizers.layerwise`).

The learning-rate scaling rules that go with them (linear, square root, warm-up) are
`tfpar.callbacks.scaled_learning_rate` and `tfpar.callbacks.LearningRateWarmup`.
"""

from tfpar.optimizers.layerwise import LAMB, LARS

__all__ = ["LAMB", "LARS"]
