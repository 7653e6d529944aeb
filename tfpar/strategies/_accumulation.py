"""Gradient accumulation inside a step, as the strategies' extendeds run it: each replica's
gradients summed into buffers on its device over N optimizer calls, their averages all-reduced at
every N-th (`GradientAccumulator`), and the optimizer's variable updates, its step counter included,
made at those boundaries only (`AccumulatedUpdates`). `fit`'s view of the same windows is
`tfpar.strategies._windows`."""

from tfpar import _compat
from tfpar._keras import inner_optimizer, tf

__all__ = ["AccumulatedUpdates", "GradientAccumulator"]


class GradientAccumulator:
    """Local gradient accumulation over N steps, as Horovod's backward_passes_per_step.

    Every step adds each replica's gradients to buffers on its device; every N-th step the
    buffers' averages are all-reduced, the optimizer applies them, and the buffers are cleared.
    On the other steps nothing is sent and the optimizer's variable updates are skipped, its
    ``iterations`` included (`count_updates`): it counts updates, as Keras 3's own accumulation's
    ``iterations``, PyTorch's and DeepSpeed's optimizer steps do, so that Adam's bias correction and
    a learning-rate schedule see one step of N times the batch. (Horovod's backward_passes_per_step
    counts every step: Adam then trains otherwise than on the N-times batch.)
    """

    def __init__(self, steps):
        self.steps = steps
        self._buffers = {}
        self._counter = self._start = None
        self.boundary = None  # the current step's "apply now" flag, while tracing it
        self.targets = set()  # refs of the variables that flag governs
        self.counters = set()  # refs of the optimizers' step counters, which it governs too

    def _buffer(self, var, device):
        key = (var.ref(), device)
        if key not in self._buffers:
            # ResourceVariable(...) bypasses the strategy's variable creator: these buffers are this
            # replica's own, never mirrored or broadcast.
            with tf.init_scope(), tf.device(device):
                self._buffers[key] = _compat.ResourceVariable(
                    tf.zeros(var.shape, var.dtype), trainable=False, name="tfpar_grad_accumulator"
                )
        return self._buffers[key]

    def counter(self):
        """The calls counted so far (a variable, made at the first use)."""
        if self._counter is None:
            with tf.init_scope():
                self._counter = _compat.ResourceVariable(
                    tf.constant(0, tf.int64), trainable=False, name="tfpar_accumulation_step"
                )
                self._start = _compat.ResourceVariable(
                    tf.constant(0, tf.int64), trainable=False, name="tfpar_accumulation_step_start"
                )
        return self._counter

    def begin_step(self):
        """Cross-replica, before a step of several calls (an elastic job's micro-batches): notes the
        count."""
        counter = self.counter()
        return self._start.assign(counter)

    def settle(self, calls):
        """Cross-replica, after that step: a loss scale that skipped one of its calls (Keras 3 does
        not reduce the gradients it finds non-finite) left the count short, which would shift every
        later boundary, so the window is dropped (its buffers cleared, the count back to its start)
        as a skipped update is. A count that did not move at all is left: no call reduced here (ZeRO
        accumulates in its own buffers), or the loss scale skipped every call. Returns whether it
        was dropped."""
        counter = self.counter()
        counted = counter - self._start

        def drop():
            cleared = [b.assign(tf.zeros_like(b)) for b in self._buffers.values()]
            with tf.control_dependencies(
                cleared + [counter.assign(self._start - self._start % self.steps)]
            ):
                return tf.constant(True)

        short = tf.logical_and(counted > 0, counted < calls)
        return tf.cond(short, drop, lambda: tf.constant(False))

    def reduce(self, per_device_grads, variables, devices, allreduce):
        """Accumulates ``per_device_grads`` (one list per device, in ``variables``' order).

        ``allreduce(per_device_averages)`` reduces the averaged buffers (one list per device) and
        returns the reduced tensors flat, device-major. Returns those tensors at a boundary, zeros
        of the same structure on the other steps.
        """
        buffers = [[self._buffer(v, d) for v in variables] for d in devices]
        added = []
        for device, device_buffers, grads in zip(devices, buffers, per_device_grads):
            with tf.device(device):
                added += [
                    b.assign_add(tf.convert_to_tensor(g)) for b, g in zip(device_buffers, grads)
                ]
        with tf.control_dependencies(added):
            step = self.counter().assign_add(1)
        boundary = tf.equal(step % self.steps, 0)
        flat = [b for device_buffers in buffers for b in device_buffers]

        def reduce_and_clear():
            averages = []
            for device, device_buffers in zip(devices, buffers):
                with tf.device(device):
                    averages.append([b.read_value() / self.steps for b in device_buffers])
            reduced = allreduce(averages)
            with tf.control_dependencies(reduced):
                cleared = [b.assign(tf.zeros_like(b)) for b in flat]
            with tf.control_dependencies(cleared):
                return [tf.identity(r) for r in reduced]

        self.boundary = boundary
        self.targets = {v.ref() for v in variables}
        return tf.cond(boundary, reduce_and_clear, lambda: [tf.zeros_like(b) for b in flat])

    def count_updates(self, optimizer):
        """``optimizer``'s ``iterations`` (those of the one a loss-scale optimizer wraps, which both
        Kerases' ``iterations`` name and which counts where the gradients are reduced) move at the
        boundaries only."""
        counter = inner_optimizer(optimizer).iterations
        if not isinstance(counter, tf.Variable):
            counter = counter.value  # Keras 3 wraps a tf.Variable
        self.counters.add(counter.ref())

    def governs(self, var):
        """Whether the update of ``var`` is skipped between boundaries: in the step that set the
        boundary only (not in a function traced later, a checkpoint's restore, nor in an
        assignment after an eager step)."""
        if self.boundary is None:
            return False
        if tf.is_symbolic_tensor(self.boundary):
            within = _traced_within(self.boundary.graph)
        else:  # an eager step (run_eagerly): until its last update (`step_done`)
            within = tf.executing_eagerly()
        return within and (var.ref() in self.targets or var.ref() in self.counters)

    def step_done(self, var):
        """After the update of ``var``: in an eager step the optimizer's step counter is the
        step's last update, so the step's boundary is let go."""
        if var.ref() in self.counters and not tf.is_symbolic_tensor(self.boundary):
            self.boundary = None


def _traced_within(graph):
    """Whether the function being traced is ``graph`` or one nested in it (a branch of a cond)."""
    current = tf.compat.v1.get_default_graph()
    while current is not None and current is not graph:
        current = getattr(current, "outer_graph", None)
    return current is graph


class AccumulatedUpdates:
    """Mixed into a MirroredExtended with an ``_accumulator`` (a `GradientAccumulator` or None):
    the optimizer's updates of the variables it governs run at its boundaries only."""

    def _update(self, var, fn, args, kwargs, group):
        accumulator = self._accumulator
        if accumulator is None or not accumulator.governs(var):
            return super()._update(var, fn, args, kwargs, group)

        def apply():
            super(AccumulatedUpdates, self)._update(var, fn, args, kwargs, group=True)
            return tf.constant(True)

        applied = tf.cond(accumulator.boundary, apply, lambda: tf.constant(False))
        accumulator.step_done(var)
        return applied
