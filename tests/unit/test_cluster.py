"""TF_CONFIG parsing, loopback clusters and --hosts."""

import json

import pytest

from tfpar.cluster import ClusterInfo, local_cluster, parse_hosts


def test_round_trip_and_roles():
    cluster = {"chief": ["h:1"], "worker": ["h:2", "h:3"]}
    info = ClusterInfo.from_tf_config(
        json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})
    )
    assert info.num_workers == 3 and info.worker_index == 2 and not info.is_chief
    assert info.address == "h:3"
    assert ClusterInfo.from_tf_config(info.to_tf_config()) == info
    assert ClusterInfo(
        cluster={"worker": ["a:1", "b:1"]}, task_type="worker", task_index=0
    ).is_chief


def test_unset_tf_config_is_none(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert ClusterInfo.from_tf_config() is None
    assert ClusterInfo.from_tf_config("  ") is None


@pytest.mark.parametrize(
    "raw, match",
    [
        ("{not json", r"TF_CONFIG must be JSON .*Received: TF_CONFIG='\{not json'"),
        ('{"task": {"type": "worker"}}', r'must be a JSON object with a "cluster" entry'),
        ('{"cluster": {"worker": ["a:1"]}}', r"must name this process's task"),
        (
            '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}',
            r"task index must be an int in \[0, 2\).*Received: task index 2",
        ),
        (
            '{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}',
            r"task type must be one",
        ),
        (
            '{"cluster": {"boss": ["a:1"]}, "task": {"type": "boss", "index": 0}}',
            r"Unknown task type 'boss'",
        ),
        (
            '{"cluster": {"worker": ["nope"]}, "task": {"type": "worker", "index": 0}}',
            r"Each address must be 'host:port' with a port in 1..65535. Received: worker 0 at "
            r"'nope'",
        ),
    ],
)
def test_bad_tf_config(raw, match):
    with pytest.raises(ValueError, match=match):
        ClusterInfo.from_tf_config(raw)


def test_local_cluster_has_distinct_loopback_ports():
    cluster = local_cluster({"worker": 3, "ps": 1, "chief": 0})
    assert set(cluster) == {"worker", "ps"}
    addresses = cluster["worker"] + cluster["ps"]
    assert len(set(addresses)) == 4 and all(a.startswith("127.0.0.1:") for a in addresses)


def test_parse_hosts():
    assert parse_hosts("a:2001, b ,c:2003", default_port=2002) == ["a:2001", "b:2002", "c:2003"]
    with pytest.raises(ValueError, match="at least one host"):
        parse_hosts(" , ")
    with pytest.raises(ValueError, match=r"Received: 'a:x'"):
        parse_hosts("a:x")


def test_horovodruns_host_slots_is_refused_naming_both_spellings():
    with pytest.raises(ValueError) as error:
        parse_hosts("a:4,b:4")
    assert str(error.value) == (
        "--hosts takes host:port, and port 4 is below 1024. Received: 'a:4' in --hosts 'a:4,b:4'. "
        "horovodrun "
        "writes host:slots (-H a:4); in tfpar that is --hosts a with --nproc-per-node 4, or one "
        "host:port entry "
        "per worker, e.g. a:2222,a:2223."
    )
