"""The steps of ``tfpar install-horovod``: MPI, the build tools, the checked sdist, tfpar's
patches, the compiled wheel, and the note and the check of what got installed."""

import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Any

from tfpar.install_horovod.cache import InstallError, check_sha256, say
from tfpar.install_horovod.patches import ADDED_MODULES, patch_id
from tfpar.install_horovod.patches import apply_patches as _apply_patches

__all__ = [
    "APT_PACKAGES",
    "BUILD_ENV",
    "MPI_MODES",
    "PATCH_ID",
    "SDIST_SHA256",
    "VERSION",
    "apply_patches",
    "build_from_sdist",
    "build_wheel",
    "ensure_mpi",
    "ensure_on_path",
    "fetch_sdist",
    "installed_ok",
    "run_command",
    "tensorflow_version",
    "with_mpi",
    "write_build_note",
]

VERSION = "0.28.1"
# The sha256 of horovod-0.28.1.tar.gz as PyPI serves it.
SDIST_SHA256 = "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
BUILD_ENV = {
    "HOROVOD_WITH_TENSORFLOW": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_PYTORCH": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
    "CMAKE_POLICY_VERSION_MINIMUM": "3.5",
}
APT_PACKAGES = ("openmpi-bin", "libopenmpi-dev")
MPI_MODES = ("auto", "yes", "no")


PATCH_ID = patch_id()  # names the cache entry and the build note: new patches, new build


def run_command(cmd: list, **kwargs: Any) -> None:
    """Runs ``cmd``, said first; raises InstallError unless it succeeds."""
    say("$ " + " ".join(cmd))
    done = subprocess.run(cmd, **kwargs)
    if done.returncode != 0:
        raise InstallError(
            f"`{' '.join(cmd)}` failed with exit code {done.returncode} (its output is above)."
        )


def with_mpi() -> bool:
    """MPI is built in where an MPI compiler wrapper is found."""
    return shutil.which("mpicxx") is not None


def ensure_mpi(mode: str) -> None:
    """``auto``: installs Debian's OpenMPI when it is missing and we may (root, apt-get), saying
    so first."""
    if mode == "no" or with_mpi():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        say(
            f"no MPI found: installing {' and '.join(APT_PACKAGES)} with apt-get as root, so that "
            "Adasum can run (pass --mpi no to build with Gloo only and skip this)"
        )
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run_command(["apt-get", "update", "-qq"], env=env)
        run_command(["apt-get", "install", "-y", "-qq", *APT_PACKAGES], env=env)
    elif mode == "yes":
        raise InstallError(
            "--mpi yes needs mpicxx on PATH: install OpenMPI (Debian: apt-get install "
            f"{' '.join(APT_PACKAGES)}), or run as root with apt-get."
        )
    else:
        say("no MPI found and no root apt-get: building with Gloo only (Adasum will be refused)")


def _check_build_tools():
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise InstallError(
            f"Building Horovod needs {' and '.join(missing)} on PATH. Install the build tools with "
            "`pip install '.[horovod]'` in the tfpar checkout (CMake) and your system's C++ "
            "compiler (Debian: apt-get install g++), then run tfpar install-horovod again."
        )


def tensorflow_version() -> str:
    out = subprocess.run(
        [sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    if out.returncode != 0:
        raise InstallError(
            f"TensorFlow does not import here, so Horovod cannot be built against it:\n{out.stderr}"
        )
    return out.stdout.strip().splitlines()[-1]


def installed_ok(mpi_expected: bool) -> bool:
    """Whether Horovod imports as this command builds it: this version, these patches, Gloo (and
    MPI)."""
    code = (
        "import importlib.util, json, os, horovod, horovod.tensorflow as hvd; "
        "d = importlib.util.find_spec('horovod').submodule_search_locations[0]; "
        "p = os.path.join(d, '_tfpar_build.json'); "
        "note = json.load(open(p)) if os.path.exists(p) else {}; "
        f"assert horovod.__version__ == {VERSION!r}, horovod.__version__; "
        f"assert note.get('patches') == {PATCH_ID!r}, note; "
        f"assert hvd.gloo_built() and (hvd.mpi_built() or not {mpi_expected}); print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    return done.returncode == 0 and done.stdout.strip().endswith("ok")


def apply_patches(source_dir: str) -> None:
    """Applies tfpar's changes (`tfpar.install_horovod.patches`); raises InstallError unless each
    matches exactly."""
    patched = _apply_patches(source_dir, VERSION)
    say(f"patched {len(patched)} files and added {', '.join(ADDED_MODULES)} (patch set {PATCH_ID})")


def fetch_sdist(workdir: str, sdist: str | None = None) -> str:
    """The checked sdist's path: ``sdist`` or a pip download, verified before anything is
    extracted."""
    if sdist is None:
        run_command(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"horovod=={VERSION}",
                "-d",
                workdir,
            ]
        )
        found = glob.glob(os.path.join(workdir, f"horovod-{VERSION}.tar.gz"))
        if len(found) != 1:
            raise InstallError(f"pip download did not leave horovod-{VERSION}.tar.gz in {workdir}.")
        sdist = found[0]
    elif not os.path.isfile(sdist):
        raise InstallError(f"--sdist must be an existing file. Received: --sdist {sdist!r}.")
    check_sha256(
        sdist,
        SDIST_SHA256,
        "The Horovod sdist",
        f"Download horovod-{VERSION}.tar.gz again from PyPI (or drop --sdist to let pip fetch it).",
    )
    return sdist


def build_wheel(sdist: str, out_dir: str) -> None:
    """Extracts, patches and compiles ``sdist``; the wheel lands in ``out_dir``."""
    with tempfile.TemporaryDirectory(prefix="tfpar-horovod-src-") as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        source = os.path.join(tmp, f"horovod-{VERSION}")
        apply_patches(source)
        say("compiling Horovod (about 2 minutes on 2 cores)")
        mpi = {"HOROVOD_WITH_MPI": "1"} if with_mpi() else {"HOROVOD_WITHOUT_MPI": "1"}
        run_command(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-build-isolation",
                "--no-deps",
                source,
                "-w",
                out_dir,
            ],
            env={**os.environ, **BUILD_ENV, **mpi},
        )


def build_from_sdist(sdist: str | None) -> Any:
    """The build the cache runs for a missing wheel: ``sdist`` (or a download) compiled."""

    def build(out_dir):
        _check_build_tools()
        with tempfile.TemporaryDirectory(prefix="tfpar-horovod-sdist-") as workdir:
            build_wheel(fetch_sdist(workdir, sdist), out_dir)

    return build


def write_build_note(tf_version: str) -> None:
    """Records what this build was made against, for `tfpar doctor` and `installed_ok`, and what
    each extension was built with, for horovodrun
    (`tfpar.install_horovod._copied_into_horovod.build`)."""
    note = json.dumps(
        {
            "tensorflow": tf_version,
            "xla_ops_guarded": True,
            "keras": "tf_keras",
            "patches": PATCH_ID,
            "builder": "tfpar install-horovod",
        }
    )
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys, horovod._tfpar_build as b; b.write(json.loads(sys.argv[1]))",
            note,
        ],
        check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )


def ensure_on_path(script: str = "horovodrun") -> None:
    """Makes sure a console script the wheel installed is reachable: pyenv needs a rehash for
    a new script (its pip hook runs only for ``pip`` started through its shims); elsewhere say
    which folder to add to PATH."""
    if shutil.which(script):
        return
    if shutil.which("pyenv"):
        run_command(["pyenv", "rehash"])
        if shutil.which(script):
            return
    folder = os.path.dirname(sys.executable)
    say(f"note: {script} was installed in {folder}, which is not on PATH: add it to run {script}")
