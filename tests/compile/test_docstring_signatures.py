"""Every docstring example in the compile package, +SKIP ones too, calls its functions as their signatures allow."""

import ast
import doctest
import importlib
import inspect
import pkgutil

import pytest

import sparta_explore.compile as compile_pkg


def _modules() -> list[str]:
    return [f"sparta_explore.compile.{m.name}" for m in pkgutil.iter_modules(compile_pkg.__path__) if not m.ispkg]


def _example_calls(module):
    """(docstring, call source, callable) for each example call of a function or class the module holds."""
    for test in doctest.DocTestFinder(exclude_empty=True).find(module, module.__name__):
        for example in test.examples:
            for node in ast.walk(ast.parse(example.source)):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                        and callable(getattr(module, node.func.id, None)):
                    yield test.name, node, getattr(module, node.func.id)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_match_the_real_signatures(name):
    # +SKIP examples never run, so nothing else notices when a signature moves on and the example stays
    module = importlib.import_module(name)
    for where, call, fn in _example_calls(module):
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue
        try:
            inspect.signature(fn).bind(*call.args, **{k.arg: k.value for k in call.keywords})
        except TypeError as e:
            signature = f"{fn.__name__}{inspect.signature(fn)}"
            pytest.fail(f"{where}: example `{ast.unparse(call)}` does not fit {signature}: {e}")
