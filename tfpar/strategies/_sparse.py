"""Sparse gradients (``tf.IndexedSlices``: an ``Embedding``'s, a ``tf.gather``'s) on tfpar's
gradient paths.

A sparse gradient holds one row of values per lookup, duplicates included. TensorFlow's strategies
and Horovod reduce it by gathering every replica's rows (no arithmetic on the wire), and the
optimizer then sums the duplicates, in float32. tfpar's paths keep that:

- compression sends the rows in 16 bits and their indices as they are (`to_wire`, `from_wire`);
  bf16 rows travel as their bits in a 16-bit type the engine's gather takes (TensorFlow's
  collective gather and Horovod's allgather take no bf16), and are float32 again before the
  optimizer sums them;
- ZeRO's chunks hold dense elements, so a replica sums its rows into the variable's shape before
  the reduce-scatter (`dense`). That is what tf_keras' optimizers see (they sum duplicates before
  their update). Keras 3's Adam does not: it squares each row before duplicates are summed, so its
  second moment takes, per element, the sum over lookups of the squared row, not the square of the
  summed gradient; and both Kerases' ``global_clipnorm`` counts each row's square. ZeRO then also
  reduce-scatters those sums of squares (`row_squares`) and uses them where the optimizer would.
"""

from tfpar._keras import tf

__all__ = ["WIRE_DTYPES", "dense", "from_wire", "is_sparse", "row_squares", "to_wire"]

WIRE_DTYPES = {"bf16": tf.bfloat16, "fp16": tf.float16}
"""A compression's dtype on the wire."""


def is_sparse(gradient) -> bool:
    """Whether ``gradient`` is a sparse one (rows of values at indices)."""
    return isinstance(gradient, tf.IndexedSlices)


def to_wire(gradient, compression, carrier=tf.float16):
    """A float32 sparse ``gradient`` with its values in ``compression``'s 16 bits, its indices as
    they are; bf16 values as their bits in a ``carrier`` tensor (a 16-bit type the engine's gather
    takes)."""
    values = tf.cast(gradient.values, WIRE_DTYPES[compression])
    if values.dtype == tf.bfloat16:
        values = tf.bitcast(values, carrier)
    return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)


def from_wire(gradient, compression, dtype):
    """`to_wire`'s result, gathered, with its values back in ``dtype``."""
    values = gradient.values
    if compression == "bf16" and values.dtype != tf.bfloat16:
        values = tf.bitcast(values, tf.bfloat16)
    return tf.IndexedSlices(tf.cast(values, dtype), gradient.indices, gradient.dense_shape)


def dense(gradient, shape):
    """``gradient`` as a dense tensor of ``shape`` (a sparse one's duplicate rows summed)."""
    if not is_sparse(gradient):
        return tf.reshape(tf.convert_to_tensor(gradient), shape)
    rows = int(shape[0])
    return tf.reshape(tf.math.unsorted_segment_sum(gradient.values, gradient.indices, rows), shape)


def row_squares(gradient, shape):
    """Per element of a variable of ``shape``, the sum over a sparse ``gradient``'s rows of their
    squares; for a dense gradient, whose square is taken after the reduction, -1 (a sum of squares
    is never negative: `tfpar.strategies._zero_rules.squared` reads the sign). The -1 is made from
    the gradient, not filled from a number: Grappler would fold such a fill into a constant the
    step's function holds between steps."""
    if not is_sparse(gradient):
        return tf.minimum(tf.abs(tf.cast(gradient, tf.float32)), -1.0)
    squares = tf.square(tf.cast(gradient.values, tf.float32))
    return tf.reshape(tf.math.unsorted_segment_sum(squares, gradient.indices, int(shape[0])), shape)
