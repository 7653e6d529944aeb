"""An elastic job against the same job undisturbed: 3 workers of `tfpar launch`, FaultTolerance every 5
steps over a seeded tfpar.data input (480 examples, global batch 48, 5 epochs; the job of
tests/multiproc/scripts/exactly_once.py). In the elastic run worker 2 is lost for good at step 7 of
epoch 2 (SIGKILL, its host out of the discovery file), the job goes on with 2 and grows back to 3
when the host returns in epoch 4.

    python bench/elastic.py [--quick]
    RESULT elastic loss_undisturbed=<final loss, 3 workers throughout> loss_elastic=<final loss, resized>
        loss_rel_diff=<|elastic - undisturbed| / undisturbed> recovery_seconds=<loss -> next training step>
        grow_seconds=<host back -> first step on 3 workers> elastic_seconds=<wall> undisturbed_seconds=<wall>

Every step holds the same examples whatever the number of workers (tfpar.data deals the job's
order step by step) and the global batch stays 48 (on 2 workers each replica computes its 24 in 2
micro-batches of 12, no larger than the 16 of 3 workers, and applies their mean gradient once), so the
two runs take the same steps: the losses differ only by the rounding of sums taken in another order.
--quick changes nothing (the job is small).
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
SCRIPT = os.path.join(ROOT, "tests", "multiproc", "scripts", "exactly_once.py")


def run(folder, elastic):
    """Runs the job; returns (its output, wall seconds)."""
    records, hosts = os.path.join(folder, "records"), os.path.join(folder, "hosts")
    os.makedirs(records)
    with open(hosts, "w") as f:
        f.write("127.0.0.1:2\nlocalhost:1\n")
    launch = ["--min-workers", "2", "--host-discovery-file", hosts] if elastic else ["-n", "3"]
    command = [sys.executable, "-m", "tfpar.cli", "launch", *launch, "--", sys.executable, SCRIPT,
               os.path.join(folder, "backup"), records, "--elastic", hosts, *([] if elastic else ["--undisturbed"])]
    start = time.perf_counter()
    done = subprocess.run(command, env={**os.environ, "PYTHONPATH": ROOT, "TFPAR_TEST_KERAS": "2"},
                          capture_output=True, text=True, timeout=900, check=False)
    seconds = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"the {'elastic' if elastic else 'undisturbed'} job failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout, seconds


def first_step(records, attempt):
    """The wall clock of the first step any worker of ``attempt`` recorded."""
    return min(json.loads(line)["time"] for name in os.listdir(records) if name.startswith(f"attempt{attempt}-")
               for line in open(os.path.join(records, name)).read().splitlines())


def main():
    quick_options(__doc__)
    with tempfile.TemporaryDirectory() as folder:
        undisturbed, undisturbed_seconds = run(os.path.join(folder, "undisturbed"), elastic=False)
        elastic, elastic_seconds = run(os.path.join(folder, "elastic"), elastic=True)
        records = os.path.join(folder, "elastic", "records")
        lost = float(open(os.path.join(records, "lost")).read())
        back = os.path.getmtime(os.path.join(records, "back"))
        recovery, grow = first_step(records, 1) - lost, first_step(records, 2) - back
    loss = {name: float(re.search(r"LOSS (\S+)", out).group(1)) for name, out in
            (("undisturbed", undisturbed), ("elastic", elastic))}
    for line in elastic.splitlines():
        if line.startswith("tfpar launch:") or "tfpar: resumed" in line:
            print(line)
    print(f"RESULT elastic loss_undisturbed={loss['undisturbed']:.8g} loss_elastic={loss['elastic']:.8g} "
          f"loss_rel_diff={abs(loss['elastic'] - loss['undisturbed']) / loss['undisturbed']:.2e} "
          f"recovery_seconds={recovery:.1f} grow_seconds={grow:.1f} elastic_seconds={elastic_seconds:.1f} "
          f"undisturbed_seconds={undisturbed_seconds:.1f}")


if __name__ == "__main__":
    main()
