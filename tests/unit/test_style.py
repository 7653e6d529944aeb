"""The code's width and length, held by the tools: ruff's lint and format as pyproject.toml sets
them (100 columns, over the package, its tests and the rest; only the files copied whole into
Horovod are left out), no module over 350 lines, and no function over 60 lines of body."""

import ast
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

MAX_MODULE_LINES = 350
MAX_FUNCTION_LINES = 60
"""A function's body, from its first statement after the docstring to its end."""


@pytest.mark.parametrize(
    "args", [["check", "."], ["format", "--check", "."]], ids=["check", "format"]
)
def test_ruff_passes_as_pyproject_sets_it(args):
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def _modules():
    for folder, _, files in os.walk(os.path.join(ROOT, "tfpar")):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, ROOT), path


def test_no_module_is_over_350_lines():
    long = {}
    for name, path in _modules():
        with open(path, encoding="utf-8") as f:
            count = len(f.read().splitlines())
        if count > MAX_MODULE_LINES:
            long[name] = count
    assert long == {}, "give the module one job: split it by what it does"


def _body_lines(function):
    body = function.body
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        body = body[1:]
    return function.end_lineno - body[0].lineno + 1 if body else 0


def test_no_function_is_over_60_lines():
    long = {}
    for name, path in _modules():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = _body_lines(node)
                key = f"{name}:{node.name}"
                if lines > MAX_FUNCTION_LINES:
                    long[key] = lines
    assert long == {}, "split it into functions that each do one thing"


def test_the_measures_see_a_docstring_apart_from_the_body():
    source = 'def f():\n    """Doc\n    string."""\n    a = 1\n    return a\n'
    function = ast.parse(source).body[0]
    assert _body_lines(function) == 2
