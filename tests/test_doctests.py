"""The examples in the package's docstrings run and print what they say (they document exact behaviour, e.g. of
the timing samplers with a fake clock)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import thunderfx_debug

MODULES = sorted(m.name for m in pkgutil.walk_packages(thunderfx_debug.__path__, "thunderfx_debug.")
                 if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (output above)"


def test_there_are_examples_to_check():
    attempted = sum(doctest.testmod(importlib.import_module(name)).attempted for name in MODULES)
    assert attempted >= 20, attempted
