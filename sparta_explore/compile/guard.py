"""Never slower than what the user gave: the whole compiled model is timed against the dense model once.

Dense and the candidates (the compiled model; for an fp32 table also the model after the
graph passes with no kernels, which computes the same) are called alternately on the
example inputs (a load burst hits all) and compared by median; the fastest runs. When even
that is slower than dense, the trusted reference (the model masked with the table, the
user's arithmetic) is timed too and the faster of the two runs. `CompiledModel.guard`
records the times and which runs.

Example:
    >>> name, module, record = guarded(graph, {"compiled": gm}, reference, runs=5)   # doctest: +SKIP
    >>> name                                                                        # doctest: +SKIP
    'compiled'
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from sparta_explore.compile.timing import alternating_ms
from sparta_explore.graph import Graph


def guarded(graph: Graph, candidates: dict[str, nn.Module], reference: nn.Module, runs: int,
            warm: Mapping[str, float] | None = None, estimates: Mapping[str, float] | None = None,
            warm_exact: bool = False) -> tuple[str, nn.Module, dict]:
    """The fastest of `candidates` (all computing what the table asks), or `reference` if even that is slower than
    the dense model and the reference is faster; its name, the module and the timing record. `warm`: seconds of
    a first call some candidates (or "dense") made already; `estimates`: what a candidate's call would take (see
    `alternating_ms`): a candidate far slower than the fastest is then never called. `warm_exact`: each call in
    `warm` did that module's work (for "dense": a model doing the same ops, e.g. the masked fp32 one), so first
    calls already three times apart settle the race without another call (their times are then the record's).

    Example:
        >>> name, module, record = guarded(graph, {"compiled": gm}, ref, runs=5)   # doctest: +SKIP
        >>> record["dense_ms"] > 0                                                 # doctest: +SKIP
        True
    """
    names = list(candidates)
    index = {"dense": 0, **{name: i + 1 for i, name in enumerate(names)}}
    by_index = lambda d: {index[n]: s for n, s in (d or {}).items() if n in index and s is not None}  # noqa: E731
    times = alternating_ms(graph, [graph.module, *candidates.values()], runs, settle=True, warm=by_index(warm),
                           estimates=by_index(estimates), warm_exact=warm_exact)
    dense_ms, measured = times[0], dict(zip(names, times[1:]))
    best = min(names, key=measured.get)
    record = {"dense_ms": dense_ms, **{f"{n}_ms": t for n, t in measured.items()}}
    if measured[best] > dense_ms:
        best_ms, reference_ms = alternating_ms(graph, [candidates[best], reference], runs, settle=True)
        record.update({f"{best}_ms": best_ms, "reference_ms": reference_ms})
        measured[best] = best_ms
        if reference_ms < best_ms:
            record.update(runs="reference", x_dense=dense_ms / reference_ms)
            return "reference", reference, record
    record.update(runs=best, x_dense=dense_ms / measured[best])
    return best, candidates[best], record
