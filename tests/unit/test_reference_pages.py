"""The reference pages that list what the code has, read against the code: every environment
variable tfpar reads or sets is in docs/reference/environment.md, and every message the
troubleshooting page quotes is one tfpar raises."""

import ast
import os
import re

from tests.conftest import ROOT

VARIABLE = re.compile(
    r"^(TF|TFPAR|HOROVOD|SLURM|CUDA|OMPI|PMI|PMIX|LOCAL|XDG|LD|CMAKE|GRPC|PYTHON|NCCL)_[A-Z0-9_]+$|^CC$"
)
NOT_VARIABLES = {
    "KERAS_CALLBACK_HOOKS",
    "KERAS_READS_FROM_EXTENDED",
    "SLURM_MPI_MARKERS",
    "HOROVOD_OPS",
}
"""Upper-case names in tfpar that are constants, not environment variables."""


def _strings():
    """Every string constant of tfpar's code, an f-string as its literal parts with a NUL per
    field."""
    found = []
    for folder, _, names in os.walk(os.path.join(ROOT, "tfpar")):
        for name in names:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Constant) and isinstance(node.value, str):
                        found.append(node.value)
                    elif isinstance(node, ast.JoinedStr):
                        found.append(
                            "".join(
                                v.value if isinstance(v, ast.Constant) else "\0"
                                for v in node.values
                            )
                        )
    return found


def _page(path):
    with open(os.path.join(ROOT, "docs", path), encoding="utf-8") as f:
        return f.read()


def test_every_environment_variable_tfpar_reads_or_sets_is_documented():
    variables = {s for s in _strings() if VARIABLE.match(s)} - NOT_VARIABLES
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", _page("reference/environment.md")))
    assert len(variables) > 40
    assert sorted(variables - documented) == []


def test_every_message_the_troubleshooting_page_quotes_is_raised_by_tfpar():
    rows = [line for line in _page("troubleshooting.md").splitlines() if line.startswith("| `")]
    quoted = [q for row in rows for q in re.findall(r"`([^`]+)`", row.split("|")[1])]
    assert len(quoted) >= 15
    strings = _strings()
    missing = [q for q in quoted if not any(q in s for s in strings)]
    assert missing == []
