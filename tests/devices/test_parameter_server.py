"""ParameterServer errors that come before any connection (training runs in tests/multiproc)."""

import pytest

from tfpar.cluster import ClusterInfo
from tfpar.strategies.parameter_server import ClusterUnreachableError, ParameterServer


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            dict(num_workers=0),
            ValueError,
            r"num_workers must be an int >= 1. Received: num_workers=0. A parameter",
        ),
        (dict(num_ps=0), ValueError, r"num_ps must be an int >= 1. Received: num_ps=0"),
        (dict(num_ps=True), TypeError, r"num_ps must be an int. Received: num_ps=True"),
        (
            dict(connect_timeout_seconds=True),
            TypeError,
            r"connect_timeout_seconds must be a number. Received: "
            r"connect_timeout_seconds=True \(bool\)",
        ),
        (
            dict(connect_timeout_seconds=0),
            ValueError,
            r"connect_timeout_seconds must be a number > 0",
        ),
        (
            dict(variable_partitioner="even"),
            TypeError,
            r"variable_partitioner must be 'auto', None or a",
        ),
    ],
)
def test_bad_local_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        ParameterServer.local(**kwargs)


def test_cluster_without_ps_is_refused():
    cluster = ClusterInfo(
        cluster={"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
        task_type="chief",
        task_index=0,
    )
    with pytest.raises(ValueError, match=r"needs at least one 'ps' task"):
        ParameterServer(cluster=cluster)


def test_unreachable_ps_is_reported_by_address_after_a_bounded_wait():
    from tfpar.cluster import free_ports

    port, other = free_ports(2)
    cluster = ClusterInfo(
        cluster={
            "chief": ["127.0.0.1:1"],
            "worker": [f"127.0.0.1:{other}"],
            "ps": [f"127.0.0.1:{port}"],
        },
        task_type="chief",
        task_index=0,
    )
    with pytest.raises(
        ClusterUnreachableError, match=rf"Cannot reach 127.0.0.1:{port} after waiting 2 s"
    ):
        ParameterServer(cluster=cluster, connect_timeout_seconds=2)


def test_a_ps_error_is_translated_to_one_that_names_the_lost_task():
    import tensorflow as tf

    from tfpar.cluster import free_ports
    from tfpar.strategies._ps_failures import ParameterServerLostError, lost_ps_error

    addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]  # nothing listens: both "lost"
    error = tf.errors.UnavailableError(
        None,
        None,
        "Socket closed\nAdditional GRPC error information "
        "from remote target /job:ps/replica:0/task:1 while calling ...",
    )
    lost = lost_ps_error(error, addresses)
    assert isinstance(lost, ParameterServerLostError) and isinstance(
        lost, tf.errors.UnavailableError
    )
    assert lost.tasks == ["ps 0", "ps 1"]
    assert f"Lost the parameter server ps 0 ({addresses[0]}), ps 1 ({addresses[1]})" in str(lost)
    assert "TensorFlow reported: Socket closed" in str(lost)
    # A ps that no longer accepts connections is lost whatever the error says and whoever saw it
    # first: a worker's connection error, the chief's own read, the coordinator's wrapper.
    from tensorflow.python.distribute.coordinator.cluster_coordinator import ClosureInputError

    for seen in (
        tf.errors.UnavailableError(None, None, "Socket closed (/job:worker/replica:0/task:1)"),
        tf.errors.CancelledError(None, None, "Cancelled"),
        ClosureInputError(tf.errors.InvalidArgumentError(None, None, "Unknown device")),
    ):
        assert lost_ps_error(seen, addresses).tasks == ["ps 0", "ps 1"], seen
    assert lost_ps_error(ValueError("x"), addresses) is None


def test_a_ps_error_is_translated_only_when_a_ps_is_gone_or_named():
    import socket

    import tensorflow as tf

    from tfpar.strategies._ps_failures import lost_ps_error

    with socket.create_server(("127.0.0.1", 0)) as a, socket.create_server(("127.0.0.1", 0)) as b:
        addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in (a, b)]  # both ps still listen
        # A connection error that names a ps (a ps that failed and came back): that ps.
        named = tf.errors.UnavailableError(None, None, f"failed to connect to ipv4:{addresses[1]}")
        assert lost_ps_error(named, addresses).tasks == ["ps 1"]
        # An error of the model or of a worker, with every ps up, is not a ps loss.
        for other in (
            tf.errors.UnavailableError(None, None, "/job:worker/replica:0/task:0"),
            tf.errors.InvalidArgumentError(
                None, None, "Incompatible shapes /job:ps/replica:0/task:0"
            ),
        ):
            assert lost_ps_error(other, addresses) is None, other


def test_fit_without_steps_per_epoch_on_ps_input_says_why_and_what_to_pass():
    from tf_keras.src.engine import data_adapter

    from tfpar.data._ps_input import ParameterServerInput

    creator = ParameterServerInput(lambda context: None, steps_per_epoch=16)
    adapter = data_adapter.select_data_adapter(creator, None)
    with pytest.raises(
        ValueError, match=r"needs the number of steps: pass steps_per_epoch=16 to fit"
    ):
        adapter(creator, None, steps=None)
    assert adapter(creator, None, steps=16).steps == 16
