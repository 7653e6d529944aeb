"""ShardPlan arithmetic: every worker runs the same steps; pad covers, drop drops < a batch."""

import itertools
import math
import warnings

import pytest

from tfpar.data.plan import plan_shard


def _dealt(n, workers, part):
    """Each worker's examples of range(n) under DATA sharding, by brute force: consecutive parts of
    ``part`` examples, part c to worker c mod ``workers``."""
    parts = [list(range(i, min(i + part, n))) for i in range(0, n, part)]
    return [[i for p in parts[w::workers] for i in p] for w in range(workers)]


@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_steps_equal_on_every_worker_and_cover_the_input(remainder):
    for workers, replicas, batch, n in itertools.product(
        range(1, 5), range(1, 4), range(1, 5), range(1, 60)
    ):
        global_batch = workers * replicas * batch
        if remainder == "drop" and n < global_batch:
            continue
        plans = [
            plan_shard(
                num_workers=workers,
                worker_index=w,
                replicas_per_worker=replicas,
                per_replica_batch=batch,
                policy="data",
                remainder=remainder,
                num_elements=n,
            )
            for w in range(workers)
        ]
        steps = {p.steps for p in plans}
        assert len(steps) == 1
        (s,) = steps
        per_worker = [len(shard) for shard in _dealt(n, workers, replicas * batch)]
        if remainder == "pad":
            assert s == math.ceil(n / global_batch)
            assert all(size <= s * replicas * batch for size in per_worker)
            # Padding (and its weight column) only where some shard falls short.
            assert {p.padded for p in plans} == {n % global_batch != 0}
        else:
            assert s == n // global_batch
            assert all(size >= s * replicas * batch for size in per_worker)
            assert not any(p.padded for p in plans)


def test_file_policy_balances_by_the_largest_and_smallest_shard():
    sizes = [10, 1, 7, 3, 3]
    plans = [
        plan_shard(
            num_workers=2,
            worker_index=w,
            replicas_per_worker=1,
            per_replica_batch=4,
            policy="file",
            num_elements=sum(sizes),
            files=list("abcde"),
            file_sizes=sizes,
        )
        for w in range(2)
    ]
    assert plans[0].files == ("a", "c", "e") and plans[1].files == ("b", "d")
    assert {p.steps for p in plans} == {math.ceil(20 / 4)}  # worker 0 holds 20 examples
    drop = plan_shard(
        num_workers=2,
        worker_index=1,
        replicas_per_worker=1,
        per_replica_batch=4,
        policy="file",
        remainder="drop",
        num_elements=24,
        files=list("abcde"),
        file_sizes=sizes,
    )
    assert drop.steps == 4 // 4  # worker 1 holds 4 examples


def test_auto_policy():
    assert (
        plan_shard(
            num_workers=1,
            worker_index=0,
            replicas_per_worker=2,
            per_replica_batch=2,
            num_elements=10,
        ).policy
        == "off"
    )
    assert (
        plan_shard(
            num_workers=2,
            worker_index=0,
            replicas_per_worker=1,
            per_replica_batch=2,
            num_elements=10,
        ).policy
        == "data"
    )
    assert (
        plan_shard(
            num_workers=2,
            worker_index=0,
            replicas_per_worker=1,
            per_replica_batch=2,
            files=["a", "b", "c"],
            num_elements=None,
        ).policy
        == "file"
    )
    with pytest.warns(UserWarning, match="Sharding by DATA: there are 1 file"):
        plan = plan_shard(
            num_workers=2,
            worker_index=0,
            replicas_per_worker=1,
            per_replica_batch=2,
            files=["a"],
            num_elements=None,
        )
    assert plan.policy == "data"


def test_infinite_input_has_no_steps():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = plan_shard(num_workers=3, worker_index=2, replicas_per_worker=1, per_replica_batch=2)
    assert plan.steps is None and plan.global_batch_size == 6


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(policy="files"), r"Unknown shard_policy 'files'.*Received: shard_policy='files'"),
        (dict(remainder="keep"), r"Unknown remainder 'keep'"),
        (dict(policy="file"), r"needs the input as a list of files"),
        (
            dict(policy="file", files=["a", "b"], file_sizes=[1, 1]),
            r"at least one file per worker.*Received: 2 file\(s\) for 3 workers",
        ),
        (dict(worker_index=3), r"worker_index must be in \[0, 3\)"),
        (dict(remainder="drop", num_elements=5), r"no step: 5 example\(s\) with remainder='drop'"),
    ],
)
def test_bad_plans(kwargs, match):
    args = dict(
        num_workers=3, worker_index=0, replicas_per_worker=1, per_replica_batch=2, num_elements=30
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        plan_shard(**args)


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("replicas_per_worker", [1, 2])
def test_padded_step_weights_make_each_step_the_mean_over_its_real_examples(
    num_workers, replicas_per_worker
):
    """Against a brute-force count: each worker's DATA shard (its part of every step) cut into
    per-replica batches, R of them per step; a padded step's real examples weigh global/real."""
    batch = 3
    global_batch = num_workers * replicas_per_worker * batch
    for n in range(global_batch, 4 * global_batch + 1):
        plans = [
            plan_shard(
                num_workers=num_workers,
                worker_index=w,
                replicas_per_worker=replicas_per_worker,
                per_replica_batch=batch,
                policy="data",
                num_elements=n,
            )
            for w in range(num_workers)
        ]
        shards = _dealt(n, num_workers, replicas_per_worker * batch)
        real = [0] * plans[0].steps
        for shard in shards:
            chunks = [shard[i : i + batch] for i in range(0, len(shard), batch)]
            for index, chunk in enumerate(chunks):
                real[index // replicas_per_worker] += len(chunk)
        expected = tuple(global_batch / r for r in real if r < global_batch)
        # only a tail is short
        assert all(r == global_batch for r in real[: len(real) - len(expected)])
        for plan in plans:
            assert plan.padded_step_weights == pytest.approx(expected), (n, real)
            assert plan.padded == bool(expected)
        assert sum(real) == n
