"""Builds and installs Horovod against this TensorFlow: Gloo, plus MPI where an MPI is installed.

    python scripts/install_horovod.py [--version 0.28.1] [--cache DIR] [--force] [--mpi auto|yes|no]

Horovod's last release, 0.28.1, ships only as an sdist, and that sdist does
not compile against TensorFlow >= 2.19: ``horovod/tensorflow/xla_mpi_ops.cc``
includes XLA headers (``xla_builder.h``, ``highwayhash``, ``farmhash``) that
those TensorFlow wheels no longer ship. The file only implements Horovod ops
for XLA-compiled GPU programs, so this script applies a one-line guard to the
downloaded sdist (never to anything installed): the XLA part is compiled for
TensorFlow 2.6 up to 2.18, as before, and left out from 2.19 on, for CPU and
GPU builds alike. Without it, `jit_compile=True` cannot reach Horovod's ops:
`tfpar.strategies.HorovodStrategy` refuses it with a clear error there.

MPI is built in when ``mpicxx`` is on PATH; with ``--mpi auto`` (the default) the
script installs Debian's openmpi-bin and libopenmpi-dev when they are missing and
it runs as root with apt-get: Horovod runs Adasum only over MPI. NCCL is built
where CUDA is found.

The script checks that the guarded line is found exactly once (another
Horovod version fails loudly instead of building something unpatched), and
caches the wheel per Horovod, TensorFlow and Python version, so later runs
on the same machine install in seconds instead of compiling for ~5 minutes.
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

DEFAULT_VERSION = "0.28.1"
PATCH_FILE = "horovod/tensorflow/xla_mpi_ops.cc"
ORIGINAL = "#if TENSORFLOW_VERSION >= 2006000000\n"
GUARDED = (
    "// tfpar: TensorFlow >= 2.19 wheels lack the XLA headers this part needs.\n"
    "#if TENSORFLOW_VERSION >= 2006000000 && TENSORFLOW_VERSION < 2019000000\n"
)
BUILD_ENV = {
    "HOROVOD_WITH_TENSORFLOW": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_WITHOUT_PYTORCH": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
}


def with_mpi():
    """MPI is built in where an MPI compiler wrapper is found (Adasum runs only over MPI)."""
    return shutil.which("mpicxx") is not None


def ensure_mpi(mode):
    """--mpi auto: install Debian's OpenMPI when it is missing and we may (root, apt-get)."""
    if mode == "no" or with_mpi():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        _say("installing OpenMPI (Debian's openmpi-bin, libopenmpi-dev) so that Adasum can run")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        _run(["apt-get", "update", "-qq"], env=env)
        _run(["apt-get", "install", "-y", "-qq", "openmpi-bin", "libopenmpi-dev"], env=env)
    elif mode == "yes":
        raise SystemExit("install_horovod: --mpi yes needs mpicxx (install OpenMPI) or root with apt-get")
    else:
        _say("no MPI found: building with Gloo only (Adasum will be refused)")


def _say(message):
    print(f"install_horovod: {message}", flush=True)


def _run(cmd, **kwargs):
    _say("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kwargs)


def tensorflow_version():
    out = subprocess.run(
        [sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
        check=True, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    return out.stdout.strip().splitlines()[-1]


def installed_ok(version):
    """Whether horovod.tensorflow of ``version`` imports, with Gloo (and MPI where available)."""
    code = (
        "import horovod, horovod.tensorflow as hvd; "
        f"assert horovod.__version__ == {version!r}, horovod.__version__; "
        f"assert hvd.gloo_built() and (hvd.mpi_built() or not {with_mpi()}); print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_USE_LEGACY_KERAS": "1"})
    return done.returncode == 0 and done.stdout.strip().endswith("ok")


def patch_sdist(source_dir):
    """Applies the guard; raises if the expected line is not there exactly once."""
    path = os.path.join(source_dir, PATCH_FILE)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    count = text.count(ORIGINAL)
    if count != 1:
        raise SystemExit(
            f"install_horovod: expected the line {ORIGINAL.strip()!r} exactly once in {PATCH_FILE}, "
            f"found it {count} time(s). This script knows Horovod {DEFAULT_VERSION}; check the "
            "file by hand before building another version."
        )
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(ORIGINAL, GUARDED))
    _say(f"guarded the XLA ops in {PATCH_FILE}")


def build_wheel(version, out_dir):
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              f"horovod=={version}", "-d", tmp])
        (archive,) = glob.glob(os.path.join(tmp, f"horovod-{version}.tar.gz"))
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        source = os.path.join(tmp, f"horovod-{version}")
        patch_sdist(source)
        _say("compiling Horovod (about 5 minutes on 2 cores)")
        mpi = {"HOROVOD_WITH_MPI": "1"} if with_mpi() else {"HOROVOD_WITHOUT_MPI": "1"}
        _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", source,
              "-w", out_dir], env={**os.environ, **BUILD_ENV, **mpi})


def write_build_note(tf_version):
    """Records what this build was made against, for `tfpar doctor`."""
    code = ("import importlib.util, json, os, sys; "
            "d = importlib.util.find_spec('horovod').submodule_search_locations[0]; "
            "json.dump(json.loads(sys.argv[1]), open(os.path.join(d, '_tfpar_build.json'), 'w'))")
    note = json.dumps({"tensorflow": tf_version, "xla_ops_guarded": True, "builder": "scripts/install_horovod.py"})
    subprocess.run([sys.executable, "-c", code, note], check=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default=DEFAULT_VERSION)
    parser.add_argument("--cache", default=os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tfpar", "horovod"))
    parser.add_argument("--force", action="store_true", help="rebuild even if a cached wheel exists")
    parser.add_argument("--mpi", choices=["auto", "yes", "no"], default="auto",
                        help="auto: build MPI in, installing OpenMPI with apt-get where root may")
    args = parser.parse_args(argv)
    ensure_mpi(args.mpi)

    if not args.force and installed_ok(args.version):
        _say(f"Horovod {args.version} is already installed and imports: nothing to do")
        return 0
    tf_version = tensorflow_version()
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    controllers = "gloo-mpi" if with_mpi() else "gloo"
    cache = os.path.join(args.cache, f"{args.version}-tf{tf_version}-{python_tag}-{controllers}")
    wheels = glob.glob(os.path.join(cache, "horovod-*.whl"))
    if args.force or not wheels:
        shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(cache)
        build_wheel(args.version, cache)
        wheels = glob.glob(os.path.join(cache, "horovod-*.whl"))
    else:
        _say(f"using the cached wheel {wheels[0]}")
    _run([sys.executable, "-m", "pip", "install", "--force-reinstall", "--no-deps", wheels[0]])
    _run([sys.executable, "-m", "pip", "install", wheels[0]])  # its dependencies
    if not installed_ok(args.version):
        raise SystemExit("install_horovod: Horovod installed but `import horovod.tensorflow` fails")
    write_build_note(tf_version)
    _say(f"Horovod {args.version} installed for TensorFlow {tf_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
