"""The note `tfpar install-horovod` leaves in the Horovod it built (``horovod/_tfpar_build.json``),
and horovodrun's reader of it. Copied into the Horovod package as ``horovod/_tfpar_build.py``; it
imports nothing of tfpar.

Every ``horovodrun`` start asks whether Horovod was built with Gloo (and MPI, ...) by starting a
process that imports the framework's extension, TensorFlow included: about 8 s of CPU before the
first rank starts, each time. The installer asks once, right after the install (`write`), and
records each extension's answers with the size and modification time of its library.
`recorded` gives horovodrun those answers while the library is the one they were recorded for;
for anything else (no note, another library, a question not recorded) it returns `ASK`, and
Horovod asks a process as it always did.
"""

import importlib
import json
import os
import sysconfig

PACKAGE = os.path.dirname(os.path.abspath(__file__))
NOTE = os.path.join(PACKAGE, "_tfpar_build.json")
# Each extension's library, as horovod/<framework>/__init__.py checks it (check_extension).
LIBRARIES = {"tensorflow": "tensorflow/mpi_lib", "torch": "torch/mpi_lib_v2", "mxnet": "mxnet/mpi_lib"}
# horovod.common.util's questions (the fn_desc of _check_extension_lambda) and the function of the
# extension that answers each one; "built" is extension_available's (the extension imports).
QUESTIONS = {"built with MPI": "mpi_built", "built with Gloo": "gloo_built", "built with NCCL": "nccl_built",
             "built with DDL": "ddl_built", "built with CCL": "ccl_built"}
ASK = object()  # nothing recorded that still holds: ask a new process, as Horovod does


def _library(name):
    """[size, mtime_ns] of extension ``name``'s library, or None where it is not built."""
    path = os.path.join(PACKAGE, LIBRARIES[name] + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return [stat.st_size, stat.st_mtime_ns]


def write(note):
    """Writes ``note`` (a dict) with every extension's answers: run once, in a new process, right
    after the install (it imports each built extension)."""
    extensions = {}
    for name in LIBRARIES:
        library, answers = _library(name), None
        if library is not None:
            extension = importlib.import_module(f"horovod.{name}")
            answers = {"built": True, **{q: getattr(extension, f)() for q, f in QUESTIONS.items()}}
        extensions[name] = {"library": library, "answers": answers}
    partial = NOTE + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump({**note, "extensions": extensions}, f)
    os.replace(partial, NOTE)


def recorded(name, question):
    """The answer recorded for extension ``name`` and ``question`` (horovod.common.util's fn_desc),
    None where the extension is not built (what Horovod's check returns when its import fails), or
    `ASK`."""
    try:
        with open(NOTE, encoding="utf-8") as f:
            entry = json.load(f)["extensions"][name]
        if entry["library"] != _library(name):
            return ASK
        return None if entry["answers"] is None else entry["answers"].get(question, ASK)
    except (OSError, ValueError, KeyError, TypeError):
        return ASK
