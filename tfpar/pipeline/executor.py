"""The pipeline executor: one replica's training step, built instruction by instruction in the
schedule's order (`schedule.py`), each on its chunk's stage device.

Each instruction kind has its method (`ReplicaStep.forward`, `backward`, `weight`), which the
executor dispatches to. A forward keeps its tape for the backward, which passes the input
gradient on to the previous chunk and adds the variables' gradients to the chunk's running sum
(so that no more than one microbatch's gradients are held besides the sum). A zero-bubble
schedule splits that backward in two: B takes the input gradient only, W later the variables'
gradients. In a chunk that is a chain of layers, each layer's forward has its own tape, so B
runs the input-gradient chain once and W each layer's weight gradient from its saved output
gradient; in any other chunk (or with ``recompute``) both are calls of one persistent tape of
the whole chunk.
"""

import logging
from collections.abc import Sequence
from typing import Any

from tfpar import _compat
from tfpar._keras import tf
from tfpar.pipeline.streams import BACKWARD, FORWARD, WEIGHT
from tfpar.remat._blocks import why_kept
from tfpar.remat._recompute import floats, state_of
from tfpar.remat._recompute import recompute as recomputed_call

__all__ = [
    "ReplicaStep",
    "add_gradients",
    "chain_layers",
    "recomputed",
    "run_replica",
    "run_stage",
]

_log = logging.getLogger(__name__)


def add_gradients(a: Any, b: Any) -> Any:
    """The sum of two gradients of one variable. An embedding's come as IndexedSlices: their sum
    is their rows together (as TensorFlow sums them), so the optimizer sees the sparse gradient the
    plain model's would (Keras 3 updates the slots of the rows a sparse gradient touches only)."""
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(
            tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0), a.dense_shape
        )
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def chain_layers(stage: Any, keras_module: Any) -> list | None:
    """The layers of a chunk in order if each takes the previous one's output only (else None:
    several inputs or calls, or a chunk that is not a functional graph)."""
    if not _compat.is_graph_network(stage) or len(stage.inputs) != 1 or len(stage.outputs) != 1:
        return None
    layers = [
        layer for layer in stage.layers if not isinstance(layer, keras_module.layers.InputLayer)
    ]
    previous = stage.inputs[0]
    for layer in layers:
        try:
            if layer.input is not previous:
                return None
        except (AttributeError, ValueError):  # several inputs or calls
            return None
        previous = layer.output
    return layers if previous is stage.outputs[0] else None


def run_replica(
    model: Any,
    replica: int,
    xs: Sequence,
    ys: Sequence,
    weights: Sequence | None,
    predictions: dict,
    sums: dict,
    done: dict,
    losses: list,
) -> None:
    """Builds replica ``replica``'s schedule on its devices. Each stage runs its instructions in the
    schedule's order (a control dependency on what the previous one made); ``done`` gets, per
    (replica, instruction), the tensors that instruction's end is read from."""
    step = ReplicaStep(model, replica, xs, ys, weights, predictions, sums, losses)
    kinds = {FORWARD: step.forward, BACKWARD: step.backward, WEIGHT: step.weight}
    last_on: dict = {}  # stage -> what its last instruction made
    for instruction in model._order:
        k, i = instruction.stage, instruction.microbatch
        stage = model.schedule.stage_of(k)
        with (
            tf.device(model._device(replica, k)),
            model._placement(replica, k),
            tf.control_dependencies(last_on.get(stage, [])),
        ):
            last_on[stage] = kinds[instruction.kind](k, i)
        done[(replica, instruction)] = last_on[stage]


class ReplicaStep:
    """What one replica's instructions hand each other while its step is built."""

    def __init__(
        self,
        model: Any,
        replica: int,
        xs: Sequence,
        ys: Sequence,
        weights: Sequence | None,
        predictions: dict,
        sums: dict,
        losses: list,
    ) -> None:
        self.model, self.replica = model, replica
        self.xs, self.ys, self.weights = xs, ys, weights
        self.predictions, self.sums, self.losses = predictions, sums, losses
        self.last = len(model.stages) - 1  # the chunk that computes the loss
        self.split = model.schedule.splits_backward
        m = model.schedule.num_microbatches
        # Every microbatch has batch / (m × replicas × workers) examples, and the gradients are
        # summed.
        self.scale = 1.0 / (m * len(model.grid) * model.num_workers)
        self.saved: dict = {}
        self.upstream: dict = {}
        self.pending: dict = {}

    def _index(self, i):
        return self.replica * self.model.schedule.num_microbatches + i

    def _inputs(self, k, i):
        if k == 0:
            return self.xs[self._index(i)]
        return tf.nest.map_structure(tf.identity, self.saved[(k - 1, i)][1])

    def _loss(self, outputs, i):
        """The microbatch's loss (kept for the metric) and its prediction, from the last chunk."""
        j = self._index(i)
        loss = self.model._microbatch_loss(self.ys[j], outputs, self.weights[j])
        self.predictions[j] = outputs
        self.losses.append(loss)
        return loss

    # --- F ---
    def forward(self, k: int, i: int) -> list:
        inputs = self._inputs(k, i)
        if self.model._chains[k] is not None:  # zero-bubble, layer by layer
            pieces, head = self._forward_layers(k, inputs), None
            outputs = pieces[-1][3]
            if k == self.last:
                with tf.GradientTape() as head_tape:
                    head_tape.watch(outputs)
                    head = (head_tape, [self.model._scaled(self._loss(outputs, i) * self.scale)])
            self.saved[(k, i)] = (pieces, outputs, inputs, head)
            return [outputs]
        with tf.GradientTape(persistent=self.split) as tape:
            if k > 0:
                tape.watch(floats(inputs))
            outputs = run_stage(self.model.stages[k], inputs, self.model._recompute[k])
            objective = floats(outputs)
            if k == self.last:
                # The loss (and its metric) includes every stage's regularization, as the plain
                # model's does; the gradient here reaches only this stage's variables: the other
                # stages get theirs from their own term below.
                objective = [self.model._scaled(self._loss(outputs, i) * self.scale)]
            elif self.model.stages[k].losses:
                objective.append(
                    self.model._scaled(tf.add_n(self.model.stages[k].losses) * self.scale)
                )
        self.saved[(k, i)] = (tape, outputs, inputs, objective)
        return tf.nest.flatten(outputs)

    def _forward_layers(self, k, inputs):
        """A chain chunk's forward, one persistent tape per layer: [(layer, tape, input, output,
        regularization terms)]."""
        pieces, x = [], inputs
        for layer in self.model._chains[k]:
            with tf.GradientTape(persistent=True) as tape:
                tape.watch(x)
                y = layer(x, training=True)
                terms = (
                    [self.model._scaled(tf.add_n(layer.losses) * self.scale)]
                    if layer.losses
                    else []
                )
            pieces.append((layer, tape, x, y, terms))
            x = y
        return pieces

    # --- B ---
    def backward(self, k: int, i: int) -> list:
        if self.model._chains[k] is not None:  # B, layer by layer
            pieces, outputs, inputs, head = self.saved.pop((k, i))
            if head is not None:
                gradient = head[0].gradient(head[1], outputs)
            else:
                gradient = self.upstream.pop((k + 1, i))[0]  # a chain's input is one tensor
            self.pending[(k, i)], gradient = _backward_layers(pieces, gradient, needs_input=k > 0)
            if k > 0:
                self.upstream[(k, i)] = [gradient]
                return [gradient]
            return [self.pending[(k, i)][-1][1]]  # chunk 0: its last B
        tape, outputs, inputs, objective = self.saved.pop((k, i))
        output_gradients = self._output_gradients(objective, k, i)
        if self.split:  # B: the input gradient only; W comes later
            self.pending[(k, i)] = (tape, objective, output_gradients)
            if k > 0:
                watched = floats(inputs)
                found = tape.gradient(objective, watched, output_gradients=output_gradients)
                self.upstream[(k, i)] = _zero_filled(found, watched)
                return self.upstream[(k, i)]
            return list(output_gradients or objective)
        variables = self.model.stages[k].trainable_variables
        watched = floats(inputs) if k > 0 else []
        result = tape.gradient(objective, variables + watched, output_gradients=output_gradients)
        if k > 0:
            self.upstream[(k, i)] = _zero_filled(result[len(variables) :], watched)
        grads = self._add(k, result[: len(variables)])
        return self.upstream[(k, i)] if k > 0 else grads

    def _output_gradients(self, objective, k, i):
        """What a chunk's backward starts from: the next chunk's input gradient (none for the last
        chunk, whose objective is the loss), and 1 for its regularization terms."""
        if k == self.last:
            return None
        upstream = list(self.upstream.pop((k + 1, i)))
        return upstream + [tf.ones_like(term) for term in objective[len(upstream) :]]

    # --- W ---
    def weight(self, k: int, i: int) -> list:
        if self.model._chains[k] is not None:  # W, layer by layer
            return self._add(k, self._weight_gradients(k, self.pending.pop((k, i))))
        tape, objective, output_gradients = self.pending.pop((k, i))
        return self._add(
            k,
            tape.gradient(
                objective,
                self.model.stages[k].trainable_variables,
                output_gradients=output_gradients,
            ),
        )

    def _weight_gradients(self, k, pairs):
        """W of a chain chunk: each layer's variables' gradients from its own tape and output
        gradient (and its regularization), in the order of the chunk's trainable variables."""
        found = {}
        for (layer, tape, x, y, terms), gradient in pairs:
            variables = layer.trainable_variables
            if variables:
                result = tape.gradient(
                    [y] + terms,
                    variables,
                    output_gradients=[gradient] + [tf.ones_like(t) for t in terms],
                )
                found.update((id(v), g) for v, g in zip(variables, result))
        return [found.get(id(v)) for v in self.model.stages[k].trainable_variables]

    def _add(self, k, result):
        """Adds a microbatch's gradients of chunk ``k`` to its running sum; returns them (the
        stage's next instruction waits for them, not for the sum: the additions run beside the
        pipeline)."""
        previous = self.sums.get((self.replica, k))
        self.sums[(self.replica, k)] = (
            result
            if previous is None
            else [
                a if g is None else g if a is None else add_gradients(a, g)
                for a, g in zip(previous, result)
            ]
        )
        return [g for g in result if g is not None]


def recomputed(stages: list, recompute: bool) -> list:
    """Per stage, whether it recomputes its activations: with ``recompute``, each stage but those
    whose recomputation would train another model (`tfpar.remat._blocks.why_kept`: an Embedding's
    gradient made dense, a tf_keras Dropout drawing again...); those are named in a warning, each
    with why."""
    reasons = {k: why_kept(stage) for k, stage in enumerate(stages) if recompute}
    kept = {k: why for k, why in reasons.items() if why}
    for k, why in kept.items():
        _log.warning("recompute kept: stage %d keeps its activations: %s.", k, why)
    return [recompute and k not in kept for k in range(len(stages))]


def run_stage(stage: Any, x: Any, recompute: bool) -> Any:
    """A chunk's forward in training; with ``recompute``, its activations are recomputed in the
    backward pass (`tfpar.remat._recompute`: from its floating-point inputs, with its state as the
    forward read it; only its floating-point outputs carry gradients)."""
    if not recompute:
        return stage(x, training=True)
    return recomputed_call(lambda inputs: stage(inputs, training=True), (x,), {}, state_of(stage))


def _zero_filled(gradients, tensors):
    """``gradients`` of ``tensors`` with zeros where a tensor had none (it did not reach the
    objective): the previous chunk's backward starts from them, and None there would mean ones."""
    return [tf.zeros_like(t) if g is None else g for g, t in zip(gradients, tensors)]


def _backward_layers(pieces, gradient, needs_input):
    """B of a chain chunk: from the gradient of its output back to its input's, layer by layer
    (input gradients only). Returns what W needs ((piece, its output gradient) pairs) and the
    input's gradient (None when ``needs_input`` is False: the model's input)."""
    pairs = []
    for position in range(len(pieces) - 1, -1, -1):
        layer, tape, x, y, terms = pieces[position]
        pairs.append((pieces[position], gradient))
        if position > 0 or needs_input:
            gradient = tape.gradient(y, x, output_gradients=gradient)
    return pairs, (gradient if needs_input else None)
