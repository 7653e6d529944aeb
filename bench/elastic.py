"""An elastic job against the same job undisturbed: 3 workers of `tfpar launch`, FaultTolerance
every 5 steps over a seeded tfpar.data input (480 examples, global batch 48, 5 epochs; the job of
tests/multiproc/scripts/exactly_once.py). In the elastic run worker 2 is lost for good at step 7 of
epoch 2 (SIGKILL, its host out of the discovery file), the job goes on with 2 and grows back to 3
when the host returns in epoch 4.

    python bench/elastic.py [--quick]
    RESULT elastic loss_undisturbed=<final loss, 3 workers throughout>
        loss_elastic=<final loss, resized> loss_rel_diff=<|elastic - undisturbed| / undisturbed>
        recovery_seconds=<loss -> next training step>
        grow_seconds=<host back -> first step on 3 workers> elastic_seconds=<wall>
        undisturbed_seconds=<wall>
    RESULT elastic_scale_lr loss_elastic=<final loss, resized under --elastic-batch scale-lr>
        loss_rel_diff=<against the undisturbed run> recovery_seconds=... grow_seconds=...
        elastic_seconds=...
    RESULT elastic_nodes loss_elastic=<final loss, the same resize across 3 agents of --nnodes 2:3>
        loss_rel_diff=... recovery_seconds=... grow_seconds=... elastic_seconds=...

The elastic_nodes run is the job as torchrun's users start one on several hosts: the same
`tfpar launch --nnodes 2:3 --master-addr 127.0.0.1` line started three times, a worker each;
worker 2's host is lost with its agent (SIGKILLed with it), and a fourth agent joins in epoch 4
(tests/multiproc/elastic_agents.py).

Every step holds the same examples whatever the number of workers (tfpar.data deals the job's
order step by step) and the global batch stays 48 (on 2 workers each replica computes its 24 in 2
micro-batches of 12, no larger than the 16 of 3 workers, and applies their mean gradient once), so
the two runs take the same steps: the losses differ only by the rounding of sums taken in another
order. Under --elastic-batch scale-lr the 2 workers take steps of 32 (16 a replica, as on 3) at two
thirds of the learning rate: other steps, so the final loss differs by what the optimizer's path
does. --quick changes nothing (the job is small).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time

from common import quick_options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tests.multiproc.elastic_agents import run_agents  # noqa: E402

SCRIPT = os.path.join(ROOT, "tests", "multiproc", "scripts", "exactly_once.py")


def run(folder, elastic, batch="accumulate"):
    """Runs the job (elastic: under ``--elastic-batch batch``); returns (its output, wall
    seconds)."""
    records, hosts = os.path.join(folder, "records"), os.path.join(folder, "hosts")
    os.makedirs(records)
    with open(hosts, "w") as f:
        f.write("127.0.0.1:2\nlocalhost:1\n")
    launch = (
        ["--min-workers", "2", "--host-discovery-file", hosts, "--elastic-batch", batch]
        if elastic
        else ["-n", "3"]
    )
    command = [
        sys.executable,
        "-m",
        "tfpar.cli",
        "launch",
        *launch,
        "--",
        sys.executable,
        SCRIPT,
        os.path.join(folder, "backup"),
        records,
        "--elastic",
        hosts,
        *([] if elastic else ["--undisturbed"]),
    ]
    start = time.perf_counter()
    done = subprocess.run(
        command,
        env={**os.environ, "PYTHONPATH": ROOT, "TFPAR_TEST_KERAS": "2"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(
            f"the {'elastic' if elastic else 'undisturbed'} job failed:\n"
            f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done.stdout, seconds


def first_step(records, attempt):
    """The wall clock of the first step any worker of ``attempt`` recorded."""
    return min(
        json.loads(line)["time"]
        for name in os.listdir(records)
        if name.startswith(f"attempt{attempt}-")
        for line in open(os.path.join(records, name)).read().splitlines()
    )


def times(folder):
    """(recovery, grow) seconds of the elastic run in ``folder``."""
    records = os.path.join(folder, "records")
    lost = float(open(os.path.join(records, "lost")).read())
    back = os.path.getmtime(os.path.join(records, "back"))
    return first_step(records, 1) - lost, first_step(records, 2) - back


def main():
    quick_options(__doc__)
    with tempfile.TemporaryDirectory() as folder:
        runs = {"undisturbed": run(os.path.join(folder, "undisturbed"), elastic=False)}
        for batch in ("accumulate", "scale-lr"):
            runs[batch] = run(os.path.join(folder, batch), elastic=True, batch=batch)
        start = time.perf_counter()
        codes, outs = run_agents(os.path.join(folder, "nodes"), "accumulate")
        if sorted(codes) != [-9, 0, 0, 0]:
            sys.exit(
                "the elastic job across agents failed:\n"
                + "\n=====\n".join(o[-3000:] for o in outs)
            )
        runs["nodes"] = (outs[0], time.perf_counter() - start)
        seconds = {
            name: times(os.path.join(folder, name)) for name in ("accumulate", "scale-lr", "nodes")
        }
    loss = {name: float(re.search(r"LOSS (\S+)", out).group(1)) for name, (out, _) in runs.items()}
    for batch in ("accumulate", "scale-lr", "nodes"):
        for line in runs[batch][0].splitlines():
            if (
                line.startswith("tfpar launch:")
                or "tfpar: resumed" in line
                or "tfpar: an elastic job" in line
            ):
                print(line)
    relative = {
        b: abs(loss[b] - loss["undisturbed"]) / loss["undisturbed"]
        for b in ("accumulate", "scale-lr", "nodes")
    }
    print(
        f"RESULT elastic loss_undisturbed={loss['undisturbed']:.8g} "
        f"loss_elastic={loss['accumulate']:.8g} "
        f"loss_rel_diff={relative['accumulate']:.2e} "
        f"recovery_seconds={seconds['accumulate'][0]:.1f} "
        f"grow_seconds={seconds['accumulate'][1]:.1f} elastic_seconds={runs['accumulate'][1]:.1f} "
        f"undisturbed_seconds={runs['undisturbed'][1]:.1f}"
    )
    print(
        f"RESULT elastic_scale_lr loss_elastic={loss['scale-lr']:.8g} "
        f"loss_rel_diff={relative['scale-lr']:.2e} "
        f"recovery_seconds={seconds['scale-lr'][0]:.1f} grow_seconds={seconds['scale-lr'][1]:.1f} "
        f"elastic_seconds={runs['scale-lr'][1]:.1f}"
    )
    print(
        f"RESULT elastic_nodes loss_elastic={loss['nodes']:.8g} "
        f"loss_rel_diff={relative['nodes']:.2e} "
        f"recovery_seconds={seconds['nodes'][0]:.1f} grow_seconds={seconds['nodes'][1]:.1f} "
        f"elastic_seconds={runs['nodes'][1]:.1f}"
    )


if __name__ == "__main__":
    main()
