"""The wheel cache of `tfpar install-horovod`: one lock per run, atomic entries, checked wheels.

An entry is a folder holding one wheel and ``wheel.json`` (its file name and sha256). It is
built in a temporary folder beside the cache and renamed into place, so an entry is either
complete and checkable or absent; a wheel is checked against its record before it is used.
"""

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "InstallError",
    "build_into_cache",
    "cache_lock",
    "cached_wheel",
    "check_sha256",
    "say",
    "sha256_of",
    "wheel_for",
]


class InstallError(RuntimeError):
    """A step of the install failed; the message says which and what to do."""


def say(message: str) -> None:
    print(f"tfpar install-horovod: {message}", flush=True)


def sha256_of(path: str) -> str:
    """The hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path: str, expected: str, what: str, fix: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise InstallError(
            f"{what} {path} ({os.path.getsize(path)} bytes) has sha256 {actual}, expected "
            f"{expected}: it was changed or cut short. {fix}"
        )


@contextlib.contextmanager
def cache_lock(cache_root: str, timeout_seconds: float) -> Iterator[None]:
    """Holds ``cache_root/.lock`` (flock) for a whole run; waits at most ``timeout_seconds`` for
    it."""
    os.makedirs(cache_root, exist_ok=True)
    with open(os.path.join(cache_root, ".lock"), "a+") as lock:
        deadline = time.monotonic() + timeout_seconds
        told = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    say(
                        f"another install-horovod holds {lock.name}: waiting for it (at most "
                        f"{timeout_seconds:.0f} s)"
                    )
                    told = True
                if time.monotonic() > deadline:
                    raise InstallError(
                        f"waited {timeout_seconds:.0f} s for the lock {lock.name}, held by another "
                        "install-horovod. Let it finish, or raise --lock-timeout."
                    ) from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cached_wheel(entry: str) -> str | None:
    """The wheel of a cache entry after checking it against its record; None where there is no
    entry."""
    record_path = os.path.join(entry, "wheel.json")
    if not os.path.isdir(entry):
        return None
    fix = f"Rebuild it: tfpar install-horovod --force (or delete {entry})."
    if not os.path.exists(record_path):
        raise InstallError(
            f"The cached Horovod build {entry} has no wheel.json record, so it cannot be checked. "
            f"{fix}"
        )
    with open(record_path, encoding="utf-8") as f:
        record = json.load(f)
    wheel = os.path.join(entry, record["wheel"])
    if not os.path.isfile(wheel):
        raise InstallError(
            f"The cached Horovod wheel {wheel} named by {record_path} is missing. {fix}"
        )
    check_sha256(wheel, record["sha256"], "The cached Horovod wheel", fix)
    return wheel


def build_into_cache(entry: str, build: Callable[[str], Any], note: dict | None = None) -> str:
    """Runs ``build(folder)`` in a temporary folder beside ``entry``, then renames it into place.

    The wheel's sha256 (and ``note``, a dict) is recorded in ``wheel.json`` before the rename, so an
    entry is either complete and checkable or absent. Call it holding `cache_lock`.
    """
    parent = os.path.dirname(entry)
    # left by a killed run; we hold the lock
    for stale in glob.glob(os.path.join(parent, ".building-*")):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=".building-", dir=parent)
    os.chmod(tmp, 0o755)
    try:
        build(tmp)
        wheels = glob.glob(os.path.join(tmp, "horovod-*.whl"))
        if len(wheels) != 1:
            raise InstallError(f"the build left {len(wheels)} Horovod wheels in {tmp}, expected 1.")
        record = {
            "wheel": os.path.basename(wheels[0]),
            "sha256": sha256_of(wheels[0]),
            **(note or {}),
        }
        with open(os.path.join(tmp, "wheel.json"), "w", encoding="utf-8") as f:
            json.dump(record, f)
        if os.path.exists(entry):  # --force: the old entry goes only once the new one is complete
            old = tempfile.mkdtemp(prefix=".replaced-", dir=parent)
            os.replace(entry, os.path.join(old, "entry"))
            shutil.rmtree(old)
        os.replace(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return os.path.join(entry, record["wheel"])


def wheel_for(
    entry: str, build: Callable[[str], str], force: bool = False, note: Any = None
) -> str:
    """The checked cached wheel of ``entry``, or a new one from ``build``; call it holding
    `cache_lock`."""
    wheel = None if force else cached_wheel(entry)
    if wheel is not None:
        say(f"using the cached wheel {wheel} (sha256 checked)")
        return wheel
    return build_into_cache(entry, build, note)
