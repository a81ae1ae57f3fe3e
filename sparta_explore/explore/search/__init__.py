"""Searches over trial params: the spaces they search, and the searches themselves.

Spaces, named for what they vary: `block_space` (block pruner: per-layer sparsity x block x
bits), `family_space` (per-layer sparsity x pruning family x precision), both built from
`layers` (the prunable layers); `dimensions` parses any NNI space into keys a search can
sample and model. Searches: `pareto_tpe` (our latency-guided TPE), `searches` (the
registered searches the protocol compares).

Example:
    >>> from sparta_explore.explore.search.dimensions import Space
    >>> Space.from_nni({"bits": {"_type": "choice", "_value": [32, 8]}}).size
    2
"""
