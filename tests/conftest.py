"""Test-session set-up: two virtual CPU devices, before anything touches TensorFlow.

Three tiers: tests/unit (pure logic), tests/devices (this process, virtual CPU
devices), tests/multiproc (real processes on 127.0.0.1, started and stopped by
the tests with bounded timeouts).
"""

import importlib.util
import os
import re
import signal
import subprocess
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Every process the tests start keeps its servers on loopback (tfpar._local.loopback): a test that
# checks what tfpar itself does without it removes LD_PRELOAD for its child.
from tfpar._local import loopback as _loopback  # noqa: E402

os.environ.update(_loopback.child_env(dict(os.environ)))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_DEVICES = 2


def pytest_configure(config):
    import tfpar

    tfpar.configure_devices(NUM_DEVICES)


TIERS = ("multiproc", "devices", "unit")  # the slowest first: the fast ones fill the end


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """How the test processes of ``--dist loadgroup`` (pytest.ini) share the tests: one at a time,
    but the tests that share a session fixture of this conftest together (``doctor``: it is made
    once, not once per test process), then those of a file that share a module fixture, and a test
    that names its group joins it (group "ray": test_ray.py and the documentation's Ray block, one
    local Ray cluster at a time). The multi-process tier goes first, so that the last tests are
    short ones."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            groups = {
                _sharing_group(d, item)
                for ds in item._fixtureinfo.name2fixturedefs.values()
                for d in ds
            }
            groups.discard(None)
            session = groups - {item.module.__name__}  # a session fixture's group first
            item.add_marker(pytest.mark.xdist_group(min(session or groups or {item.nodeid})))
    items.sort(key=lambda item: TIERS.index(os.path.relpath(str(item.path), ROOT).split(os.sep)[1]))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's, in the process that hands out the tests
def pytest_xdist_node_collection_finished(node, ids):
    """Stops a run whose groups did not hold: pytest-xdist's ``--dist loadgroup`` names a test's
    group in its node id, and where that is lost (pytest 9.2 with pytest-xdist 3.8:
    pytest-dev/pytest-xdist#1386) the tests of a group spread over the test processes, each making
    the group's shared job again, and nothing else fails."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    lost = [nodeid for nodeid in ids if "@" not in nodeid]  # every test has a group here
    if lost:
        from importlib.metadata import version

        pytest.exit(
            f"--dist loadgroup lost the groups of {len(lost)} tests (e.g. {lost[0]}): pytest-xdist "
            f"{version('pytest-xdist')} cannot group under pytest {pytest.__version__}; install "
            "the dev extra's versions (pip install -e '.[dev]')",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def _sharing_group(fixturedef, item):
    """The group of the tests that share ``fixturedef`` (made once in a test process), or None: a
    session fixture of this conftest groups by its name, a module fixture of the tests by module
    (or by the group the module names: ``pytestmark = pytest.mark.xdist_group(...)``)."""
    if fixturedef.scope == "session" and fixturedef.func.__module__ == __name__:
        return fixturedef.argname
    if fixturedef.scope == "module" and fixturedef.func.__module__.startswith("tests."):
        named = item.getparent(pytest.Module).get_closest_marker("xdist_group")
        return named.args[0] if named is not None else item.module.__name__
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef, request):
    """A shared fixture made for a test outside its group would be made again in another test
    process: a test that takes one through ``request.getfixturevalue`` is invisible to the grouping
    above, so it must name the fixture as an argument."""
    item = getattr(request, "_pyfuncitem", None)
    wanted = _sharing_group(fixturedef, item) if item is not None else None
    marker = item.get_closest_marker("xdist_group") if wanted else None
    if marker is not None and marker.args and marker.args[0] != wanted:
        pytest.fail(
            f"{item.nodeid} takes the {fixturedef.scope} fixture {fixturedef.argname!r} outside "
            "its group "
            f"{wanted!r} (through request.getfixturevalue?): name it as an argument of the test"
        )


def _cpu_seconds():
    """CPU time of this process and of every child it has waited for (theirs include their own
    waited-for children: a launcher's workers count toward the test that ran the launcher)."""
    import resource

    return sum(
        resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report carries the CPU seconds it took, its processes' included: two cores are
    shared by everything that runs, so CPU, not wall time, is what a test costs the run."""
    outcome = yield
    now = _cpu_seconds()
    outcome.get_result().user_properties.append(
        ("cpu", now - getattr(item, "_tfpar_cpu_mark", now))
    )
    item._tfpar_cpu_mark = now


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._tfpar_cpu_mark = _cpu_seconds()


def pytest_terminal_summary(terminalreporter):
    """Each tier's time and CPU (sums of its tests' set-up, call and tear-down, in every test
    process), and the tests that took the most CPU."""
    times, cpus, by_test = dict.fromkeys(TIERS, 0.0), dict.fromkeys(TIERS, 0.0), {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            tier = getattr(report, "nodeid", "").split("/")[1:2]
            if getattr(report, "when", None) and tier and tier[0] in times:
                cpu = dict(report.user_properties).get("cpu", 0.0)
                times[tier[0]] += report.duration
                cpus[tier[0]] += cpu
                nodeid = report.nodeid.split("@", 1)[0]  # under --dist loadgroup: "nodeid@group"
                by_test[nodeid] = by_test.get(nodeid, 0.0) + cpu
    terminalreporter.write_line(
        "tier times (sums of test durations): "
        + ", ".join(f"{tier} {seconds:.0f} s" for tier, seconds in times.items())
    )
    terminalreporter.write_line(
        "tier CPU (the tests' processes included): "
        + ", ".join(f"{tier} {seconds:.0f} s" for tier, seconds in cpus.items())
    )
    costs_file = os.environ.get("TFPAR_TEST_COSTS")
    if costs_file:  # every test's CPU, for planning CI's budget
        import json

        with open(costs_file, "w", encoding="utf-8") as f:
            json.dump(dict(sorted(by_test.items(), key=lambda kv: -kv[1])), f, indent=0)
    terminalreporter.write_line("the tests that took the most CPU:")
    for nodeid, cpu in sorted(by_test.items(), key=lambda kv: -kv[1])[:30]:
        terminalreporter.write_line(f"{cpu:8.1f} s  {nodeid}")


class Finished:
    """A finished command: returncode and combined output."""

    def __init__(self, returncode, output):
        self.returncode = returncode
        self.output = output


def run_command(args, timeout, env=None, cwd=ROOT):
    """Runs ``args`` in its own session; kills the whole group on timeout (test fails).

    ``env`` adds to this process's environment; a value of None removes that variable.
    """
    full_env = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(
            f"{args} did not finish in {timeout} s:\n{output.decode(errors='replace')[-4000:]}"
        )
    return Finished(proc.returncode, output.decode(errors="replace"))


def in_turn_failure(output):
    """What a failed job of tests/multiproc/scripts/in_turn.py says: the script that failed first
    (its "IN TURN FAILED" line) and the end of the job's output."""
    failed = [line for line in output.splitlines() if "IN TURN FAILED" in line]
    return "\n".join([*failed[:1], output[-4000:]])


HOROVOD_INSTALLED = importlib.util.find_spec("horovod") is not None


@pytest.fixture
def horovod_installed():
    """Skips a test without Horovod, but fails it under CI (CI=true), which installs Horovod:
    there a missing Horovod is a broken install, not a reason to skip."""
    if not HOROVOD_INSTALLED:
        message = "Horovod is not installed (install it: tfpar install-horovod)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI installs it, so its install is broken")
        pytest.skip(message)


# A user's shell: none of what this process set for itself (tfpar's import sets
# TF_USE_LEGACY_KERAS).
USER_SHELL = {"TF_USE_LEGACY_KERAS": None, "PYTHONPATH": None}


DOCUMENTS = (
    "README.md",
    *sorted(
        os.path.relpath(os.path.join(folder, name), ROOT)
        for folder, _, names in os.walk(os.path.join(ROOT, "docs"))
        for name in names
        if name.endswith(".md")
    ),
)
"""The documents whose code blocks are tested: the README and every page of the site."""
_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)


def public_modules():
    """``tfpar`` and every module of it with no private part in its name."""
    import pkgutil

    import tfpar

    names = ["tfpar"]
    for info in pkgutil.walk_packages(tfpar.__path__, prefix="tfpar."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def document_blocks(languages=("bash", "python")):
    """``[(document, language, text, line)]``: every block of those languages in `DOCUMENTS`, a
    block that appears in several documents only where it appears first."""
    blocks, seen = [], set()
    for document in DOCUMENTS:
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            text = f.read()
        for match in _BLOCK.finditer(text):
            if match.group(1) in languages and match.group(2) not in seen:
                seen.add(match.group(2))
                blocks.append(
                    (
                        document,
                        match.group(1),
                        match.group(2),
                        text[: match.start()].count("\n") + 1,
                    )
                )
    return blocks


def docs_command(command):
    """The argv of ``command``, a whole line of a bash block of the documentation (its comment left
    out): a test that runs a documented command with more checks than tests/multiproc/test_docs.py
    (which then leaves that line out: LINES_RUN_ELSEWHERE) takes it from here, so the two stay one
    text."""
    import shlex

    lines = [
        line.split("#", 1)[0].strip()
        for _, _, block, _ in document_blocks(("bash",))
        for line in block.splitlines()
    ]
    assert lines.count(command) == 1, (
        f"the documentation's bash blocks have {command!r} {lines.count(command)} time(s), not once"
    )
    return shlex.split(command)


@pytest.fixture(scope="session")
def doctor():
    """``tfpar doctor`` as the documentation writes it and a user's shell runs it, once for the
    tests that read its report."""
    result = run_command(docs_command("tfpar doctor"), timeout=240, env=USER_SHELL)
    assert result.returncode == 0, result.output[-2000:]
    return result


@pytest.fixture(params=["tf_keras", "keras3"])
def any_keras(request):
    """The Keras module a shared scenario runs under: tf_keras (tfpar.keras), then Keras 3."""
    import tfpar

    return tfpar.keras if request.param == "tf_keras" else importlib.import_module("keras")


def tfpar_command(*args):
    """The argv that runs the ``tfpar`` command with this interpreter."""
    return [sys.executable, "-m", "tfpar.cli", *args]


def run_json_script(script, timeout):
    """Runs a Python script of tests/ in its own process; returns the last JSON line it printed."""
    import json

    result = run_command([sys.executable, script], timeout=timeout, env={"PYTHONPATH": ROOT})
    assert result.returncode == 0, result.output[-4000:]
    return json.loads([line for line in result.output.splitlines() if line.startswith("{")][-1])


def trace_tracks(trace):
    """A `tfpar.callbacks.Timeline` trace's spans: {(worker, track name): [events by start]} (events
    on no named track, Horovod's merged ones, left out)."""
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("name") == "thread_name"
    }
    tracks = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and (e["pid"], e.get("tid")) in names:
            tracks.setdefault((e["pid"], names[e["pid"], e["tid"]]), []).append(e)
    return {key: sorted(events, key=lambda e: e["ts"]) for key, events in tracks.items()}
