"""Hugging Face generative models capture with their KV cache off: a cache object is not a tensor graph output.

`LlamaForCausalLM` or `GPT2LMHeadModel` as users have them (``config.use_cache=True``) return a
`DynamicCache` beside the logits; torch.export refuses it and fx cannot trace the model at
all. The cache changes no logit, so the captured forward runs with ``config.use_cache``
switched off (and back on afterwards), and the graph says so in `Graph.notes`. Compiling in
place (`CompileConfig(inplace=True)`) then keeps the model's own `generate`, cache included.

Example:
    >>> with kv_cache_off(model) as note:   # doctest: +SKIP
    ...     gm = export_graph_module(model, (), inputs)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

NOTE = ("KV cache off for the captured forward (config.use_cache=False while capturing; the model's config "
        "keeps use_cache=True): a cache is not a tensor graph output and changes no logit. Compile in place "
        "(CompileConfig(inplace=True)) to keep generate() with its cache")


@contextlib.contextmanager
def kv_cache_off(model: Any) -> Iterator[str | None]:
    """Within the block, a model whose config says ``use_cache=True`` runs without it; yields `NOTE` then, else None.

    Example:
        >>> with kv_cache_off(object()) as note:
        ...     note is None
        True
    """
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", None) is not True:
        yield None
        return
    config.use_cache = False
    try:
        yield NOTE
    finally:
        config.use_cache = True
