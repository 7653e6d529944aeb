"""The docstring examples of the pure modules run as doctests (the others are marked +SKIP: they
need a cluster, Horovod or a trained model)."""

import doctest
import importlib

import pytest

PURE = [
    "tfpar._checks",
    "tfpar.data.batching",
    "tfpar.data.plan",
    "tfpar.pipeline.schedule",
    "tfpar.pipeline.partition",
]


@pytest.mark.parametrize("module_name", PURE)
def test_docstring_examples_run(module_name):
    result = doctest.testmod(importlib.import_module(module_name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{module_name} has no example"
    assert result.failed == 0
