"""`tfpar install-horovod`: builds Horovod 0.28.1 against this TensorFlow, checks it, caches it,
installs it.

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
import os
import sys
from collections.abc import Sequence

from tfpar._checks import check_choice, check_number
from tfpar.install_horovod.cache import InstallError, cache_lock, cached_wheel, wheel_for
from tfpar.install_horovod.cache import say as _say
from tfpar.install_horovod.patches import ADDED_MODULES
from tfpar.install_horovod.steps import (
    MPI_MODES,
    PATCH_ID,
    SDIST_SHA256,
    VERSION,
    apply_patches,
    build_from_sdist,
    ensure_mpi,
    ensure_on_path,
    fetch_sdist,
    installed_ok,
    run_command,
    tensorflow_version,
    with_mpi,
    write_build_note,
)

__all__ = [
    "ADDED_MODULES",
    "InstallError",
    "PATCH_ID",
    "SDIST_SHA256",
    "VERSION",
    "apply_patches",
    "cache_lock",
    "cached_wheel",
    "fetch_sdist",
    "install",
    "main",
    "wheel_for",
]


def default_cache():
    return os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tfpar", "horovod"
    )


def install(
    mpi: str = "auto",
    sdist: str | None = None,
    cache: str | None = None,
    force: bool = False,
    lock_timeout_seconds: float = 3600.0,
) -> int:
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
            _say(
                f"Horovod {VERSION} (patch set {PATCH_ID}) is already installed and imports: "
                "nothing to do"
            )
            return 0
        tf_version = tensorflow_version()
        python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        controllers = "gloo-mpi" if with_mpi() else "gloo"
        entry = os.path.join(
            cache, f"{VERSION}-tf{tf_version}-{python_tag}-{controllers}-{PATCH_ID}"
        )
        wheel = wheel_for(entry, build_from_sdist(sdist), force=force, note={"patches": PATCH_ID})
        run_command(
            [sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", wheel]
        )
        run_command([sys.executable, "-m", "pip", "install", wheel])  # its dependencies
        write_build_note(tf_version)
        ensure_on_path()
        if not installed_ok(with_mpi()):
            raise InstallError(
                "Horovod installed, but `import horovod.tensorflow` fails: run "
                "`tfpar doctor` for the error."
            )
        _say(f"Horovod {VERSION} installed for TensorFlow {tf_version}")
    return 0


def add_arguments(parser):
    """The command's options, shared by `tfpar install-horovod` and ``python -m
    tfpar.install_horovod``."""
    parser.add_argument(
        "--mpi",
        choices=MPI_MODES,
        default="auto",
        help="auto: build MPI in, installing OpenMPI with apt-get where root may; no: Gloo only",
    )
    parser.add_argument(
        "--sdist",
        help=f"build from this horovod-{VERSION}.tar.gz (checked against its sha256) "
        "instead of downloading it",
    )
    parser.add_argument(
        "--cache", default=None, help="wheel cache (default $XDG_CACHE_HOME/tfpar/horovod)"
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild even if a checked wheel is cached"
    )
    parser.add_argument(
        "--lock-timeout",
        type=float,
        default=3600.0,
        help="seconds to wait for another install-horovod run (default 3600)",
    )


def run(args):
    """Runs the command for parsed ``args``; returns the exit status."""
    try:
        return install(
            mpi=args.mpi,
            sdist=args.sdist,
            cache=args.cache,
            force=args.force,
            lock_timeout_seconds=args.lock_timeout,
        )
    except (InstallError, ValueError, TypeError) as error:
        print(f"tfpar install-horovod: error: {error}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tfpar.install_horovod",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
