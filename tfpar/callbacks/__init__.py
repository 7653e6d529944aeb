"""Keras callbacks for tuning and guarding distributed runs (tf_keras)."""

from tfpar.callbacks.learning_rate import LearningRateSchedule, LearningRateWarmup

__all__ = ["LearningRateSchedule", "LearningRateWarmup"]
