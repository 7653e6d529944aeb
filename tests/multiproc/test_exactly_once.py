"""Exactly once across a mid-epoch resume: the job of tests/multiproc/scripts/exactly_once.py,
killed at step 6 of epoch 2 with a backup every 5 steps, under tfpar launch --max-restarts 1 (both
Kerases) and under horovodrun run again as a scheduler would. Every epoch's example ids, counted
from what the replicas trained on, are each there exactly once."""

import collections
import json
import os
import re
import sys

from tests.conftest import ROOT, run_command, tfpar_command

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "exactly_once.py")
EXAMPLES, EPOCHS = 320, 4


def trained_per_epoch(records, resumed_at):
    """epoch -> Counter of the ids the replicas trained on: an attempt's steps from the next
    attempt's resume point on do not count (the backup rolled them back), the last attempt's all
    do."""
    counts = collections.defaultdict(collections.Counter)
    for path in sorted(records.glob("attempt*")):
        attempt = int(re.match(r"attempt(\d+)-", path.name).group(1))
        for line in path.read_text().splitlines():
            step = json.loads(line)
            if attempt < len(resumed_at) and (step["epoch"], step["step"]) >= resumed_at[attempt]:
                continue
            counts[step["epoch"]].update(step["ids"])
    return counts


def resume_points(output):
    """(epoch, step), 0-based, of each resume the chief printed, in order."""
    return [
        (int(e) - 1, int(s or 1) - 1)
        for e, s in re.findall(
            r"tfpar: resumed from the backup in \S+ at epoch (\d+)(?:, step (\d+))?", output
        )
    ]


def assert_exactly_once(records, output, examples=EXAMPLES, epochs=EPOCHS, resumes=1):
    resumed_at = resume_points(output)
    assert len(resumed_at) == resumes, output[-3000:]
    # the backup after step 5 of epoch 2 (save_freq=5, 10 steps an epoch)
    assert resumed_at[0] == (1, 5)
    counts = trained_per_epoch(records, resumed_at)
    assert sorted(counts) == list(range(epochs))
    for epoch, seen in counts.items():
        twice = sum(1 for n in seen.values() if n > 1)
        never = examples - len(seen)
        assert (twice, never) == (0, 0), (
            f"epoch {epoch + 1}: {twice} examples trained twice, {never} never"
        )
        assert set(seen) == set(range(1, examples + 1))
    return resumed_at


def test_a_mid_epoch_resume_trains_every_example_exactly_once(tmp_path):
    """Keras 3 here; tf_keras' mid-epoch resume is the elastic test's."""
    records = tmp_path / "records"
    records.mkdir()
    result = run_command(
        tfpar_command(
            "launch",
            "-n",
            "2",
            "--max-restarts",
            "1",
            "--",
            sys.executable,
            SCRIPT,
            str(tmp_path / "backup"),
            str(records),
        ),
        timeout=300,
        env={"PYTHONPATH": ROOT, "TFPAR_TEST_KERAS": "3"},
    )
    assert result.returncode == 0, result.output[-4000:]
    assert (
        "tfpar launch: restart 1 of 1" in result.output
        and "worker 1 was killed by SIGKILL" in result.output
    )
    assert "DONE" in result.output
    assert_exactly_once(records, result.output)


def test_an_elastic_job_loses_a_worker_mid_epoch_and_gets_it_back_with_every_example_once(tmp_path):
    """The issue's resize, in one job: 3 workers (two on 127.0.0.1, one on localhost, from a
    discovery file); worker 2 is lost for good at step 7 of epoch 2 (SIGKILL, localhost out of the
    file; backups every 5 steps), the job resumes at step 6 on 2 workers, each replica computing its
    share of the global batch in 2 micro-batches, localhost comes back in epoch 4 and the job grows
    to 3 after its next backup. Every example of every epoch is trained on exactly once, counted
    from the ids the replicas trained on, the rolled-back steps left out; the seconds from the loss
    to the next step are printed."""
    records, hosts = tmp_path / "records", tmp_path / "hosts"
    records.mkdir()
    hosts.write_text("127.0.0.1:2\nlocalhost:1\n")
    result = run_command(
        tfpar_command(
            "launch",
            "--min-workers",
            "2",
            "--host-discovery-file",
            str(hosts),
            "--",
            sys.executable,
            SCRIPT,
            str(tmp_path / "backup"),
            str(records),
            "--elastic",
            str(hosts),
        ),
        timeout=420,
        env={"PYTHONPATH": ROOT, "TFPAR_TEST_KERAS": "2"},
    )
    assert result.returncode == 0, result.output[-4000:]
    out = result.output
    assert "tfpar launch: 3 worker(s); world size 3" in out
    assert "tfpar launch: workers 3 -> 2 (left: localhost slot 0); world size 2" in out, out[-4000:]
    assert "growing the job after its next backup" in out
    assert "tfpar launch: workers 2 -> 3 (joined: localhost slot 0); world size 3" in out, out[
        -4000:
    ]
    assert_resized_exactly_once(records, out, "accumulate")


def test_an_elastic_job_across_nodes_loses_a_host_mid_epoch_and_grows_back_with_every_example_once(
    tmp_path,
):
    """The same job as torchrun's users start one on several hosts: `tfpar launch --nnodes 2:3
    --master-addr 127.0.0.1` three times, the same line, a worker each, under --elastic-batch
    scale-lr. Worker 2's host is lost at step 7 of epoch 2 (its agent SIGKILLed, then the worker);
    the 2 nodes left resume at step 6 with global batches of 32 (each replica's 16 as on 3 workers),
    the learning rate x2/3, from example 241 in step 8; in epoch 4 a fourth agent joins and the job
    grows to 3 nodes after its next backup. Every example of every epoch once; each agent's process
    is counted at the end."""
    from tests.multiproc.elastic_agents import run_agents

    codes, outs = run_agents(str(tmp_path), "scale-lr")
    records, out = tmp_path / "records", outs[0]
    # agents 1 and 2 joined in either order
    lost = [i for i, o in enumerate(outs) if "round 0: node 2 of 3" in o]
    assert lost in ([1], [2]) and codes == [0, 0, 0, 0][: lost[0]] + [-9] + [0] * (3 - lost[0]), (
        "\n=====\n".join(o[-3000:] for o in outs)
    )
    name = re.compile(r"\S+\[\d+\]")
    assert "tfpar launch: 3 node(s); world size 3" in out
    assert re.search(rf"tfpar launch: nodes 3 -> 2 \(left: {name.pattern}\); world size 2", out), (
        out[-4000:]
    )
    assert re.search(rf"{name.pattern} joined; growing the job after its next backup", out), out[
        -4000:
    ]
    assert re.search(
        rf"tfpar launch: nodes 2 -> 3 \(joined: {name.pattern}\); world size 3", out
    ), out[-4000:]
    assert "round 2: node 2 of 3: workers 2 to 2 of 3" in outs[3] and "round 1" not in outs[3]
    assert_resized_exactly_once(records, out, "scale-lr")


def assert_resized_exactly_once(records, out, batch):
    """The resize's records: each epoch once; the middle attempt on workers 0 and 1, with the
    batches ``batch`` gives them; the seconds from the loss to the next step printed."""
    resumed = assert_exactly_once(records, out, examples=480, epochs=5, resumes=2)
    assert resumed[1] >= (3, 0), resumed  # the grow-back resumed in epoch 4 or later
    workers = {
        int(re.match(r"attempt(\d+)-worker(\d+)", p.name).group(2))
        for p in records.glob("attempt1-*")
    }
    assert workers == {0, 1}  # the middle attempt trained on 2 workers
    largest = {
        a: max(
            (
                len(json.loads(line)["ids"])
                for p in records.glob(f"attempt{a}-*")
                for line in p.read_text().splitlines()
            ),
            default=0,
        )
        for a in range(3)
    }
    launcher = "\n".join(line for line in out.splitlines() if line.startswith("tfpar launch:"))
    if batch == "accumulate":
        # each of its replicas computed its 24 examples a step in 2 micro-batches of 12, no larger
        # than the 16 of 3
        assert (
            "tfpar: an elastic job on 2 of 3 workers: each replica computes its batch in 2 "
            "micro-batches" in out
        )
        assert largest == {0: 16, 1: 12, 2: 16}, (largest, launcher)
    # 16 a replica throughout; the resume at example 241 (step 8 of 32) carries 16 of its step's 32
    # at weight 0
    else:
        assert (
            "tfpar: an elastic job on 2 of 3 workers: global batch 32, each replica keeping the "
            "full job's batch; "
            "the learning rate is multiplied by 0.6667 (scale-lr: the linear scaling rule)" in out
        )
        assert (
            "at epoch 2, step 6 (its example 241, in step 8 of this job's global batches of 32)"
            in out
        ), out[-4000:]
        assert largest == {0: 16, 1: 16, 2: 16}, (largest, launcher)
        resumed_step = [
            json.loads(p.read_text().splitlines()[0]) for p in records.glob("attempt1-*")
        ]
        assert sorted((r["epoch"], r["step"], len(r["ids"])) for r in resumed_step) == [
            (1, 7, 0),
            (1, 7, 16),
        ], resumed_step
    lost = float((records / "lost").read_text())
    first = min(
        json.loads(line)["time"]
        for p in records.glob("attempt1-*")
        for line in p.read_text().splitlines()
    )
    loss = re.search(r"LOSS (\S+)", out).group(1)
    print(
        f"elastic ({batch}): {first - lost:.1f} s from the loss to the next training step; resumed "
        f"at {resumed}; "
        f"final loss {loss}"
    )


def test_a_mid_epoch_resume_under_horovodrun_trains_every_example_exactly_once(
    tmp_path, horovod_installed
):
    records = tmp_path / "records"
    records.mkdir()
    outputs = []
    for attempt in (0, 1):  # the scheduler starts the job again after the failure
        result = run_command(
            [
                "horovodrun",
                "-np",
                "2",
                "-H",
                "localhost:2",
                "--gloo",
                sys.executable,
                SCRIPT,
                str(tmp_path / "backup"),
                str(records),
                "--horovod",
                "--attempt",
                str(attempt),
            ],
            timeout=300,
            env={"PYTHONPATH": ROOT},
        )
        outputs.append(result.output)
        assert (result.returncode != 0) == (attempt == 0), result.output[-4000:]
    assert "DONE" in outputs[1]
    assert_exactly_once(records, outputs[1])
