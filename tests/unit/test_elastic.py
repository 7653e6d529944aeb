"""Elastic `tfpar launch`: host discovery (Horovod's host:slots), the membership, and the launcher's
shrink, wait and grow, with plain Python children (no TensorFlow; the training job with its data is
tests/multiproc/test_exactly_once.py's)."""

import os
import re
import sys
import textwrap

import pytest

from tests.conftest import run_command, tfpar_command
from tfpar._tasks.elastic_batch import ElasticBatch
from tfpar.launch.elastic.discovery import Discovery, parse_host_lines
from tfpar.launch.elastic.membership import Membership

PY = sys.executable


def test_host_lines_parse_as_horovods_discovery_prints_them():
    text = "localhost:2\n127.0.0.1\n\n# a comment\n[::1]:3  # trailing comment\nlocalhost:1\n"
    assert parse_host_lines(text, "s") == {"localhost": 3, "127.0.0.1": 1, "::1": 3}


@pytest.mark.parametrize(
    "line", ["localhost:0", "localhost:two", "local host:2", ":2", "localhost:-1"]
)
def test_an_unparsable_host_line_is_refused_naming_it(line):
    with pytest.raises(
        ValueError,
        match=r"the script printed line 2 that is not host:slots. Received: "
        rf"{re.escape(repr(line))}",
    ):
        parse_host_lines(f"localhost:1\n{line}\n", "the script")


def test_the_membership_drops_a_slot_past_its_restarts_and_a_host_brings_its_slots_back():
    m = Membership(2, 3, max_restarts=1)
    # at most 3
    assert m.change(m.slots({"127.0.0.1": 2, "localhost": 2})) == "3 worker(s); world size 3"
    assert m.failed(2) is None  # its first failure: restarted
    assert "localhost slot 0 dropped" in m.failed(2)
    slots = m.slots({"127.0.0.1": 2, "localhost": 2})
    # the next slot takes its place
    assert slots == ["127.0.0.1 slot 0", "127.0.0.1 slot 1", "localhost slot 1"]
    assert (
        m.change(slots)
        == "workers 3 -> 3 (left: localhost slot 0; joined: localhost slot 1); world size 3"
    )
    assert (
        m.change(m.slots({"127.0.0.1": 2}))
        == "workers 3 -> 2 (left: localhost slot 1); world size 2"
    )
    assert m.slots({"127.0.0.1": 2, "localhost": 1}) == [
        "127.0.0.1 slot 0",
        "127.0.0.1 slot 1",
        "localhost slot 0",
    ]


def test_the_global_batch_is_divided_for_max_workers_else_the_most_the_job_has_had():
    m = Membership(1, None, max_restarts=0)
    m.change(["a", "b", "c"])
    m.change(["a", "b"])
    assert m.reference == 3
    assert Membership(1, 4, max_restarts=0).reference == 4


@pytest.mark.parametrize(
    "batch, workers, count",
    [
        ("accumulate", 4, 1),
        ("accumulate", 5, 1),
        ("accumulate", 3, 2),
        ("accumulate", 2, 2),
        ("accumulate", 1, 4),
        ("grow", 1, 1),
        ("scale-lr", 1, 1),
        ("scale-lr-sqrt", 2, 1),
    ],
)
def test_micro_batches_are_the_fewest_within_the_full_jobs_per_replica_batch(batch, workers, count):
    setting = ElasticBatch(4, 1, batch)
    assert setting.microbatches(workers) == count
    assert ElasticBatch.from_env({"TFPAR_ELASTIC": setting.to_env()}) == setting
    assert ElasticBatch.from_env({}) is None


def test_a_global_batch_that_a_size_of_the_job_cannot_take_is_refused_naming_a_fix():
    ElasticBatch(4, 2, "accumulate").check_global_batch(48, 1)  # 2: 2x1x2; 3: 3x1x2; 4: 4x1x1
    with pytest.raises(
        ValueError,
        match=r"trains on 2 to 4 workers.*\(workers x 2 replica\(s\) x micro-batches\) on "
        r"3 \(12 parts\) worker\(s\).*Received: global_batch_size=32. Use a multiple "
        r"of 24 \(e.g. 24\)",
    ):
        ElasticBatch(4, 2, "accumulate").check_global_batch(32, 2)
    with pytest.raises(ValueError, match=r"Unknown elastic_batch 'shrink'"):
        ElasticBatch(4, 2, "shrink")


def test_scale_lr_keeps_the_per_replica_batch_and_scales_the_rate_by_its_rule():
    """``--elastic-batch scale-lr``: on 3 workers of 4 a global batch of 48 becomes 36 (12 per
    worker), the rate x0.75 (linear) or x sqrt(0.75); the other modes keep both. A global batch the
    reference cannot divide is refused, naming a fit."""
    assert (
        ElasticBatch(4, 1, "scale-lr").global_batch(48, 3),
        ElasticBatch(4, 1, "scale-lr").learning_rate_factor(3),
    ) == (36, 0.75)
    assert ElasticBatch(4, 1, "scale-lr-sqrt").learning_rate_factor(3) == pytest.approx(0.75**0.5)
    assert (
        ElasticBatch(4, 1).global_batch(48, 3),
        ElasticBatch(4, 1, "grow").learning_rate_factor(3),
    ) == (48, 1.0)
    ElasticBatch(4, 2, "scale-lr").check_global_batch(48, 2)
    with pytest.raises(
        ValueError,
        match=r"\(4 workers x 2 replica\(s\), each size keeping that per-replica batch\) on 2 "
        r"\(8 parts\), 3 \(8 parts\), 4 \(8 parts\).*Received: global_batch_size=36. "
        r"Use a multiple of 8 \(e.g. 32\)",
    ):
        ElasticBatch(4, 2, "scale-lr").check_global_batch(36, 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(min_workers=3, max_workers=2, max_restarts=0),
            r"min_workers must not exceed max_workers. Received: --min-workers 3 --max-workers 2",
        ),
        (dict(min_workers=0, max_workers=2, max_restarts=0), r"min_workers must be an int >= 1"),
        (dict(min_workers=1, max_workers=0, max_restarts=0), r"max_workers must be an int >= 1"),
    ],
)
def test_bad_membership(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Membership(**kwargs)


def _executable(path, body, mode=0o755):
    path.write_text(body)
    path.chmod(mode)
    return str(path)


def test_bad_discovery_is_refused_at_once(tmp_path):
    with pytest.raises(
        ValueError, match=r"script does not exist. Received: --host-discovery-script .*nowhere"
    ):
        Discovery(script=str(tmp_path / "nowhere"))
    plain = _executable(tmp_path / "plain.sh", "#!/bin/sh\necho localhost:2\n", mode=0o644)
    with pytest.raises(ValueError, match=r"not executable.*chmod \+x"):
        Discovery(script=plain)
    with pytest.raises(ValueError, match=r"file does not exist"):
        Discovery(file=str(tmp_path / "hosts"))
    garbled = _executable(
        tmp_path / "garbled.sh", "#!/bin/sh\necho localhost:2\necho 'oops no slots:x'\n"
    )
    with pytest.raises(
        ValueError, match=r"printed line 2 that is not host:slots. Received: 'oops no slots:x'"
    ):
        Discovery(script=garbled).hosts()
    failing = _executable(tmp_path / "failing.sh", "#!/bin/sh\necho broken >&2\nexit 4\n")
    with pytest.raises(ValueError, match=r"exited with code 4: broken"):
        Discovery(script=failing).hosts()
    remote = _executable(tmp_path / "remote.sh", "#!/bin/sh\necho localhost:1\necho gpu-node-7:4\n")
    with pytest.raises(
        ValueError, match=r"lists hosts other than this machine: \['gpu-node-7'\].*horovodrun"
    ):
        Discovery(script=remote).hosts()
    assert Discovery(
        script=_executable(tmp_path / "good.sh", "#!/bin/sh\necho 127.0.0.1:2\n")
    ).hosts() == {"127.0.0.1": 2}


@pytest.mark.parametrize(
    "args, match",
    [
        (["--min-workers", "3", "--max-workers", "2"], r"min_workers must not exceed max_workers"),
        (
            ["--min-workers", "2", "--hosts", "a,b", "--task-index", "0"],
            r"Received: --task-index with it",
        ),
        (
            ["--min-workers", "2", "--nnodes", "2", "--node-rank", "0", "--master-addr", "a"],
            r"Received: --nnodes with it",
        ),
        (
            ["--min-workers", "1", "--horovod", "-n", "2"],
            r"Received: --horovod with it.*horovodrun --min-np",
        ),
        (["--min-workers", "2"], r"needs its most workers or a host discovery"),
        (["--max-workers", "2", "-n", "2"], r"Give -n or --max-workers, not both"),
        (["--host-discovery-script", "/nonexistent/discover.sh"], r"script does not exist"),
        (
            ["-n", "2", "--min-workers", "1", "--elastic-batch", "shrink"],
            r"--elastic-batch: invalid choice: 'shrink'",
        ),
    ],
)
def test_bad_elastic_launches_exit_3_before_anything_starts(tmp_path, args, match):
    """(A value argparse refuses, a usage error, exits 2.)"""
    started = tmp_path / "started"
    result = run_command(
        tfpar_command("launch", *args, "--", PY, "-c", f"open({str(started)!r}, 'w')"), timeout=60
    )
    assert result.returncode == (2 if "invalid choice" in match else 3) and re.search(
        match, result.output
    ), result.output
    assert not started.exists()


JOB = textwrap.dedent("""
    import json, os, sys, time
    tf = json.loads(os.environ["TF_CONFIG"])
    n, i, a = len(tf["cluster"]["worker"]), tf["task"]["index"], \
int(os.environ["TFPAR_RESTART_COUNT"])
    state, hosts = os.environ["TFPAR_LAUNCH_DIR"], sys.argv[1]
    print(f"attempt {a} worker {i} of {n}, told {os.environ['TFPAR_ELASTIC']}", flush=True)
    open(os.path.join(state, f"started-{a}-{i}"), "a").close()
    if i == 0:  # as FaultTolerance does: the job backs up
        open(os.path.join(state, "fault_tolerance"), "a").close()
    if a == 0 and i == 2:  # its host goes away for good, and it dies, once the others have started
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(os.path.exists(os.path.join(state, \
f"started-0-{w}")) for w in (0, 1)):
            time.sleep(0.05)
        open(hosts, "w").write("127.0.0.1:2\\n")
        sys.exit(3)
    if a == 1 and i == 0:  # capacity returns; a backup follows the launcher's request
        open(hosts, "w").write("127.0.0.1:2\\nlocalhost:1\\n")
        while not os.path.exists(os.path.join(state, "grow")):
            time.sleep(0.05)
        print("grow requested", flush=True)
        open(os.path.join(state, "backed_up"), "a").close()
        os.utime(os.path.join(state, "backed_up"))
        time.sleep(60)  # the chief waits to be stopped
    if a == 1 and i == 1:
        time.sleep(60)
""")


def test_an_elastic_launch_shrinks_on_a_lost_host_and_grows_back_at_the_next_backup(tmp_path):
    hosts, job = tmp_path / "hosts", tmp_path / "job.py"
    hosts.write_text("127.0.0.1:2\nlocalhost:1\n")
    job.write_text(JOB)
    result = run_command(
        tfpar_command(
            "launch",
            "--min-workers",
            "2",
            "--host-discovery-file",
            str(hosts),
            "--grace",
            "2",
            "--",
            PY,
            str(job),
            str(hosts),
        ),
        timeout=120,
    )
    out = result.output
    assert result.returncode == 0, out
    changes = re.findall(r"tfpar launch: (.*world size \d)", out)
    assert changes == [
        "3 worker(s); world size 3",
        "workers 3 -> 2 (left: localhost slot 0); world size 2",
        "workers 2 -> 3 (joined: localhost slot 0); world size 3",
    ], out
    # told the global batch's 3 workers (the most it has had) each time, and the mode: accumulate by
    # default
    told = set(re.findall(r"attempt \d worker \d of \d, told (.*)", out))
    assert told == {ElasticBatch(3, 2, "accumulate").to_env()}, out
    assert sorted(re.findall(r"attempt (\d) worker (\d) of (\d)", out)) == [
        ("0", "0", "3"),
        ("0", "1", "3"),
        ("0", "2", "3"),
        ("1", "0", "2"),
        ("1", "1", "2"),
        ("2", "0", "3"),
        ("2", "1", "3"),
        ("2", "2", "3"),
    ]
    assert "growing the job after its next backup" in out and "grow requested" in out
    assert "a backup to start them from; restarting the workers" in out


def test_too_few_slots_wait_then_fail_naming_the_minimum(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1:1\n")
    result = run_command(
        tfpar_command(
            "launch",
            "--min-workers",
            "2",
            "--host-discovery-file",
            str(hosts),
            "--elastic-timeout",
            "2",
            "--",
            PY,
            "-c",
            "pass",
        ),
        timeout=60,
    )
    assert result.returncode != 0
    assert "waiting up to 2 s for the host discovery file" in result.output
    assert re.search(r"1 worker slot\(s\) for 2 s, fewer than --min-workers 2", result.output), (
        result.output
    )


def test_a_job_without_a_backup_is_not_grown(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1:1\n")
    body = f"import time\nopen({str(hosts)!r}, 'w').write('127.0.0.1:2\\n')\ntime.sleep(3)\n"
    result = run_command(
        tfpar_command("launch", "--host-discovery-file", str(hosts), "--", PY, "-c", body),
        timeout=60,
    )
    assert result.returncode == 0, result.output
    assert (
        "not growing: the command makes no tfpar.callbacks.FaultTolerance backup" in result.output
    )
    assert "joined" not in result.output
    assert not os.path.exists(tmp_path / "grow")


def test_a_mid_epoch_resume_must_find_the_backed_up_steps():
    """`check_resume`: another number of workers is fine where a step's examples do not depend on it
    (DATA sharding, or one worker); whole-file shards, or another global batch, are refused with the
    fix."""
    from tfpar.data.resume import check_resume

    def layout(workers, policy="data", batch=48):
        return {
            "global_batch_size": batch,
            "num_workers": workers,
            "shard_policy": policy,
            "resizable": policy == "data" or workers == 1,
        }

    check_resume(layout(3), layout(2), epoch=1, step=5)
    check_resume(layout(1, "off"), layout(3), epoch=1, step=5)
    check_resume(layout(3, "file"), layout(3, "file"), epoch=1, step=5)
    with pytest.raises(
        ValueError,
        match=r"epoch 2 at step 6, with 3 workers reading shard_policy='file'.*"
        r"Pass shard_policy=\"data\"",
    ):
        check_resume(layout(3, "file"), layout(2, "file"), epoch=1, step=5)
    with pytest.raises(
        ValueError, match=r"global batches of 48 examples. Received: global_batch_size=96"
    ):
        check_resume(layout(3), layout(2, batch=96), epoch=1, step=5)


def test_a_resume_with_another_global_batch_continues_at_the_backed_up_example_under_scale_lr():
    """`rescaled_resume`: step 5 of global batches of 48 is example 240: step 7 of batches of 32,
    its first 16 examples trained already; step 10 of batches of 24, none; the same batch, the same
    step. Without scale-lr on both sides (or under FILE sharding) another global batch is refused as
    before."""
    from tfpar.data.resume import rescaled_resume

    def layout(batch, scale_lr=True, policy="data"):
        return {
            "global_batch_size": batch,
            "num_workers": batch // 16,
            "shard_policy": policy,
            "resizable": policy == "data",
            "scale_lr": scale_lr,
            "epoch": 1,
            "step": 5,
        }

    assert rescaled_resume(layout(48), layout(32), 5) == (7, 240)
    assert rescaled_resume(layout(48), layout(24), 5) == (10, 240)
    assert rescaled_resume(layout(48), layout(48), 5) == (5, 0)
    for saved, now in ((layout(48, False), layout(32)), (layout(48), layout(32, False))):
        with pytest.raises(
            ValueError, match=r"global batches of 48 examples. Received: global_batch_size=32"
        ):
            rescaled_resume(saved, now, 5)
    with pytest.raises(ValueError, match=r"shard_policy='file'"):
        rescaled_resume(layout(48, policy="file"), layout(32, policy="file"), 5)


def test_discovery_that_fails_while_the_job_runs_is_said_and_the_job_goes_on(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1:1\n")
    body = (
        f"import time\nopen({str(hosts)!r}, 'w').write('127.0.0.1:one\\n')\ntime.sleep(2.5)\n"
        f"open({str(hosts)!r}, 'w').write('127.0.0.1:1\\n')\ntime.sleep(1.5)\nprint('finished', "
        "flush=True)\n"
    )
    result = run_command(
        tfpar_command("launch", "--host-discovery-file", str(hosts), "--", PY, "-c", body),
        timeout=60,
    )
    assert result.returncode == 0, result.output
    assert "printed line 1 that is not host:slots" in result.output
    assert "the job goes on with its 1 worker(s), asking again" in result.output
    assert result.output.count("the job goes on") == 1 and "restarting" not in result.output
    assert "[worker 0] finished" in result.output


def test_discovery_broken_at_a_restart_is_asked_again_until_it_answers(tmp_path):
    """A worker fails while the discovery file is half-written: the launcher asks again (saying it
    waits for the minimum), and restarts the job once the file answers."""
    import threading
    import time

    hosts, broken = tmp_path / "hosts", tmp_path / "broken"
    hosts.write_text("127.0.0.1:1\n")
    body = (
        "import os, sys\n"
        "if os.environ['TFPAR_RESTART_COUNT'] == '0':\n"
        f"    open({str(hosts)!r}, 'w').write('127.0.0.1:')\n"
        f"    open({str(broken)!r}, 'w').close()\n"
        "    sys.exit(3)\n"
        "print('attempt', os.environ['TFPAR_RESTART_COUNT'], flush=True)\n"
    )

    def repair():
        deadline = time.monotonic() + 60
        while not broken.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.5)
        hosts.write_text("127.0.0.1:1\n")

    repairer = threading.Thread(target=repair, daemon=True)
    repairer.start()
    result = run_command(
        tfpar_command(
            "launch",
            "--host-discovery-file",
            str(hosts),
            "--max-restarts",
            "1",
            "--",
            PY,
            "-c",
            body,
        ),
        timeout=60,
    )
    repairer.join(timeout=60)
    assert result.returncode == 0, result.output
    assert "0 worker slot(s), fewer than --min-workers 1; waiting up to 600 s" in result.output
    assert "[worker 0] attempt 1" in result.output
