"""A step's timing: when each of its instructions started and ended, read from the timestamps the
step takes, into the model's ``pipeline_timing`` (the mean stage busy time and the step's span,
summed over steps) and ``device_trace`` (the last step's instructions, for
`tfpar.callbacks.Timeline`)."""

from typing import Any

from tfpar._keras import tf

__all__ = ["record_timing"]


def record_timing(model: Any, step_start: Any, done: dict) -> None:
    """Adds this step's mean stage busy time and its span to ``model.pipeline_timing``, and
    writes its instructions' (start, end) into ``model.device_trace``.

    One timestamp per instruction, taken when its results exist (``done``: (replica,
    instruction) -> its results). Timestamps are stateful ops, which a tf.function runs in
    program order, so they are created in the order the schedule expects the instructions to
    end, and an instruction's start is inferred: the later of the step's start, the end of the
    stage's previous instruction and the end of its dependency. The stage devices of one host
    share one clock.
    """
    spans = model._timeline.spans
    ends = {}
    for key in sorted(done, key=lambda key: (spans[key[1]][1], key[0], key[1].stage)):
        with tf.control_dependencies(done[key]):
            ends[key] = tf.timestamp()
    busy = []
    previous: dict = {}
    starts: dict = {}
    for replica, instruction in sorted(
        done, key=lambda key: (key[0], spans[key[1]][0], key[1].stage)
    ):
        candidates = [step_start]
        device = model.schedule.stage_of(instruction.stage)
        if (replica, device) in previous:
            candidates.append(ends[previous[(replica, device)]])
        dependency = instruction.dependency(len(model.stages))
        if dependency is not None:
            candidates.append(ends[(replica, dependency)])
        key = (replica, instruction)
        starts[key] = tf.reduce_max(tf.stack(candidates))
        busy.append(ends[key] - starts[key])
        previous[(replica, device)] = key
    mean_busy = tf.add_n(busy) / (model.schedule.num_stages * len(model.grid))
    span = tf.reduce_max(tf.stack(list(ends.values()))) - step_start
    model.pipeline_timing.assign_add(tf.stack([mean_busy, span]))
    model.device_trace.assign(
        tf.stack([tf.stack([starts[key], ends[key]]) for key in model._trace_keys()])
    )
