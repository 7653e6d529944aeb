"""tfpar.tune's search-space checks (pure Python)."""

import pytest

from tfpar.tune import TuneResult, check_space


def test_a_valid_space_is_normalised_to_lists():
    assert check_space({"per_replica_batch": [16, 32], "steps_per_execution": 4}) == {
        "per_replica_batch": [16, 32],
        "steps_per_execution": [4],
    }


@pytest.mark.parametrize(
    "space, match",
    [
        ({}, r"non-empty dict"),
        ([1, 2], r"non-empty dict"),
        ({"batch": [16]}, r"Unknown tune axis 'batch'"),
        ({"per_replica_batch": []}, r"The tune axis 'per_replica_batch' is empty"),
        (
            {"steps_per_execution": [0]},
            r"'steps_per_execution' takes ints >= 1. Received: steps_per_execution=\[0\]",
        ),
        ({"bytes_per_pack": [1.5]}, r"'bytes_per_pack' takes ints >= 0"),
    ],
)
def test_bad_spaces_are_refused(space, match):
    with pytest.raises(ValueError, match=match):
        check_space(space)


def test_the_best_trial_is_the_fastest_successful_one():
    result = TuneResult(
        (
            {"config": {"per_replica_batch": 8}, "status": "ok", "examples_per_second": 100.0},
            {
                "config": {"per_replica_batch": 64},
                "status": "failed",
                "error": "Traceback\nValueError: no",
            },
            {"config": {"per_replica_batch": 32}, "status": "ok", "examples_per_second": 250.0},
        )
    )
    assert result.best["config"] == {"per_replica_batch": 32}
    assert (
        "failed: ValueError: no" in result.describe()
        and "fastest: {'per_replica_batch': 32}" in result.describe()
    )


def test_choice_axes_take_their_values_only():
    assert check_space(
        {"strategy": ["horovod"], "compression": "bf16", "horovod_autotune": [False, True]}
    ) == {"strategy": ["horovod"], "compression": ["bf16"], "horovod_autotune": [False, True]}
    with pytest.raises(
        ValueError,
        match=r"Tune axis 'compression' takes \['none', 'bf16', 'fp16'\]. "
        r"Received: compression=\['int8'\]",
    ):
        check_space({"compression": ["int8"]})
    with pytest.raises(
        ValueError,
        match=r"'horovod_autotune' takes \[False, True\]. Received: horovod_autotune=\[1\]",
    ):
        check_space({"horovod_autotune": [1]})


def test_each_trial_keeps_the_axes_of_its_backend_and_the_defaults_run_first():
    from tfpar.tune import DEFAULTS
    from tfpar.tune.space import trial_configs as _trial_configs

    configs = _trial_configs(
        {
            "strategy": ["data_parallel", "horovod"],
            "bytes_per_pack": [0, 4096],
            "horovod_autotune": [False, True],
        }
    )
    assert configs[0] == DEFAULTS
    data_parallel = [c for c in configs if c["strategy"] == "data_parallel"]
    horovod = [c for c in configs if c["strategy"] == "horovod"]
    # bytes_per_pack=0 is DataParallel's default: that trial is the defaults' (run once)
    assert sorted(c.get("bytes_per_pack", 0) for c in data_parallel) == [0, 4096]
    assert all("horovod_autotune" not in c for c in data_parallel)
    assert sorted(c.get("horovod_autotune", False) for c in horovod) == [False, True]
    assert all("bytes_per_pack" not in c for c in horovod)


def test_the_fastest_trial_comes_with_its_speedup_and_the_code_that_reproduces_it():
    from tfpar.tune import DEFAULTS

    fastest = {
        **DEFAULTS,
        "strategy": "horovod",
        "compression": "bf16",
        "steps_per_execution": 4,
        "horovod_autotune": True,
    }
    result = TuneResult(
        (
            {"config": dict(DEFAULTS), "status": "ok", "examples_per_second": 100.0},
            {"config": fastest, "status": "ok", "examples_per_second": 180.0},
        ),
        workers=2,
    )
    assert result.speedup == pytest.approx(1.8)
    assert result.reproduce().splitlines() == [
        "  HOROVOD_AUTOTUNE=1 tfpar launch --horovod -n 2 -- python train.py",
        "  strategy = tfpar.strategies.HorovodStrategy(compression='bf16')",
        "  model.compile(..., steps_per_execution=4)",
        "  train = tfpar.data.distribute(dataset, strategy, 32 * strategy.num_replicas_in_sync)",
    ]
    assert "speed-up over tfpar's defaults" in result.describe() and "1.80x" in result.describe()


def test_one_host_axes_are_refused_across_workers():
    from tfpar.tune import tune

    with pytest.raises(ValueError, match=r"Received: workers=2 with \['num_packs'\]"):
        tune(
            "tfpar.demo:build_model", "tfpar.demo:digits_dataset", {"num_packs": [1, 2]}, workers=2
        )


def test_pipeline_axes_apply_to_pipeline_trials_only():
    from tfpar.tune.space import trial_configs as _trial_configs

    configs = _trial_configs(
        {"microbatches": [4], "schedule": ["1f1b", "interleaved"], "virtual_stages": [2]}
    )
    assert [(c["schedule"], c.get("virtual_stages")) for c in configs] == [
        ("1f1b", None),
        ("interleaved", 2),
    ]
    assert all(
        "schedule" not in c
        for c in _trial_configs({"schedule": ["zb-h1"], "per_replica_batch": [8]})
    )


def test_the_choice_axes_offer_what_the_strategies_and_the_pipeline_take():
    """tfpar.tune keeps TensorFlow out of its import, so it lists these values itself."""
    from tfpar.pipeline.schedule import SCHEDULES
    from tfpar.strategies._gradients import COMPRESSIONS
    from tfpar.strategies._zero import ZERO_STAGES
    from tfpar.tune import CHOICE_AXES

    assert CHOICE_AXES["compression"] == COMPRESSIONS
    assert set(CHOICE_AXES["schedule"]) == set(SCHEDULES)
    assert CHOICE_AXES["zero_stage"] == ZERO_STAGES


def test_the_tensor_degree_makes_a_tensor_parallel_trial_without_compression():
    from tfpar.tune.space import trial_configs as _trial_configs
    from tfpar.tune.trial import trial_spec

    configs = _trial_configs({"tensor_degree": [1, 2], "compression": ["none", "bf16"]})
    split = [c for c in configs if c.get("tensor_degree") == 2]
    assert len(split) == 1 and "compression" not in split[0]  # one model: no gradients on a wire
    spec = trial_spec(split[0])
    assert spec.kind == "tensor_parallel" and spec.devices == 2
    assert spec.code() == "tfpar.tensor_parallel.TensorParallel(degree=2)"
    assert (
        trial_spec(_trial_configs({"tensor_degree": [1], "per_replica_batch": [8]})[0]).kind
        == "data_parallel"
    )


def test_remat_is_an_axis_of_data_parallel_and_horovod_trials_not_of_pipelines():
    from tfpar.tune.space import trial_configs as _trial_configs
    from tfpar.tune.trial import trial_spec

    configs = _trial_configs(
        {"remat": ["none", "blocks"], "strategy": ["data_parallel", "horovod"]}
    )
    recomputed = [c for c in configs if c.get("remat")]
    assert sorted(c["strategy"] for c in recomputed) == ["data_parallel", "horovod"]
    spec = trial_spec(next(c for c in recomputed if c["strategy"] == "data_parallel"))
    assert spec.code() == "tfpar.DataParallel(remat='blocks')"
    pipelines = _trial_configs({"remat": ["none", "blocks"], "microbatches": [4]})
    assert [c.get("remat") for c in pipelines] == [None]


def test_the_zero_stage_shards_data_parallel_and_horovod_trials_compressed_or_not():
    from tfpar.tune.space import trial_configs as _trial_configs
    from tfpar.tune.trial import trial_spec

    configs = _trial_configs(
        {
            "zero_stage": [0, 1],
            "compression": ["none", "bf16"],
            "strategy": ["data_parallel", "horovod"],
        }
    )
    sharded = [c for c in configs if c.get("zero_stage")]
    assert sorted((c["strategy"], c["compression"]) for c in sharded) == [
        ("data_parallel", "bf16"),
        ("data_parallel", "none"),
        ("horovod", "bf16"),
        ("horovod", "none"),
    ]
    spec = trial_spec(
        next(c for c in sharded if c["compression"] == "none" and c["strategy"] == "data_parallel")
    )
    assert spec.code() == "tfpar.DataParallel(zero_stage=1)" and spec.demo_flags()[-2:] == [
        "--zero-stage",
        "1",
    ]
    spec = trial_spec(
        next(c for c in sharded if c["compression"] == "bf16" and c["strategy"] == "horovod")
    )
    assert spec.code() == "tfpar.strategies.HorovodStrategy(compression='bf16', zero_stage=1)"
    assert spec.demo_flags()[-2:] == ["--zero-stage", "1"]
    with pytest.raises(
        ValueError,
        match=r"Received: workers=2 with \['tensor_degree'\]. Tune bytes_per_pack, "
        r"compression, zero_stage and strategy across workers",
    ):
        from tfpar.tune import tune

        tune(
            "tfpar.demo:build_model",
            "tfpar.demo:digits_dataset",
            {"tensor_degree": [1, 2]},
            workers=2,
        )


def _trial(config, seconds, speed, curve=((1.0, 0.5),), stopped=None):
    from tfpar.tune import DEFAULTS

    return {
        "config": {**DEFAULTS, **config},
        "status": "ok",
        "examples_per_second": speed,
        "seconds_to_target": seconds,
        "epochs_to_target": None if seconds is None else len(curve),
        "curve": [list(point) for point in curve],
        "stopped": stopped or ("target" if seconds else "stopped at 2.0 s"),
        "code": {
            "optimizer": "tfpar.optimizers.LAMB(0.02, weight_decay=0.0001)",
            "callbacks": "tfpar.callbacks.LearningRateWarmup(warmup_epochs=1, scale=128/64, "
            "rule='sqrt')",
        },
    }


def test_with_a_target_the_first_to_reach_it_wins_not_the_fastest_per_example():
    """A trial twice as fast per example that never reached the target is listed as such and never
    wins; the winner's gain is the defaults' time over its own."""
    result = TuneResult(
        (
            _trial({}, 3.0, 4000.0, ((1.2, 0.8), (3.0, 0.96))),
            _trial(
                {"per_replica_batch": 128, "optimizer": "lamb", "scaling_rule": "sqrt"},
                2.0,
                5000.0,
                ((1.1, 0.9), (2.0, 0.955)),
            ),
            _trial({"per_replica_batch": 512}, None, 9000.0, ((1.0, 0.3), (2.1, 0.6))),
        ),
        target="val_accuracy=0.95",
    )
    assert result.best["config"]["per_replica_batch"] == 128
    assert result.speedup == pytest.approx(1.5)
    text = result.describe()
    assert (
        "first to val_accuracy=0.95: " in text and "in 2.0 s (2 epochs, 5,000 examples/s)" in text
    )
    assert "sooner than tfpar's defaults" in text and "1.50x" in text
    assert "did not reach the target (stopped at 2.0 s)" in text
    assert "  3: 1.0s 0.3, 2.1s 0.6" in text  # each trial's curve
    assert "optimizer = tfpar.optimizers.LAMB(0.02, weight_decay=0.0001)" in result.reproduce()
    assert "callbacks=[tfpar.callbacks.LearningRateWarmup(" in result.reproduce()
    none = TuneResult(
        (_trial({"per_replica_batch": 512}, None, 9000.0),), target="val_accuracy=0.95"
    )
    assert none.best is None and "no trial reached val_accuracy=0.95" in none.describe()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(target="val_accuracy>0.95"),
            r"target must be METRIC=VALUE, e.g. val_accuracy=0.95. Received: "
            r"target='val_accuracy>0.95'",
        ),
        (
            dict(target="val_acc=0.95", validation_fn="tfpar.demo:digits_validation_dataset"),
            r"The trials log no metric 'val_acc': they log loss, accuracy, val_loss, val_accuracy",
        ),
        (
            dict(target="val_accuracy=0.95"),
            r"The trials log no metric 'val_accuracy': they log loss, accuracy \(",
        ),
        (
            dict(target="accuracy=0.9", max_seconds=400),
            r"max_seconds must be a number in \(0, 300\]. Received: "
            r"max_seconds=400. A trial's training time must fit",
        ),
    ],
)
def test_a_bad_target_is_refused_before_any_trial(kwargs, match):
    from tfpar.tune import tune

    with pytest.raises(ValueError, match=match):
        tune(
            "tfpar.demo:build_model",
            "tfpar.demo:digits_dataset",
            {"per_replica_batch": [32]},
            **kwargs,
        )


def test_the_scaling_rule_and_warmup_apply_where_the_batch_differs_from_the_defaults():
    from tfpar.tune.space import trial_configs

    configs = trial_configs(
        {
            "per_replica_batch": [32, 128],
            "scaling_rule": ["none", "sqrt"],
            "warmup_epochs": [0, 1],
            "optimizer": ["model"],
        }
    )
    assert [
        (c["per_replica_batch"], c.get("scaling_rule"), c.get("warmup_epochs")) for c in configs
    ] == [(32, None, None), (128, None, None), (128, "sqrt", None), (128, "sqrt", 1)]
