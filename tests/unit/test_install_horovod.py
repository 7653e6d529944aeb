"""`tfpar install-horovod`: the sdist and cache checks, the lock, and bad input.

The build itself runs once per CI run, from an empty cache, in `.ci/run`; these tests cover
what guards it, with real processes where two runs meet.
"""

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import textwrap

import pytest

from tests.conftest import ROOT, run_command, tfpar_command
from tfpar import install_horovod as ih
from tfpar.install_horovod import patches


def _tarball(path, size=20_000):
    payload = os.urandom(size)
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("horovod-0.28.1/setup.py")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    return path


def test_a_tampered_sdist_is_refused_before_anything_is_built(tmp_path):
    sdist = _tarball(tmp_path / "horovod-0.28.1.tar.gz")
    cache = tmp_path / "cache"
    result = run_command(
        tfpar_command(
            "install-horovod",
            "--force",
            "--mpi",
            "no",
            "--sdist",
            str(sdist),
            "--cache",
            str(cache),
        ),
        timeout=120,
    )
    assert result.returncode == 1, result.output[-2000:]
    actual = hashlib.sha256(sdist.read_bytes()).hexdigest()
    assert (
        f"tfpar install-horovod: error: The Horovod sdist {sdist} ({sdist.stat().st_size} bytes) "
        "has "
        f"sha256 {actual}, expected {ih.SDIST_SHA256}: it was changed or cut short."
    ) in result.output
    assert os.listdir(cache) == [".lock"]  # no entry, no half-built folder


def test_a_truncated_sdist_is_refused(tmp_path):
    whole = _tarball(tmp_path / "whole.tar.gz").read_bytes()
    cut = tmp_path / "horovod-0.28.1.tar.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(
        ih.InstallError,
        match=rf"\({len(whole) // 2} bytes\) has sha256 .*expected {ih.SDIST_SHA256}",
    ):
        ih.fetch_sdist(str(tmp_path), sdist=str(cut))


def test_a_missing_sdist_file_is_named():
    with pytest.raises(
        ih.InstallError,
        match=r"--sdist must be an existing file. Received: --sdist '/nowhere.tar.gz'",
    ):
        ih.fetch_sdist("/tmp", sdist="/nowhere.tar.gz")


def _fake_build(size=20_000):
    def build(folder):
        with open(os.path.join(folder, "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"), "wb") as f:
            f.write(b"w" * size)

    return build


def test_a_cached_wheel_is_checked_against_its_record(tmp_path):
    entry = str(tmp_path / "entry")
    wheel = ih.wheel_for(entry, _fake_build())
    assert ih.cached_wheel(entry) == wheel
    with open(wheel, "r+b") as f:  # tamper: same size, other bytes
        f.write(b"x")
    with pytest.raises(
        ih.InstallError,
        match=r"cached Horovod wheel .* has sha256 .*changed or cut short. "
        r"Rebuild it: tfpar install-horovod --force",
    ):
        ih.cached_wheel(entry)
    assert ih.wheel_for(entry, _fake_build(), force=True) == wheel  # --force replaces the entry
    assert ih.cached_wheel(entry) == wheel
    os.remove(os.path.join(entry, "wheel.json"))
    with pytest.raises(ih.InstallError, match=r"has no wheel.json record, so it cannot be checked"):
        ih.cached_wheel(entry)


def test_a_failed_build_leaves_no_entry(tmp_path):
    def broken(folder):
        open(os.path.join(folder, "horovod-half.whl"), "wb").write(b"half")
        raise ih.InstallError("compiler died")

    with pytest.raises(ih.InstallError, match="compiler died"):
        ih.wheel_for(str(tmp_path / "entry"), broken)
    assert os.listdir(tmp_path) == []


# Two runs at once: the first builds slowly (a 20,000-byte wheel written in 10 parts over ~2 s);
# the second starts while it writes. It must wait for the lock and then install the whole wheel.
_RACER = textwrap.dedent("""
    import os, sys, time
    from tfpar import install_horovod as ih
    root, timeout = sys.argv[1], float(sys.argv[2])
    def slow_build(folder):
        print("building", flush=True)
        with open(os.path.join(folder, "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"), "wb") as f:
            for _ in range(10):
                f.write(b"w" * 2000); f.flush(); time.sleep(0.2)
    try:
        with ih.cache_lock(root, timeout):
            wheel = ih.wheel_for(os.path.join(root, "entry"), slow_build)
            print("got", os.path.getsize(wheel), flush=True)
    except ih.InstallError as error:
        print("error", error, flush=True)
        sys.exit(1)
""")


def _racer(root, timeout):
    return subprocess.Popen(
        [sys.executable, "-c", _RACER, str(root), str(timeout)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_line(proc, text):
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"{text!r} never came:\n{''.join(lines)}")


def _race(tmp_path, second_timeout):
    """Starts a slow build, then a second run while it writes; returns (first, second) outputs
    with their exit codes. Both processes are gone when it returns."""
    procs = [_racer(tmp_path, 60)]
    try:
        _wait_for_line(procs[0], "building")
        procs.append(_racer(tmp_path, second_timeout))
        outputs = [proc.communicate(timeout=60)[0] for proc in reversed(procs)][::-1]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [(proc.returncode, out) for proc, out in zip(procs, outputs)]


def test_a_second_run_waits_for_the_lock_then_uses_the_whole_wheel(tmp_path):
    (code_first, out_first), (code_second, out_second) = _race(tmp_path, 60)
    assert code_first == 0 and "got 20000" in out_first, out_first
    assert code_second == 0, out_second
    assert "another install-horovod holds" in out_second and "waiting for it" in out_second
    assert "using the cached wheel" in out_second and "sha256 checked" in out_second
    assert "got 20000" in out_second and "building" not in out_second


def test_a_lock_held_too_long_fails_clearly(tmp_path):
    _, (code_second, out_second) = _race(tmp_path, 0.5)
    assert code_second == 1
    assert "waited 0 s for the lock" in out_second and "raise --lock-timeout" in out_second


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(mpi="maybe"),
            r"Unknown mpi 'maybe'. Received: mpi='maybe'. Use one of \['auto', 'yes', 'no'\]",
        ),
        (
            dict(lock_timeout_seconds=0),
            r"lock_timeout_seconds must be a number > 0. Received: lock_timeout_seconds=0",
        ),
        (
            dict(lock_timeout_seconds=float("inf")),
            r"lock_timeout_seconds must be a finite number. Received: lock_timeout_seconds=inf",
        ),
    ],
)
def test_bad_arguments(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        ih.install(cache=str(tmp_path), **kwargs)
    assert os.listdir(tmp_path) == []  # refused before the lock was taken


def test_a_patch_that_does_not_match_fails_loudly(tmp_path):
    path, old, _ = patches.PATCHES[0]
    target = tmp_path / path
    target.parent.mkdir(parents=True)
    target.write_text(old + old)
    with pytest.raises(ih.InstallError, match=rf"exactly once in {path}, found it 2 time\(s\)"):
        ih.apply_patches(str(tmp_path))


def _sdist_shaped_tree(folder, ref_calls=0):
    """Each patch's text once in its file, and each REF_PATCHES file's count of ``v<i>.ref()`` calls
    (plus ``ref_calls``)."""
    for path, old, _ in patches.PATCHES:
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a", encoding="utf-8") as f:
            f.write("# before\n" + old + "# after\n")
    for path, count in patches.REF_PATCHES:
        with open(folder / path, "a", encoding="utf-8") as f:
            f.write("".join(f"refs.add(v{i}.ref())\n" for i in range(count + ref_calls)))


def test_a_ref_patch_with_another_count_fails_loudly_and_writes_nothing(tmp_path):
    _sdist_shaped_tree(tmp_path, ref_calls=1)
    before = {path: (tmp_path / path).read_text() for path, _, _ in patches.PATCHES}
    path, count = patches.REF_PATCHES[0]
    with pytest.raises(
        ih.InstallError,
        match=rf"`<name>.ref\(\)` {count} times in {path}, found it {count + 1} time",
    ):
        ih.apply_patches(str(tmp_path))
    assert {path: (tmp_path / path).read_text() for path, _, _ in patches.PATCHES} == before


def test_patches_apply_to_a_tree_shaped_like_the_sdist(tmp_path):
    _sdist_shaped_tree(tmp_path)
    (tmp_path / "horovod").mkdir(exist_ok=True)
    ih.apply_patches(str(tmp_path))
    for path, old, new in patches.PATCHES:
        text = (tmp_path / path).read_text()
        assert new in text and text.count(old) == 0 or old in new
    for path, count in patches.REF_PATCHES:
        text = (tmp_path / path).read_text()
        assert ".ref()" not in text and text.count("_tfpar_ref(v") == count
    for path, module in ih.ADDED_MODULES.items():
        with open(os.path.join(os.path.dirname(ih.__file__), module)) as f:
            assert (tmp_path / path).read_text() == f.read()
