"""ZeRO stages 1 and 2 (`DataParallel(zero_stage=...)`, tfpar/strategies/_zero.py) on the 2 devices
of this process: the update equals the unsharded one, the optimizer state lives 1/N on each replica,
describe() says so, and what cannot be sharded is refused. 3 devices:
tests/multiproc/test_zero.py."""

import numpy as np
import pytest

import tfpar
from tests.models import overflow_step, train_zero_pair, zero_resume


@pytest.mark.parametrize("optimizer, stage", [("sgd", 1), ("adam", 2), ("adamw", 1)])
def test_a_sharded_optimizer_state_trains_like_the_whole_one(any_keras, optimizer, stage):
    whole, sharded, model = train_zero_pair(any_keras, optimizer, ["/cpu:0", "/cpu:1"], stage)
    assert max(float(np.abs(a - b).max()) for a, b in zip(whole, sharded)) < 1e-6
    assert int(model.optimizer.iterations.numpy()) == 8  # 2 epochs of 4 steps
    # The state is tfpar's chunks, one per replica on its device; the optimizer built no slot of its
    # own.
    zero = model._tfpar_zero
    total = sum(int(np.prod(w.shape)) for w in whole)  # 7*5+5+5*3+3 = 58
    assert (zero.total, zero.chunk) == (total, 29)
    slots = zero.slot_variables()
    assert sorted({v.device.split("device:")[-1] for v in slots}) == ["CPU:0", "CPU:1"]
    assert all(v.shape == (29,) for v in slots)
    assert len(slots) == {"sgd": 1, "adam": 2, "adamw": 2}[optimizer] * 2
    # tf_keras lists checkpoint views of its slots (gathered when saved), never a variable of that
    # size
    assert {type(v).__name__ for v in model.optimizer.variables if tuple(v.shape) == (7, 5)} <= {
        "_SlotView"
    }
    text = model.distribute_strategy.describe(model=model)
    assert (
        f"zero:       stage {stage}: each replica keeps and updates 1/2 of the optimizer state"
        in text
    )
    slot_bytes = 4 * total * (1 if optimizer == "sgd" else 2)
    assert f"optimizer state {slot_bytes:,} B -> {slot_bytes // 2:,} B" in text, text


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda k: k.optimizers.RMSprop(0.01),
            r"zero_stage=1 cannot shard the state of this optimizer: .*RMSprop has no "
            r"element-wise rule here.*Received: RMSprop. Use SGD or Adam or AdamW, or zero_stage=0",
        ),
        (
            lambda k: k.optimizers.Adam(0.01, clipnorm=1.0),
            r"clipnorm=1.0 needs each whole variable .*use global_clipnorm=",
        ),
    ],
)
def test_an_optimizer_that_cannot_be_sharded_is_refused_at_compile(any_keras, make, match):
    strategy = tfpar.DataParallel(zero_stage=1)
    with strategy.scope():
        model = any_keras.Sequential([any_keras.Input((3,)), any_keras.layers.Dense(2)])
        with pytest.raises(ValueError, match=match):
            model.compile(make(any_keras), "mse")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            dict(zero_stage=4),
            ValueError,
            r"Unknown zero_stage 4. Received: zero_stage=4. Use one of \[0, 1, 2, 3\]",
        ),
        (dict(zero_stage="1"), TypeError, r"zero_stage"),
    ],
)
def test_bad_zero_options_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        tfpar.DataParallel(**kwargs)


def test_zero_under_parameter_servers_and_adasum_is_refused():
    with pytest.raises(
        TypeError,
        match=r"ParameterServerConfig has no option 'zero_stage': each variable and its optimizer "
        r"slots already live in one place, on the parameter servers.*Received: zero_stage=1",
    ):
        tfpar.ParameterServer(zero_stage=1)
    from tfpar.strategies.horovod import HorovodConfig

    with pytest.raises(
        ValueError,
        match=r"zero_stage=1 reduce-scatters a sum of the gradients; Adasum combines them "
        r"otherwise. Received: op='adasum'. Use op='average' with it, or zero_stage=0",
    ):
        HorovodConfig(zero_stage=1, op="adasum")
    with pytest.raises(
        TypeError,
        match=r"DataParallelConfig has no option 'zero'. Received: zero=1. Its options are \[",
    ):
        tfpar.DataParallel(zero=1)


@pytest.mark.parametrize("first, then", [(2, 2), (2, 1), (1, 2)])
def test_a_checkpoint_holds_the_whole_state_and_resumes_on_other_replica_counts(
    any_keras, tmp_path, first, then
):
    """Saved after 1 epoch (tf_keras: TF format; Keras 3: .weights.h5), sharded over 2 replicas or
    unsharded on 1 device, loaded into a new model sharded over 2 or unsharded: the next epoch ends
    where the uninterrupted run does (Adam: without its moments restored the two differ by 0.03)."""
    devices = ["/cpu:0", "/cpu:1"]
    assert zero_resume(any_keras, str(tmp_path), devices[:first], devices[:then]) < 1e-6


def test_mixed_float16_skips_an_overflow_on_one_replica_everywhere_and_trains_like_unsharded(
    any_keras,
):
    """The loss-scale optimizer wraps the sharded one: an inf gradient on replica 1 skips the step
    on both (the check reduced over the replicas), the scale halves, the next step applies; Adam's
    sharded state ends where the unsharded run's does."""
    adam = lambda k: k.optimizers.Adam(0.01)  # noqa: E731
    whole = overflow_step(tfpar.DataParallel(), k=any_keras, replica=1, optimizer=adam)
    sharded = overflow_step(
        tfpar.DataParallel(zero_stage=1), k=any_keras, replica=1, optimizer=adam
    )
    assert sharded["sharded"] and sharded["inner"] == "Adam"
    assert sharded["skipped"] and sharded["per_replica_equal"] and sharded["updated"]
    assert sharded["loss_scale"] == [32768.0, 16384.0, 16384.0]
    numeric = [
        (a, b) for a, b in zip(whole["weights"], sharded["weights"]) if np.asarray(a).dtype != bool
    ]
    assert (
        max(float(np.abs(np.asarray(a, float) - np.asarray(b, float)).max()) for a, b in numeric)
        < 1e-6
    )


def test_bf16_compression_halves_the_reduce_scatter_and_stays_within_its_rounding(any_keras):
    """The gradients cross devices in bfloat16 and are summed in float32: the sharded run ends no
    further from one device than DataParallel's own bf16 all-reduce does (which sums in bf16)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 7)).astype("float32"), rng.integers(0, 3, 48)
    runs = {}
    for devices, zero, compression in ((1, 0, "none"), (2, 0, "bf16"), (2, 1, "bf16")):
        strategy = tfpar.DataParallel(
            devices=tuple(f"/cpu:{i}" for i in range(devices)),
            zero_stage=zero,
            compression=compression,
        )
        with strategy.scope():
            any_keras.utils.set_random_seed(1)
            model = any_keras.Sequential(
                [
                    any_keras.Input((7,)),
                    any_keras.layers.Dense(5, activation="relu"),
                    any_keras.layers.Dense(3),
                ]
            )
            model.compile(
                any_keras.optimizers.SGD(0.1, momentum=0.9),
                any_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        model.fit(x, y, batch_size=12, epochs=2, shuffle=False, verbose=0)
        runs[(devices, zero)] = model

    def distance(a, b):
        return max(float(np.abs(u - v).max()) for u, v in zip(a.get_weights(), b.get_weights()))

    one = runs[(1, 0)]
    # 3.0e-4 against 1.3e-3 measured
    assert 0 < distance(runs[(2, 1)], one) <= distance(runs[(2, 0)], one)
    zero = runs[(2, 1)]._tfpar_zero
    # bf16 out, float32 weights back
    assert zero.sent_bytes == [2 * zero.chunk + 4 * zero.chunk] * 2


def test_fault_tolerance_resumes_a_sharded_run_where_the_uninterrupted_one_ends(
    any_keras, tmp_path
):
    """FaultTolerance's backup holds the whole optimizer state (gathered from the replicas' chunks):
    a sharded Adam run that dies after epoch 2 of 4 and is started again ends where the run that
    never stopped does (restarted without Adam's moments, it would not)."""
    k = any_keras
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 7)).astype("float32"), rng.integers(0, 3, 48)

    class Crash(k.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("the process dies here")

    def run(callbacks):
        strategy = tfpar.DataParallel(zero_stage=1)
        with strategy.scope():
            k.utils.set_random_seed(1)
            model = k.Sequential(
                [k.Input((7,)), k.layers.Dense(5, activation="relu"), k.layers.Dense(3)]
            )
            model.compile(
                k.optimizers.Adam(0.01), k.losses.SparseCategoricalCrossentropy(from_logits=True)
            )
        model.fit(x, y, batch_size=12, epochs=4, shuffle=False, verbose=0, callbacks=callbacks)
        return model

    with pytest.raises(RuntimeError, match="the process dies here"):
        run([tfpar.callbacks.FaultTolerance(str(tmp_path / "backup")), Crash()])
    again = tfpar.callbacks.FaultTolerance(str(tmp_path / "backup"))
    resumed = run([again])
    assert again.resumed_at_epoch == 2 and resumed._tfpar_zero is not None
    uninterrupted = run([])
    assert (
        max(
            float(np.abs(a - b).max())
            for a, b in zip(uninterrupted.get_weights(), resumed.get_weights())
        )
        < 1e-6
    )


@pytest.mark.parametrize("stage", [1, 2])
def test_accumulation_with_a_sharded_state_trains_like_unsharded_accumulation(any_keras, stage):
    """gradient_accumulation_steps=3 (Adam, 12 steps: 4 updates): stage 1 sums each replica's own
    gradients and reduce-scatters their mean every 3rd step, stage 2 reduce-scatters every step and
    sums its chunk; both end where DataParallel's unsharded accumulation does, and Adam counts the
    updates as it does."""
    k = any_keras
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 7)).astype("float32"), rng.integers(0, 3, 96)
    ends = []
    for zero in (0, stage):
        strategy = tfpar.DataParallel(zero_stage=zero, gradient_accumulation_steps=3)
        with strategy.scope():
            k.utils.set_random_seed(1)
            model = k.Sequential(
                [k.Input((7,)), k.layers.Dense(5, activation="relu"), k.layers.Dense(3)]
            )
            model.compile(
                k.optimizers.Adam(0.01), k.losses.SparseCategoricalCrossentropy(from_logits=True)
            )
        start = [w.copy() for w in model.get_weights()]
        # 2 steps: no update yet
        model.fit(x[:16], y[:16], batch_size=8, epochs=1, shuffle=False, verbose=0)
        assert all(np.array_equal(a, b) for a, b in zip(start, model.get_weights()))
        # 10 more: 4 updates in all
        model.fit(x[16:], y[16:], batch_size=8, epochs=1, shuffle=False, verbose=0)
        ends.append(model.get_weights())
        assert int(model.optimizer.iterations.numpy()) == 4  # updates, not steps
    assert getattr(model, "_tfpar_zero").window == 3
    assert max(float(np.abs(a - b).max()) for a, b in zip(*ends)) < 1e-6


@pytest.mark.parametrize("stage", [1, 2])
def test_accumulation_with_a_sharded_state_under_mixed_float16_handles_an_overflow_as_unsharded(
    any_keras, stage
):
    """gradient_accumulation_steps=2 under mixed_float16 (Adam): an inf gradient on replica 1, then
    5 finite steps. tf_keras' loss-scale optimizer checks the accumulated sum at the window's end
    (the strategy accumulates, the sharded update applies at its boundary); Keras 3's checks each
    step and skips it before it is accumulated. Either way the sharded run skips, rescales and
    updates as the unsharded one does, to 1e-6."""
    adam = lambda k: k.optimizers.Adam(0.01)  # noqa: E731
    runs = [
        overflow_step(
            tfpar.DataParallel(zero_stage=zero, gradient_accumulation_steps=2),
            k=any_keras,
            replica=1,
            optimizer=adam,
            after=5,
        )
        for zero in (0, stage)
    ]
    assert runs[1]["sharded"] and not runs[0]["sharded"] and runs[1]["updated"]
    assert runs[1]["loss_scale"] == runs[0]["loss_scale"] and runs[1]["loss_scale"][-1] == 16384.0
    numeric = [
        (a, b)
        for a, b in zip(runs[0]["weights"], runs[1]["weights"])
        if np.asarray(a).dtype != bool
    ]
    assert (
        max(float(np.abs(np.asarray(a, float) - np.asarray(b, float)).max()) for a, b in numeric)
        < 1e-6
    )


@pytest.mark.parametrize(
    "device, nccl, expected",
    [
        ("/device:GPU:0", True, True),
        ("/device:GPU:0", False, False),
        ("/device:CPU:0", True, False),
        ("/job:localhost/replica:0/task:0/device:gpu:0", 1, True),
    ],
)
def test_horovods_reduce_scatter_is_nccls_only_on_a_gpu_with_nccl(device, nccl, expected):
    """The decision only (no GPU here): NCCL's reduce-scatter on a GPU rank of a Horovod built with
    NCCL; elsewhere the alltoall the multi-process tests run (tests/multiproc/test_horovod.py)."""
    from tfpar.strategies._horovod_ops import uses_nccl_reducescatter

    assert uses_nccl_reducescatter(device, nccl) is expected


def test_the_reduce_scatter_of_squared_rows_stays_float32_under_fp16():
    """Keras 3's Adam takes a sparse gradient's squared rows, 1e-8 and less, which fp16 flushes to
    zero: the other replica's half is lost (each keeps its own part in float32). ZeRO's
    reduce-scatter that carries them (``full=True``) sends float32, 4 bytes an element, and sums
    them exactly; the gradients' own stay 2 bytes."""
    import tensorflow as tf

    from tfpar.strategies._zero_comms import OneHostChunks

    chunks = OneHostChunks(["/cpu:0", "/cpu:1"], "fp16")
    flat = [tf.fill([4], 1e-8), tf.fill([4], 1e-8)]
    for full, expected, width in [(False, 1e-8, 2), (True, 2e-8, 4)]:
        reduced, sent = chunks.reduce_scatter(flat, 2, False, full=full)
        np.testing.assert_allclose([r.numpy() for r in reduced], expected, rtol=1e-6)
        assert sent == [width * 2, width * 2]


def test_a_state_in_several_buckets_trains_and_resumes_as_one_device(
    any_keras, monkeypatch, tmp_path
):
    """Buckets of at most 80 bytes (20 float32s) cut the model's 35 + 5 + 15 + 3 parameters into 3
    buckets ([35], [5, 15], [3]), each padded to 2 pieces (36, 20, 4: a chunk of 18 + 10 + 2), each
    exchanged and written back in turn: AdamW (its decay mask laid out in buckets too) and a
    checkpoint resumed on one device end where one device does."""
    from tfpar.strategies import _zero_state

    monkeypatch.setattr(_zero_state, "BUCKET_BYTES", 80)
    whole, sharded, model = train_zero_pair(any_keras, "adamw", ["/cpu:0", "/cpu:1"], 2)
    assert max(float(np.abs(a - b).max()) for a, b in zip(whole, sharded)) < 1e-6
    zero = model._tfpar_zero
    assert [list(bucket.variables) for bucket in zero.buckets] == [[0], [1, 2], [3]]
    assert [(bucket.start, bucket.size, bucket.piece) for bucket in zero.buckets] == [
        (0, 36, 18),
        (36, 20, 10),
        (56, 4, 2),
    ]
    # each replica's slots: one per bucket, its piece of it
    assert sorted(v.shape[0] for v in zero.slot_variables()) == sorted([18, 10, 2] * 2 * 2)
    text = model.distribute_strategy.describe(model=model)
    assert "buckets:    3, exchanged and updated in turn (the largest 144 B)" in text, text
    assert (zero.chunk, zero.padding) == (30, 2)
    # each replica sends its other piece of every bucket, then its own piece of every bucket
    assert zero.sent_bytes == [4 * 30 + 4 * 30] * 2
    devices = ["/cpu:0", "/cpu:1"]
    assert zero_resume(any_keras, str(tmp_path), devices, devices[:1]) < 1e-6


def test_a_sparse_gradients_squares_travel_in_its_own_bucket_only(monkeypatch):
    """Keras 3's Adam on the text model (Embedding, attention, LayerNormalization, Dense) with
    buckets of at most 1 KiB: the Embedding's 640 parameters are a bucket of their own, whose
    exchange carries its rows' squares; the other buckets' squares are made on their owner (dense).
    float32 ends within 1e-5 of one device. Under fp16 compression only the Embedding's bucket
    travels in float32 (fp16 would flush its squares, 1e-8 and less, and Adam's step would divide
    by its epsilon: an error near 1); the others are rounded to fp16: an error of 1e-3, not 0."""
    from tests import gradient_paths as models
    from tfpar.strategies import _zero_state

    monkeypatch.setattr(_zero_state, "BUCKET_BYTES", 1024)
    report = tfpar.verify.verify(
        models.text_keras3,
        models.text_data,
        steps=4,
        global_batch_size=16,
        paths="zero1,fp16+zero1,zero2+accumulate",
    )
    rows = {row.path: row for row in report.rows}
    assert all(row.verdict == "ok" for row in report.rows), report.rows
    assert rows["zero1"].max_difference <= 1e-5
    assert rows["zero2+accumulate"].max_difference <= 1e-5
    assert 1e-4 < rows["fp16+zero1"].relative_error < 1e-2
