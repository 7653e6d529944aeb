"""ParameterServer errors that come before any connection (training runs in tests/multiproc)."""

import pytest

from tfpar.cluster import ClusterInfo
from tfpar.strategies.parameter_server import ClusterUnreachableError, ParameterServer


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(num_workers=0), ValueError, r"needs num_workers >= 1. Received: num_workers=0"),
    (dict(num_ps=0), ValueError, r"needs num_ps >= 1. Received: num_ps=0"),
    (dict(variable_partitioner="even"), TypeError, r"variable_partitioner must be 'auto', None or a"),
])
def test_bad_local_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        ParameterServer.local(**kwargs)


def test_cluster_without_ps_is_refused():
    cluster = ClusterInfo(cluster={"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                          task_type="chief", task_index=0)
    with pytest.raises(ValueError, match=r"needs at least one 'ps' task"):
        ParameterServer(cluster=cluster)


def test_unreachable_ps_is_reported_by_address_after_a_bounded_wait():
    from tfpar.cluster import free_ports

    port = free_ports(1)[0]
    cluster = ClusterInfo(cluster={"chief": ["127.0.0.1:1"], "worker": [f"127.0.0.1:{port}"],
                                   "ps": [f"127.0.0.1:{port}"]}, task_type="chief", task_index=0)
    with pytest.raises(ClusterUnreachableError, match=rf"Cannot reach 127.0.0.1:{port} after waiting 2 s"):
        ParameterServer(cluster=cluster, connect_timeout_seconds=2)
