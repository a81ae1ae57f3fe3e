"""An `LLMPoint` applied to a decoder LLM in one calibration pass: per linear its own sparsity, bits and groups.

`obs_sequentially` walks the decoder blocks once: each block's inputs come from the blocks before
it, already compressed, and every selected linear of the block is compressed from its input
Hessian H by its own `Choice`:

* ``wanda``: the mask keeps the largest ``|W_ij| * ||X_j||`` of each row (``||X_j||`` from the
  diagonal of H, up to a constant that does not change the ranking), pruned weights set to 0 and
  the kept ones left as they are (Wanda has no update); with bits, GPTQ then rounds the kept
  weights with that mask fixed (`obs_compress(keep=...)`), its update spread over kept columns only;
* ``sparsegpt``: SparseGPT's adaptive mask and OBS update, jointly quantized when bits < 32;
* sparsity 0: GPTQ alone (`act_order` as the budget says).

One pass, whatever the mix: a point costs one calibration walk, not one per distinct setting.
The tied head is rounded to nearest afterwards (GPTQ's blocks never reach it). With a
`CalibrationCache` (`prefix.py`) the walk starts after the longest run of depth bands an earlier
point compressed the same way, from the hidden states and weights it kept.

Example:
    >>> compress_llm(copy.deepcopy(dense), point, calibration_ids)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from sparta_explore.explore.llm.prefix import (
    CalibrationCache,
    PrefixEntry,
    model_fingerprint,
    prefix_key,
    tensor_fingerprint,
)
from sparta_explore.explore.llm.space import Choice, LLMPoint
from sparta_explore.oneshot import (
    OBSResult,
    QuantSpec,
    calibration_samples,
    find_blocks,
    obs_compress,
    obs_sequentially,
    round_to_grids,
    select_linears,
    set_weight_matrix,
)
from sparta_explore.pruners import wanda_keep

HEAD_GROUP = 32


def compress_linear(choice: Choice, compressor: str, weight: torch.Tensor, hessian: torch.Tensor, *,
                    act_order: bool = True, mse: bool = False, name: str = "weight") -> OBSResult:
    """One (out, in) weight compressed as `choice` says from its input Hessian (see the module docstring).

    Example:
        >>> r = compress_linear(Choice(0.5, 4, 32), "wanda", torch.randn(8, 64), torch.eye(64))
        >>> int(r.keep.sum()), r.grid.group_size
        (256, 32)
    """
    quant = QuantSpec(choice.bits, choice.group, mse=mse) if choice.bits < 32 else None
    if choice.sparsity == 0:
        return obs_compress(weight, hessian, quant=quant, act_order=act_order, name=name)
    if compressor == "sparsegpt":
        return obs_compress(weight, hessian, sparsity=choice.sparsity, quant=quant, name=name)
    norms = hessian.diagonal().clamp_min(0).sqrt().to(weight.dtype)
    keep = wanda_keep(weight.abs() * norms, choice.sparsity).bool()
    if quant is None:
        return OBSResult(weight * keep, keep, None, float("nan"))
    return obs_compress(weight, hessian, keep=keep, quant=quant, act_order=act_order, name=name)


def band_ends(layers: int, bands: int) -> list[int]:
    """The block index after each depth band (the last is `layers`): where a prefix can be kept.

    Example:
        >>> band_ends(30, 3), band_ends(2, 1)
        ([10, 20, 30], [2])
    """
    band = [i * bands // layers for i in range(layers)]
    return [i + 1 for i in range(layers) if i + 1 == layers or band[i] != band[i + 1]]


def _block(name: str) -> int:
    return int(name.split(".")[2])


def compress_llm(model: nn.Module, point: LLMPoint, calibration: torch.Tensor, *, act_order: bool = True,
                 mse: bool = False, samples: int | None = None, cache: CalibrationCache | None = None
                 ) -> dict[str, OBSResult]:
    """`model` (a Llama; changed in place) compressed as `point` says; per compressed linear its result.
    `cache`: prefixes kept from earlier points and for later ones (the module docstring).

    Example:
        >>> point = LLMPoint.from_dict({"bits@mlp.0": 4}, layers=2, bands=1)
        >>> results = compress_llm(model, point, calib)  # doctest: +SKIP
    """
    layers_n = len(model.model.layers)
    assignment: Mapping[str, Choice] = point.assignment(layers_n)
    chosen = tuple(n for n, c in assignment.items() if c.sparsity > 0 or c.bits < 32)
    results: dict[str, OBSResult] = {}
    if chosen:
        ends = band_ends(layers_n, point.bands)
        keys: dict[int, str] = {}
        if cache is not None:
            fingerprints = {"model": model_fingerprint(model), "calibration": tensor_fingerprint(calibration)}
            keys = {e: prefix_key(assignment, point.compressor, e, **fingerprints, options=(act_order, mse, samples))
                    for e in ends}
        start, hidden = 0, None
        for end in ends:  # the longest run of bands kept by an earlier point
            entry = cache.get(keys[end]) if cache is not None else None
            if entry is None:
                break
            for name, weight in entry.weights.items():
                set_weight_matrix(model.get_submodule(name), weight.clone())
            results.update(entry.results)
            start, hidden = end, entry.hidden
        rest = tuple(n for n in chosen if _block(n) >= start)
        if cache is not None:
            cache.blocks_reused += start
            cache.blocks_walked += layers_n - start if rest else 0
        if rest:
            walked: dict[str, OBSResult] = {}

            def sweep(name: str, weight: torch.Tensor, hessian: torch.Tensor) -> OBSResult:
                walked[name] = compress_linear(assignment[name], point.compressor, weight, hessian,
                                               act_order=act_order, mse=mse, name=name)
                return walked[name]

            def keep(index: int, next_hidden: list[torch.Tensor] | None) -> None:
                end = index + 1
                if cache is not None and end in keys:
                    first = max([e for e in ends if e < end], default=0)
                    cache.put(keys[end], PrefixEntry.of(next_hidden, {n: r for n, r in walked.items()
                                                                      if first <= _block(n) < end}))

            layers = select_linears(model, [b for b, _ in find_blocks(model)], rest)
            results.update(obs_sequentially(model, calibration_samples(calibration, samples), layers, sweep,
                                            dtype=torch.float32, desc=f"{point.compressor}+gptq", start=start,
                                            start_hidden=hidden, after_block=keep))
    if point.head_bits < 32:
        with torch.no_grad():  # tied: the embedding reads the same rounded rows
            model.lm_head.weight.copy_(round_to_grids(model.lm_head.weight, QuantSpec(point.head_bits, HEAD_GROUP)))
    return results
