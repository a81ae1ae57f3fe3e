"""The built-in rules, all loaded: importing this module imports every `rules_*` module, which registers its rules.

The registry (`registry.py`) holds only the table and `register_rule`; the rule modules
import it to register, so it cannot import them back. This module sits above both: the
engine and the package take the populated table from here.

Example:
    >>> from torch import nn
    >>> default_rules().lookup(nn.Linear) is not None
    True
"""

from __future__ import annotations

from sparta_explore.propagation import (  # noqa: F401  (each registers its rules into BUILTINS)
    rules_elementwise,
    rules_linear,
    rules_norm,
    rules_pool,
    rules_shape,
)
from sparta_explore.propagation.registry import BUILTINS, RuleSet


def default_rules() -> RuleSet:
    """The built-in rules (user rules registered with `register_rule` and no `rules=` included).

    Example:
        >>> import operator
        >>> default_rules().lookup(operator.add).name
        'add_rule'
    """
    return BUILTINS
