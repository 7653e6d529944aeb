"""`tfpar install-horovod`: builds Horovod 0.28.1 against this TensorFlow, checks it, caches it, installs it.

    tfpar install-horovod [--mpi auto|yes|no] [--sdist FILE] [--cache DIR] [--force]
    python -m tfpar.install_horovod ...   (the same)

Horovod's last release ships only as an sdist, which no longer builds or runs as-is
on TensorFlow 2.21. This command:

1. downloads the sdist with pip (or takes ``--sdist FILE``) and checks its sha256
   against the one pinned here before anything is extracted;
2. applies tfpar's patches (`tfpar.install_horovod.patches`), each checked to match exactly
   (another Horovod fails loudly instead of building something half-patched):
   - ``xla_mpi_ops.cc`` is compiled for TensorFlow 2.6 to 2.18 only: later wheels lack
     the XLA headers it includes (so ``jit_compile=True`` cannot reach Horovod's ops);
   - ``horovod.tensorflow.keras`` runs on tf_keras instead of Keras 3 (see
     `tfpar.install_horovod._copied_into_horovod.keras`), and ``horovod.tensorflow`` loads
     ``SyncBatchNormalization`` on first use so that importing it leaves ``tf.keras`` unresolved;
   - ``horovodrun`` takes what the build has (Gloo, MPI, NCCL) from the note the install
     writes (`tfpar.install_horovod._copied_into_horovod.build`) instead of a new process that
     imports TensorFlow at every start (about 8 s of CPU);
   - ``horovod.tensorflow`` takes Keras 3 variables (its ``.ref()`` calls) and
     ``SyncBatchNormalization`` runs on Keras 3 too (no ``fused``, Keras 3's ``_moments``);
3. builds a wheel with Gloo, MPI where ``mpicxx`` is found (Adasum runs only over MPI)
   and NCCL where CUDA is found, with ``CMAKE_POLICY_VERSION_MINIMUM=3.5``: Horovod's
   bundled Gloo and flatbuffers declare CMake minimums below 3.5, which CMake 4 refuses
   unless told which policies to assume; CMake 3.x ignores the variable;
4. builds in a temporary folder beside the cache and moves the finished wheel in
   atomically, with its sha256 recorded; a cached wheel is checked against that record
   before it is installed. One lock covers a whole run: a second run waits for it.

``--mpi auto`` (the default) installs Debian's openmpi-bin and libopenmpi-dev with
apt-get when no MPI is found and it runs as root, saying so first; ``--mpi no`` builds
with Gloo only.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence

from tfpar._checks import check_choice, check_number
from tfpar.install_horovod.cache import (
    InstallError,
    cache_lock,
    cached_wheel,
    check_sha256,
    wheel_for,
)
from tfpar.install_horovod.cache import say as _say
from tfpar.install_horovod.patches import ADDED_MODULES, patch_id
from tfpar.install_horovod.patches import apply_patches as _apply_patches

__all__ = ["InstallError", "PATCH_ID", "SDIST_SHA256", "VERSION", "cache_lock", "cached_wheel", "fetch_sdist",
           "install", "main", "wheel_for"]

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


def _run(cmd, **kwargs):
    _say("$ " + " ".join(cmd))
    done = subprocess.run(cmd, **kwargs)
    if done.returncode != 0:
        raise InstallError(f"`{' '.join(cmd)}` failed with exit code {done.returncode} (its output is above).")


def with_mpi():
    """MPI is built in where an MPI compiler wrapper is found."""
    return shutil.which("mpicxx") is not None


def ensure_mpi(mode):
    """``auto``: installs Debian's OpenMPI when it is missing and we may (root, apt-get), saying so first."""
    if mode == "no" or with_mpi():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        _say(f"no MPI found: installing {' and '.join(APT_PACKAGES)} with apt-get as root, so that "
             "Adasum can run (pass --mpi no to build with Gloo only and skip this)")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "update", "-qq"], env=env)
        _run(["apt-get", "install", "-y", "-qq", *APT_PACKAGES], env=env)
    elif mode == "yes":
        raise InstallError("--mpi yes needs mpicxx on PATH: install OpenMPI (Debian: apt-get install "
                           f"{' '.join(APT_PACKAGES)}), or run as root with apt-get.")
    else:
        _say("no MPI found and no root apt-get: building with Gloo only (Adasum will be refused)")


def _check_build_tools():
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise InstallError(
            f"Building Horovod needs {' and '.join(missing)} on PATH. Install the build tools with "
            "`pip install '.[horovod]'` in the tfpar checkout (CMake) and your system's C++ compiler "
            "(Debian: apt-get install g++), then run tfpar install-horovod again.")


def tensorflow_version():
    out = subprocess.run([sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
                         capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if out.returncode != 0:
        raise InstallError(f"TensorFlow does not import here, so Horovod cannot be built against it:\n{out.stderr}")
    return out.stdout.strip().splitlines()[-1]


def installed_ok(mpi_expected):
    """Whether Horovod imports as this command builds it: this version, these patches, Gloo (and MPI)."""
    code = (
        "import importlib.util, json, os, horovod, horovod.tensorflow as hvd; "
        "d = importlib.util.find_spec('horovod').submodule_search_locations[0]; "
        "p = os.path.join(d, '_tfpar_build.json'); "
        "note = json.load(open(p)) if os.path.exists(p) else {}; "
        f"assert horovod.__version__ == {VERSION!r}, horovod.__version__; "
        f"assert note.get('patches') == {PATCH_ID!r}, note; "
        f"assert hvd.gloo_built() and (hvd.mpi_built() or not {mpi_expected}); print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return done.returncode == 0 and done.stdout.strip().endswith("ok")


def apply_patches(source_dir):
    """Applies tfpar's changes (`tfpar.install_horovod.patches`); raises InstallError unless each matches exactly."""
    patched = _apply_patches(source_dir, VERSION)
    _say(f"patched {len(patched)} files and added {', '.join(ADDED_MODULES)} (patch set {PATCH_ID})")


def fetch_sdist(workdir: str, sdist: str | None = None) -> str:
    """The checked sdist's path: ``sdist`` or a pip download, verified before anything is extracted."""
    if sdist is None:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              f"horovod=={VERSION}", "-d", workdir])
        found = glob.glob(os.path.join(workdir, f"horovod-{VERSION}.tar.gz"))
        if len(found) != 1:
            raise InstallError(f"pip download did not leave horovod-{VERSION}.tar.gz in {workdir}.")
        sdist = found[0]
    elif not os.path.isfile(sdist):
        raise InstallError(f"--sdist must be an existing file. Received: --sdist {sdist!r}.")
    check_sha256(sdist, SDIST_SHA256, "The Horovod sdist",
                  f"Download horovod-{VERSION}.tar.gz again from PyPI (or drop --sdist to let pip fetch it).")
    return sdist


def build_wheel(sdist, out_dir):
    """Extracts, patches and compiles ``sdist``; the wheel lands in ``out_dir``."""
    with tempfile.TemporaryDirectory(prefix="tfpar-horovod-src-") as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        source = os.path.join(tmp, f"horovod-{VERSION}")
        apply_patches(source)
        _say("compiling Horovod (about 2 minutes on 2 cores)")
        mpi = {"HOROVOD_WITH_MPI": "1"} if with_mpi() else {"HOROVOD_WITHOUT_MPI": "1"}
        _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", source,
              "-w", out_dir], env={**os.environ, **BUILD_ENV, **mpi})


def _build_from_sdist(sdist):
    def build(out_dir):
        _check_build_tools()
        with tempfile.TemporaryDirectory(prefix="tfpar-horovod-sdist-") as workdir:
            build_wheel(fetch_sdist(workdir, sdist), out_dir)
    return build


def write_build_note(tf_version):
    """Records what this build was made against, for `tfpar doctor` and `installed_ok`, and what
    each extension was built with, for horovodrun (`tfpar.install_horovod._copied_into_horovod.build`)."""
    note = json.dumps({"tensorflow": tf_version, "xla_ops_guarded": True, "keras": "tf_keras",
                       "patches": PATCH_ID, "builder": "tfpar install-horovod"})
    subprocess.run([sys.executable, "-c", "import json, sys, horovod._tfpar_build as b; b.write(json.loads(sys.argv[1]))",
                    note], check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def ensure_on_path(script="horovodrun"):
    """Makes sure a console script the wheel installed is reachable: pyenv needs a rehash for
    a new script (its pip hook runs only for ``pip`` started through its shims); elsewhere say
    which folder to add to PATH."""
    if shutil.which(script):
        return
    if shutil.which("pyenv"):
        _run(["pyenv", "rehash"])
        if shutil.which(script):
            return
    folder = os.path.dirname(sys.executable)
    _say(f"note: {script} was installed in {folder}, which is not on PATH: add it to run {script}")


def default_cache():
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tfpar", "horovod")


def install(mpi: str = "auto", sdist: str | None = None, cache: str | None = None, force: bool = False,
            lock_timeout_seconds: float = 3600.0) -> int:
    """Builds (or takes from the cache) and installs Horovod; see the module docstring.

    Raises:
        InstallError: a step failed; the message names it and the fix.
        ValueError, TypeError: a bad argument.
    """
    check_choice("mpi", mpi, MPI_MODES)
    check_number("lock_timeout_seconds", lock_timeout_seconds, above=0)
    cache = cache or default_cache()
    with cache_lock(cache, lock_timeout_seconds):
        ensure_mpi(mpi)
        if not force and installed_ok(with_mpi()):
            _say(f"Horovod {VERSION} (patch set {PATCH_ID}) is already installed and imports: nothing to do")
            return 0
        tf_version = tensorflow_version()
        python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        controllers = "gloo-mpi" if with_mpi() else "gloo"
        entry = os.path.join(cache, f"{VERSION}-tf{tf_version}-{python_tag}-{controllers}-{PATCH_ID}")
        wheel = wheel_for(entry, _build_from_sdist(sdist), force=force, note={"patches": PATCH_ID})
        _run([sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", wheel])
        _run([sys.executable, "-m", "pip", "install", wheel])  # its dependencies
        write_build_note(tf_version)
        ensure_on_path()
        if not installed_ok(with_mpi()):
            raise InstallError("Horovod installed, but `import horovod.tensorflow` fails: run "
                               "`tfpar doctor` for the error.")
        _say(f"Horovod {VERSION} installed for TensorFlow {tf_version}")
    return 0


def add_arguments(parser):
    """The command's options, shared by `tfpar install-horovod` and ``python -m tfpar.install_horovod``."""
    parser.add_argument("--mpi", choices=MPI_MODES, default="auto",
                        help="auto: build MPI in, installing OpenMPI with apt-get where root may; "
                             "no: Gloo only")
    parser.add_argument("--sdist", help=f"build from this horovod-{VERSION}.tar.gz (checked against its sha256) "
                                        "instead of downloading it")
    parser.add_argument("--cache", default=None, help="wheel cache (default $XDG_CACHE_HOME/tfpar/horovod)")
    parser.add_argument("--force", action="store_true", help="rebuild even if a checked wheel is cached")
    parser.add_argument("--lock-timeout", type=float, default=3600.0,
                        help="seconds to wait for another install-horovod run (default 3600)")


def run(args):
    """Runs the command for parsed ``args``; returns the exit status."""
    try:
        return install(mpi=args.mpi, sdist=args.sdist, cache=args.cache, force=args.force,
                       lock_timeout_seconds=args.lock_timeout)
    except (InstallError, ValueError, TypeError) as error:
        print(f"tfpar install-horovod: error: {error}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfpar.install_horovod", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))

