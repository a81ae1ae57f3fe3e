"""Latency-guided search on decoder LLMs: the space (`space`), one trial (`trial`), the search loop (`search`).

Example:
    >>> from sparta_explore.explore.llm import LLMPoint, search_space
    >>> len(search_space(bands=2))
    15
"""

from sparta_explore.explore.llm.space import Choice, LLMPoint, search_space, write_search_space

__all__ = ["Choice", "LLMPoint", "search_space", "write_search_space"]
