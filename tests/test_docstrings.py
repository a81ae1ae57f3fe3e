"""Every runnable docstring example in the package is true (examples marked +SKIP excepted)."""

import doctest
import importlib
import pkgutil

import pytest

# the package, and the folders pyproject maps into it from the repository's top level
ROOTS = ["sparta_explore", "sparta_explore.kernels", "sparta_explore.pruners", "sparta_explore.quantizers"]


def _modules() -> list[str]:
    # every module of every package, walked, so a new folder is never left out
    names = []
    for root in ROOTS:
        pkg = importlib.import_module(root)
        names += [root] + [m.name for m in pkgutil.walk_packages(pkg.__path__, f"{root}.")]
    return sorted(set(names) - {"sparta_explore.cli"})  # cli examples are shell commands


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
