"""Keras callbacks for tuning and guarding distributed runs (tf_keras)."""

from tfpar.callbacks.decay import cosine_decay, exponential_decay, step_decay
from tfpar.callbacks.fault_tolerance import FaultTolerance
from tfpar.callbacks.heartbeat import Heartbeat
from tfpar.callbacks.learning_rate import (
    SCALING_RULES,
    LearningRateSchedule,
    LearningRateWarmup,
    scaled_learning_rate,
)
from tfpar.callbacks.monitoring import MetricAverage, NaNGuard, Throughput
from tfpar.callbacks.pipeline import PipelineBubble
from tfpar.callbacks.timeline import Timeline

__all__ = [
    "SCALING_RULES",
    "FaultTolerance",
    "Heartbeat",
    "LearningRateSchedule",
    "LearningRateWarmup",
    "MetricAverage",
    "NaNGuard",
    "PipelineBubble",
    "Throughput",
    "Timeline",
    "cosine_decay",
    "exponential_decay",
    "scaled_learning_rate",
    "step_decay",
]
