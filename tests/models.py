"""Models and data shared by equivalence tests in this process and in child processes."""

import os

import numpy as np

import tfpar

keras = tfpar.keras


def equivalence_model(seed=1, k=keras):
    """Conv, Dense and an active Dropout whose mask does not depend on the batch.

    ``seed`` draws the initial weights; tests give worker/rank k != 0 another one, so that
    only the strategy's broadcast of worker 0's values makes them agree.

    A Dropout mask drawn per example differs between one device and several
    replicas by construction, so exact equality needs a mask shared across the
    batch (noise_shape) from a stateless seed: the same on every replica.
    Keras 3 (``k``) has no stateless Dropout whose mask one device and several replicas draw
    alike, so its variant has none.
    """
    k.utils.set_random_seed(seed)
    dropout = (
        [k.layers.Dropout(0.3, noise_shape=(1, 144), seed=3, rng_type="stateless")]
        if k is keras
        else []
    )
    return k.Sequential(
        [
            k.layers.Input((8, 8, 1)),
            k.layers.Conv2D(4, 3, activation="relu"),
            k.layers.Flatten(),
            *dropout,
            k.layers.Dense(16, activation="tanh"),
            k.layers.Dense(3),
        ]
    )


def equivalence_data(n=96):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 8, 8, 1)).astype("float32")
    y = rng.integers(0, 3, size=n)
    return x, y


def compile_for_equivalence(model, k=keras):
    model.compile(
        k.optimizers.SGD(0.1, momentum=0.9),
        k.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def pipeline_model(regularize=True, k=keras):
    """A Functional model with five cuttable layers (one L2-regularized) for pipeline tests, in
    Keras ``k``."""
    k.utils.set_random_seed(2)
    inputs = k.Input((8, 8, 1))
    h = k.layers.Conv2D(4, 3, activation="relu", name="conv")(inputs)
    h = k.layers.Flatten(name="flatten")(h)
    h = k.layers.Dense(
        16, activation="tanh", name="dense_a", kernel_regularizer="l2" if regularize else None
    )(h)
    h = k.layers.Dense(16, activation="tanh", name="dense_b")(h)
    outputs = k.layers.Dense(3, name="logits")(h)
    return k.Model(inputs, outputs, name="pipeline_model")


def max_weight_difference(a, b):
    return max(float(np.abs(u - v).max()) for u, v in zip(a.get_weights(), b.get_weights()))


def _inf_gradient_layer(k):
    """InfGradientOnOneReplica for Keras module ``k`` (tf_keras or Keras 3)."""

    class InfGradientOnOneReplica(k.layers.Layer):
        """Identity whose gradient is inf on replica ``replica`` of the first worker while
        ``trigger`` is true: one replica overflows. (Horovod ranks each hold replica 0 of their own
        strategy.)"""

        def __init__(self, trigger, first_worker=True, replica=0, **kwargs):
            super().__init__(**kwargs)
            self.trigger, self.first_worker, self.replica = trigger, first_worker, replica

        def call(self, inputs):
            import tensorflow as tf

            @tf.custom_gradient
            def identity(x):
                def grad(dy):
                    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
                    # The same ops on every worker (Horovod matches its reductions by op name).
                    bad = tf.logical_and(
                        tf.logical_and(tf.equal(replica, self.replica), self.trigger),
                        tf.constant(self.first_worker),
                    )
                    return tf.where(
                        bad, tf.fill(tf.shape(dy), tf.constant(float("inf"), dy.dtype)), dy
                    )

                return tf.identity(x), grad

            return identity(inputs)

    return InfGradientOnOneReplica


def overflow_model(trigger, first_worker=True, k=keras, replica=0):
    """Dense -> (inf gradient on one replica when triggered) -> Dense, float32 output, in Keras
    ``k``."""
    k.utils.set_random_seed(3)
    return k.Sequential(
        [
            k.layers.Input((6,)),
            k.layers.Dense(8, activation="tanh", name="first"),
            _inf_gradient_layer(k)(trigger, first_worker, replica, name="overflow"),
            k.layers.Dense(2, name="logits"),
            k.layers.Activation("linear", dtype="float32", name="out"),
        ]
    )


def _loss_scale(optimizer):
    """The current loss scale: ``loss_scale`` in tf_keras; ``dynamic_scale`` in Keras 3 (built at
    the first step, ``initial_scale`` before it)."""
    if hasattr(optimizer, "loss_scale"):
        return float(optimizer.loss_scale.numpy())
    return (
        float(np.asarray(optimizer.dynamic_scale))
        if optimizer.built
        else float(optimizer.initial_scale)
    )


def overflow_step(
    strategy, global_batch=8, first_worker=True, k=keras, replica=0, optimizer=None, after=1
):
    """Steps of the overflow model under ``strategy`` with mixed_float16: the first has an inf
    gradient on replica ``replica`` (of the first worker), ``after`` finite ones follow. Returns
    what each replica sees after the first step and after the others. ``optimizer(k)`` makes the
    optimizer (default SGD at 0.1)."""
    import tensorflow as tf

    import tfpar

    tfpar.precision.use("mixed_float16")
    try:
        with strategy.scope():
            trigger = tf.Variable(
                True, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
            )
            model = overflow_model(trigger, first_worker, k, replica)
            model.compile(
                optimizer(k) if optimizer else k.optimizers.SGD(0.1), k.losses.MeanSquaredError()
            )
        rng = np.random.default_rng(0)
        x = rng.normal(size=(global_batch, 6)).astype("float32")
        y = rng.normal(size=(global_batch, 2)).astype("float32")
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).repeat()
        before = [w.copy() for w in model.get_weights()]
        report = {"loss_scale": [_loss_scale(model.optimizer)]}
        model.fit(dataset, steps_per_epoch=1, epochs=1, verbose=0)
        after_skip = model.get_weights()
        report["loss_scale"].append(_loss_scale(model.optimizer))
        report["skipped"] = all(np.array_equal(a, b) for a, b in zip(before, after_skip))
        report["per_replica_equal"] = all(
            all(np.array_equal(v.values[0].numpy(), r.numpy()) for r in v.values)
            for v in model.trainable_variables
            if hasattr(v, "values")
        )
        trigger.assign(False)
        model.fit(dataset, steps_per_epoch=after, epochs=1, verbose=0)
        report["loss_scale"].append(_loss_scale(model.optimizer))
        report["updated"] = not all(
            np.array_equal(a, b) for a, b in zip(after_skip, model.get_weights())
        )
        report["optimizer"] = type(model.optimizer).__name__
        report["inner"] = type(model.optimizer.inner_optimizer).__name__
        report["sharded"] = hasattr(model, "_tfpar_zero")
        report["weights"] = [w.tolist() for w in model.get_weights()]  # compared element by element
        return report
    finally:
        tfpar.precision.use("float32")


def qat_model():
    """A small digits-shaped CNN for quantization tests (float32, Functional)."""
    keras.utils.set_random_seed(4)
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(8, 3, activation="relu", name="conv")(inputs)
    h = keras.layers.Flatten(name="flatten")(h)
    h = keras.layers.Dense(16, activation="relu", name="hidden")(h)
    return keras.Model(inputs, keras.layers.Dense(10, name="logits")(h), name="qat_model")


def digits_subset(n=512):
    from tfpar.demo import load_digits

    (x, y), (x_val, y_val) = load_digits()
    return x[:n], y[:n], x_val, y_val


def one_device_weights(examples=96, global_batch=16, epochs=2, lr=0.1, k=keras):
    """The equivalence model trained on one device: batches of ``global_batch`` in order, the
    last one short where ``examples`` does not divide. The reference for every strategy."""
    return one_device_model(
        examples, global_batch, epochs, k, lambda k: k.optimizers.SGD(lr, momentum=0.9)
    ).get_weights()


def one_device_model(examples, global_batch, epochs, k, optimizer):
    """`one_device_weights`' model, with the optimizer ``optimizer(k)`` (the biases excluded from an
    AdamW's decay, as `zero_optimizer` does)."""
    x, y = equivalence_data(examples)
    model = equivalence_model(k=k)
    model.compile(
        zero_optimizer(k, optimizer) if isinstance(optimizer, str) else optimizer(k),
        k.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(x, y, batch_size=global_batch, epochs=epochs, shuffle=False, verbose=0)
    return model


def load_arrays(path):
    """The arrays a script saved with ``np.savez(path, *arrays)``, in order."""
    with np.load(path) as data:
        return [data[key] for key in data.files]


def assert_started_from_worker_0(folder, workers=2):
    """Every worker's weights after creation under the strategy equal worker 0's, though each
    worker k != 0 drew other ones (``start_<k>.npz`` and ``local_start_<k>.npz`` in ``folder``)."""
    import os

    first = load_arrays(os.path.join(folder, "start_0.npz"))
    for k in range(1, workers):
        for a, b in zip(load_arrays(os.path.join(folder, f"start_{k}.npz")), first):
            np.testing.assert_array_equal(a, b)
        local = load_arrays(os.path.join(folder, f"local_start_{k}.npz"))
        assert any(not np.array_equal(a, b) for a, b in zip(local, first))


def write_id_files(folder, sizes):
    """TFRecord files of float ids 0, 1, ... (``sizes[i]`` in file i); returns (paths, reader)."""
    import tensorflow as tf

    paths, start = [], 0
    for i, size in enumerate(sizes):
        path = os.path.join(str(folder), f"part-{i}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for v in range(start, start + size):
                feature = {"id": tf.train.Feature(float_list=tf.train.FloatList(value=[v]))}
                writer.write(
                    tf.train.Example(
                        features=tf.train.Features(feature=feature)
                    ).SerializeToString()
                )
        start += size
        paths.append(path)
    return paths, read_id_file


def read_id_file(path):
    """The reader of `write_id_files`' files: (id as a 1-vector, id) examples."""
    import tensorflow as tf

    spec = {"id": tf.io.FixedLenFeature([1], tf.float32)}
    return tf.data.TFRecordDataset(path).map(
        lambda r: (lambda e: (e["id"], e["id"][0]))(tf.io.parse_single_example(r, spec))
    )


def keras_of_env():
    """The Keras a test script runs under: Keras 3 when $TFPAR_TEST_KERAS is "3", else tf_keras."""
    import importlib

    return importlib.import_module("keras") if os.environ.get("TFPAR_TEST_KERAS") == "3" else keras


def keras3_digits_model():
    """The demo's model in Keras 3 (a `tfpar tune` model_fn)."""
    import keras as keras3

    from tfpar.demo import build_model

    return build_model(keras3)


def digits_mlp():
    """A `tfpar tune` model_fn: a small MLP on the digits. Its step costs little more at a batch of
    1,024 than at 64, so the largest batch is by far the fastest per example, and the slowest to an
    accuracy."""
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )


def digits_ten_times():
    """A `tfpar tune` data_fn: the training digits ten times over (14,370 examples an epoch), so
    that an epoch holds enough steps of a large batch for its speed per example to show."""
    from tfpar.demo import digits_dataset

    return digits_dataset().repeat(10)


def sleeping_model():
    """A `tfpar tune` model_fn that records its process in $TFPAR_TEST_PID_DIR and never returns."""
    import time

    folder = os.environ["TFPAR_TEST_PID_DIR"]
    open(os.path.join(folder, str(os.getpid())), "w").close()
    time.sleep(600)


def assert_trained_together_like_one_device(folder, examples, workers=2):
    """The workers of a multiworker_train.py job (``folder``) started from worker 0's weights, end
    with identical weights, and those equal the equivalence model trained on one device."""
    import os

    assert_started_from_worker_0(folder, workers)
    trained = [load_arrays(os.path.join(folder, f"worker_{i}.npz")) for i in range(workers)]
    for arrays in zip(*trained, one_device_weights(examples)):
        for other in arrays[1:workers]:
            np.testing.assert_array_equal(arrays[0], other)
        np.testing.assert_allclose(arrays[0], arrays[-1], atol=1e-5, rtol=0)


def ps_sum_regression(strategy, examples):
    """The parameter-server scripts' job: Dense(1) learning ``sum(x)`` from ``examples`` random
    rows of 8, compiled under ``strategy`` (SGD 0.05, mse); returns (model, its tfpar.data input
    with global batch 32, built on each worker from a function)."""
    import tensorflow as tf

    import tfpar

    rng = np.random.default_rng(0)
    x = rng.random((examples, 8)).astype("float32")
    y = x.sum(1)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.05), "mse")
    return model, tfpar.data.distribute(
        lambda: tf.data.Dataset.from_tensor_slices((x, y)), strategy, 32
    )


def verify_model(kind="plain", k=keras):
    """A compiled model for `tfpar verify` tests: "plain" (Dense layers), "batchnorm" (a
    BatchNormalization after the first layer), "synchronized_batchnorm" (one with
    synchronized=True) or "dropout" (an unseeded Dropout there)."""
    middle = {
        "plain": [],
        "batchnorm": [k.layers.BatchNormalization()],
        "dropout": [k.layers.Dropout(0.3)],
        "synchronized_batchnorm": [k.layers.BatchNormalization(synchronized=True)],
    }[kind]
    model = k.Sequential(
        [
            k.layers.Input((8, 8, 1)),
            k.layers.Flatten(),
            k.layers.Dense(16, activation="relu"),
            *middle,
            k.layers.Dense(3),
        ]
    )
    model.compile(
        k.optimizers.SGD(0.1),
        k.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=["accuracy"],
    )
    return model


def verify_batchnorm_model():
    return verify_model("batchnorm")


def verify_synchronized_batchnorm_model():
    return verify_model("synchronized_batchnorm")


def process_strategy():
    """The strategy of a test script run in several processes, and this process' worker index:
    HorovodStrategy with --horovod on the command line (under horovodrun), else multi-worker
    DataParallel (under tfpar launch)."""
    import sys

    if "--horovod" in sys.argv:
        import horovod.tensorflow as hvd

        from tfpar.strategies.horovod import HorovodStrategy

        return HorovodStrategy(), hvd.rank()
    return tfpar.DataParallel(timeout_seconds=120), tfpar.ClusterInfo.from_tf_config().worker_index


def tensor_parallel_models(k=keras, examples=32):
    """name -> (model, inputs, labels, plan): an MLP, a transformer block (attention + MLP +
    LayerNorm + residuals, after an embedding so that its input has a gradient) and an embedding
    model, each with the plan that splits it (Keras ``k``)."""
    from tfpar.demo.tokens import TRANSFORMER_PLAN, token_data, transformer

    rng = np.random.default_rng(0)
    k.utils.set_random_seed(3)
    inputs = k.Input((8,))
    h = k.layers.Dense(16, activation="relu", name="up")(inputs)
    h = k.layers.Dropout(0.0, name="drop")(h)
    h = k.layers.Dense(8, name="down")(h)
    mlp = k.Model(inputs, k.layers.Dense(3, name="head")(h), name="mlp")
    ids = k.Input((5,), dtype="int32")
    e = k.layers.Embedding(12, 8, name="embed")(ids)
    embedding = k.Model(
        ids, k.layers.Dense(3, name="head")(k.layers.Flatten()(e)), name="embedding"
    )
    tokens, next_tokens = token_data(examples, vocab=16, length=6)
    return {
        "mlp": (
            mlp,
            rng.normal(size=(32, 8)).astype("float32"),
            rng.integers(0, 3, 32),
            {"up": "column", "down": "row"},
        ),
        "block": (
            transformer(k, vocab=16, length=6, dim=8, heads=4, blocks=1, seed=4),
            tokens,
            next_tokens,
            TRANSFORMER_PLAN,
        ),
        "embedding": (
            embedding,
            rng.integers(0, 12, (32, 5)).astype("int32"),
            rng.integers(0, 3, 32),
            {"embed": "vocab"},
        ),
    }


def case_model(layout, k, examples):
    """``(model, x, y)`` of a model-parallel case across workers: KerasHub's GPT-2 for a layout
    "gpt2..." (`tests.gradient_paths.keras_hub_task`, seed 0), else the transformer block of
    `tensor_parallel_models`."""
    if layout.startswith("gpt2"):
        from tests.gradient_paths import keras_hub_task

        k.utils.set_random_seed(0)
        return keras_hub_task("gpt2", examples)
    model, x, y, _ = tensor_parallel_models(k, examples)["block"]
    return model, x, y


def train_tensor_parallel_pair(name, degree, optimizer, k=keras, epochs=2, split=None):
    """The ``name`` model of `tensor_parallel_models` trained plain and split from the same weights:
    (plain weights, the split model's plain_model() weights, split model). ``split(model, plan)``
    makes the split model (default: `TensorParallel` over ``degree`` devices with the model's
    plan)."""
    from tfpar.tensor_parallel import TensorParallel

    model, x, y, plan = tensor_parallel_models(k)[name]
    initial = model.get_weights()
    split_model = (split or (lambda m, p: TensorParallel(degree=degree, plan=p).shard(m)))(
        model, plan
    )

    def compiled(m):
        # Adam's rate is kept small: it divides each gradient by its own size, so round-off in a
        # near-zero gradient moves a weight by up to the rate, whichever order the sums ran in.
        opt = (
            k.optimizers.SGD(0.1, momentum=0.9) if optimizer == "sgd" else k.optimizers.Adam(0.003)
        )
        m.compile(opt, k.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    compiled(split_model).fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)
    plain = tensor_parallel_models(k)[name][0]
    plain.set_weights(initial)
    compiled(plain).fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0)
    return plain.get_weights(), split_model.plain_model().get_weights(), split_model, initial


def traced_training_step(model, loss, x, y):
    """The graph of one training step of ``model`` (forward, ``loss``, gradients), traced."""
    import tensorflow as tf

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        return tape.gradient(value, model.trainable_variables)

    return step.get_concrete_function(x, y).graph


def variable_bytes_made_by(function):
    """``(function(), bytes of the floating-point variables it made that are alive after it)``;
    scalars (a step trace's counters) and integer ones (seeds) left out."""
    import gc

    import tensorflow as tf

    gc.collect()
    before = {id(v) for v in gc.get_objects() if isinstance(v, tf.Variable)}
    result = function()
    gc.collect()
    made = [v for v in gc.get_objects() if isinstance(v, tf.Variable) and id(v) not in before]
    return result, sum(
        (v.shape.num_elements() or 0) * v.dtype.size
        for v in made
        if v.shape.rank and v.dtype.is_floating
    )


def weight_differences(model, a, b, optimizer):
    """{weight name: largest difference between the weight lists ``a`` and ``b`` of ``model``}. With
    Adam the attention's key bias is left out: its gradient is exactly 0 in exact arithmetic (a
    softmax does not change when every score of a row moves by the same amount), so both runs feed
    Adam round-off, which it scales to steps of the learning rate: no two summation orders agree
    there."""
    names = [getattr(w, "path", None) or w.name for w in model.weights]
    return {
        n: float(np.max(np.abs(x - y)))
        for n, x, y in zip(names, a, b)
        if not (optimizer == "adam" and "key/bias" in n)
    }


ZERO_OPTIMIZERS = {
    "sgd": lambda k: k.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    # clipped by the norm over every chunk
    "adam": lambda k: k.optimizers.Adam(0.01, global_clipnorm=0.5),
    # the biases excluded from the decay
    "adamw": lambda k: k.optimizers.AdamW(0.01, weight_decay=0.1),
}


LAYERWISE_OPTIMIZERS = {  # tfpar.optimizers, the biases excluded from decay and trust ratio
    "lars": lambda v: __import__("tfpar.optimizers").optimizers.LARS(
        1.0,
        momentum=0.9,
        eta=0.02,
        weight_decay=1e-3,
        exclude_from_weight_decay=["bias"],
        keras_version=v,
    ),
    "lamb": lambda v: __import__("tfpar.optimizers").optimizers.LAMB(
        0.01, weight_decay=1e-3, exclude_from_weight_decay=["bias"], keras_version=v
    ),
}


def zero_optimizer(k, name):
    """``ZERO_OPTIMIZERS[name]`` (or ``LAYERWISE_OPTIMIZERS[name]``) of Keras ``k``; AdamW with the
    biases excluded from its decay."""
    if name in LAYERWISE_OPTIMIZERS:
        return LAYERWISE_OPTIMIZERS[name](2 if k is keras else 3)
    optimizer = ZERO_OPTIMIZERS[name](k)
    if name == "adamw":
        optimizer.exclude_from_weight_decay(var_names=["bias"])
    return optimizer


def train_zero_pair(k, optimizer, devices, stage=1, epochs=2):
    """A model with an odd parameter count (so the last chunk is padded) trained on one device and
    under `DataParallel` over ``devices`` with ``zero_stage=stage``, from the same weights on the
    same global batches: (one device's weights, sharded weights, sharded model). One device is the
    reference: Keras 3 unsharded clips each replica's own gradients by their norm before the
    all-reduce, where one device, tf_keras and the sharded update clip the summed gradients."""
    import tfpar

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 7)).astype("float32"), rng.integers(0, 3, 48)
    trained = []
    for zero, on in ((0, devices[:1]), (stage, devices)):
        strategy = tfpar.DataParallel(devices=tuple(on), zero_stage=zero)
        with strategy.scope():
            k.utils.set_random_seed(1)
            model = k.Sequential(
                [k.Input((7,)), k.layers.Dense(5, activation="relu"), k.layers.Dense(3)]
            )
            model.compile(
                zero_optimizer(k, optimizer),
                k.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        model.fit(x, y, batch_size=12, epochs=epochs, shuffle=False, verbose=0)
        trained.append(model)
    return trained[0].get_weights(), trained[1].get_weights(), trained[1]


def zero_resume(k, folder, first, then, optimizer="adam", stage=1):
    """Trains 1 epoch with the optimizer state sharded over the devices ``first`` (or unsharded on
    one device when ``first`` has one), saves a checkpoint (tf_keras: TF format; Keras 3:
    .weights.h5), goes on 1 epoch; then a new model on ``then`` loads the checkpoint and trains the
    same epoch (``stage``: the ZeRO stage on several devices). Returns the largest weight difference
    between the two ends (0 if the state moved whole)."""
    import os

    import tfpar

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 7)).astype("float32"), rng.integers(0, 3, 48)
    path = os.path.join(folder, "ckpt.weights.h5" if k.__name__ == "keras" else "ckpt")

    def model_on(devices):
        strategy = tfpar.DataParallel(
            devices=tuple(devices), zero_stage=stage if len(devices) > 1 else 0
        )
        with strategy.scope():
            k.utils.set_random_seed(1)
            model = k.Sequential(
                [k.Input((7,)), k.layers.Dense(5, activation="relu"), k.layers.Dense(3)]
            )
            model.compile(
                ZERO_OPTIMIZERS[optimizer](k),
                k.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        return model

    before = model_on(first)
    before.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)
    before.save_weights(path)
    before.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)
    after = model_on(then)
    # built (and its optimizer), then overwritten
    after.fit(x[:12], y[:12], batch_size=12, epochs=1, verbose=0)
    after.load_weights(path)
    after.fit(x, y, batch_size=12, epochs=1, shuffle=False, verbose=0)
    return max(
        float(np.abs(a - b).max()) for a, b in zip(before.get_weights(), after.get_weights())
    )
