"""Every runnable docstring example in the package is true (examples marked +SKIP excepted)."""

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ["sparta_explore", "sparta_explore.zoo", "sparta_explore.pruners", "sparta_explore.quantizers",
            "sparta_explore.kernels", "sparta_explore.propagation", "sparta_explore.plan", "sparta_explore.explore",
            "sparta_explore.compile", "sparta_explore.compile.passes"]


def _modules() -> list[str]:
    names = []
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        names.append(pkg_name)
        names += [f"{pkg_name}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__) if not m.ispkg]
    return sorted(set(names) - {"sparta_explore.cli"})  # cli examples are shell commands


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
