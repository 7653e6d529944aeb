"""Keras callbacks for tuning and guarding distributed runs (tf_keras)."""

from tfpar.callbacks.learning_rate import LearningRateSchedule, LearningRateWarmup
from tfpar.callbacks.pipeline import PipelineBubble

__all__ = ["LearningRateSchedule", "LearningRateWarmup", "PipelineBubble"]
