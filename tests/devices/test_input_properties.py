"""Property tests: random well-typed and ill-typed values give a valid object or a clear tfpar
error (TypeError or ValueError, raised by tfpar, naming what it received), never another exception.

Over cluster specs (`ClusterInfo`, ``TF_CONFIG``) and every config dataclass.
"""

import dataclasses
import json
import os
import traceback

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfpar.cluster import ROLES, ClusterInfo
from tfpar.data.sharding import InputConfig
from tfpar.pipeline import PipelineConfig
from tfpar.strategies.data_parallel import DataParallelConfig
from tfpar.strategies.horovod import HorovodConfig
from tfpar.strategies.parameter_server import ParameterServerConfig

# Derandomized: CI runs the same 300 examples each time (1,500 random ones per test passed when
# this was written); a failure names its example.
SETTINGS = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 70000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "auto",
            "epoch",
            "1f1b",
            "gpipe",
            "ring",
            "pad",
            "drop",
            "127.0.0.1:2222",
            "/cpu:0",
            "/cpu:1",
        ]
    ),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.text(max_size=5), scalars, max_size=2),
)
addresses = st.one_of(
    st.builds(
        lambda h, p: f"{h}:{p}",
        st.sampled_from(["127.0.0.1", "host", "", "[::1]", "a b"]),
        st.one_of(st.integers(-5, 70000), st.text(max_size=4)),
    ),
    st.sampled_from([":", "host", "127.0.0.1:2222", "127.0.0.1:2223"]),
    scalars,
)
clusters = st.one_of(
    st.dictionaries(
        st.one_of(st.sampled_from(ROLES), st.text(max_size=6)),
        st.one_of(st.lists(addresses, max_size=3), scalars),
        max_size=4,
    ),
    values,
)


def _assert_clear(error):
    assert isinstance(error, (TypeError, ValueError)), f"{type(error).__name__}: {error}"
    frames = traceback.extract_tb(error.__traceback__)
    assert any(f"{os.sep}tfpar{os.sep}" in frame.filename for frame in frames[-1:]), (
        f"raised outside tfpar ({frames[-1].filename}): {error}"
    )
    assert "Received" in str(error), str(error)


def _try(make):
    try:
        return make()
    except Exception as error:  # noqa: BLE001 - the property is about which exceptions come out
        _assert_clear(error)
        return None


@SETTINGS
@given(cluster=clusters, task_type=st.one_of(st.sampled_from(ROLES), scalars), task_index=scalars)
def test_cluster_info_is_valid_or_a_clear_error(cluster, task_type, task_index):
    info = _try(lambda: ClusterInfo(cluster=cluster, task_type=task_type, task_index=task_index))
    if info is not None:  # a valid one: its TF_CONFIG reads back the same
        assert ClusterInfo.from_tf_config(info.to_tf_config()) == info


@SETTINGS
@given(
    cluster=clusters,
    task=st.one_of(
        values,
        st.fixed_dictionaries(
            {"type": st.one_of(st.sampled_from(ROLES), scalars)}, optional={"index": scalars}
        ),
    ),
)
def test_tf_config_is_valid_or_a_clear_error(cluster, task):
    try:
        raw = json.dumps({"cluster": cluster, "task": task})
    except (TypeError, ValueError):
        return  # not JSON: nothing TF_CONFIG could hold
    _try(lambda: ClusterInfo.from_tf_config(raw))


CONFIGS = [InputConfig, PipelineConfig, DataParallelConfig, HorovodConfig, ParameterServerConfig]


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_config_dataclasses_are_valid_or_a_clear_error(config_class):
    fields = [
        f.name
        for f in dataclasses.fields(config_class)
        if f.name not in ("cluster", "variable_partitioner", "reader", "layer_costs")
    ]
    required = {"global_batch_size": st.integers(1, 64)} if config_class is InputConfig else {}

    @SETTINGS
    @given(
        st.fixed_dictionaries(
            required, optional={name: values for name in fields if name not in required}
        )
    )
    def check(kwargs):
        _try(lambda: config_class(**kwargs))

    check()
