"""Stage modules that can be called like their main function: `se.compile(...)`, `se.measure(...)`.

A package attribute named like a submodule is replaced by the submodule once it is imported,
so `se.compile` cannot stay a plain function beside `sparta_explore/compile/`. Instead the
module itself becomes callable and forwards to its function of the same name.

Example:
    >>> import sparta_explore as se
    >>> callable(se.measure)
    True
"""

from __future__ import annotations

import sys
import types


def make_callable(module_name: str, function: str) -> None:
    """Let `sys.modules[module_name](...)` call its attribute `function`.

    A function the module only loads on first use (a module `__getattr__`) keeps loading
    lazily: its docstring is not read here.

    Example:
        >>> make_callable(__name__, "make_callable")  # doctest: +SKIP
    """
    module = sys.modules[module_name]

    class CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return getattr(self, function)(*args, **kwargs)

    if function in vars(module):
        CallableModule.__call__.__doc__ = vars(module)[function].__doc__
    module.__class__ = CallableModule
