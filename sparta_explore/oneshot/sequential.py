"""Block-by-block calibration: each block is compressed on the outputs of the already-compressed blocks before it.

The flow every one-shot compressor (Wanda, SparseGPT, GPTQ, OWL's outlier pass) shares:

1. run the model up to its first block and keep what that block receives, per sample;
2. for each block: hooks on its selected linears gather a statistic of their inputs while
   the block runs on every sample; the compressor compresses those linears; the block
   runs again so the next block sees the compressed block's outputs.

Only one block's inputs are held at a time, never the whole model's activations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from sparta_explore.oneshot.blocks import (
    BlockInput,
    block_output,
    capture_block_inputs,
    find_blocks,
    inside,
    set_weight_matrix,
    weight_matrix,
)
from sparta_explore.oneshot.calibration import CalibrationSample
from sparta_explore.oneshot.obs import OBSResult
from sparta_explore.oneshot.statistics import InputHessian, InputStatistic

# compress(block index, {FQN: linear} of this block, {FQN: statistic}) -> an undo run once the
# block's outputs are computed (Wanda zeroes weights only while the next block is fed), or None
CompressFn = Callable[[int, dict[str, nn.Module], dict[str, Any]], Callable[[], None] | None]
StatisticFn = Callable[[str, nn.Module], InputStatistic]


def layers_by_block(model: nn.Module, layers: Mapping[str, nn.Module]) -> list[dict[str, nn.Module]]:
    """`layers` grouped by the repeated block they lie in, one dict per block (empty ones too).

    Example:
        >>> net = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
        >>> [list(d) for d in layers_by_block(net, {"1": net[1]})]
        [[], ['1']]
    """
    blocks = [name for name, _ in find_blocks(model)]
    return [{n: m for n, m in layers.items() if inside(n, b)} for b in blocks]


def _gather(block: nn.Module, inputs: Sequence[BlockInput], layers: Mapping[str, nn.Module],
            make_statistic: StatisticFn) -> dict[str, Any]:
    stats = {name: make_statistic(name, layer) for name, layer in layers.items()}

    def hook_for(name: str) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            stats[name].add(args[0])
        return record

    handles = [layer.register_forward_hook(hook_for(name)) for name, layer in layers.items()]
    try:
        for inp in inputs:
            block(*inp.args, **inp.kwargs)
    finally:
        for h in handles:
            h.remove()
    return stats


def calibrate_sequentially(model: nn.Module, samples: Sequence[CalibrationSample], layers: Mapping[str, nn.Module],
                           make_statistic: StatisticFn, compress: CompressFn, *, desc: str = "one-shot") -> None:
    """Run `compress` on each block's `layers`, in order, each calibrated on the compressed blocks' outputs.

    `make_statistic(name, layer)` builds what a layer's inputs accumulate into (an
    `InputHessian`, `InputChannelNorms`); `compress(index, block_layers, statistics)`
    changes the block's weights and may return an undo, run once the block's outputs are
    computed. Blocks without a selected layer are only run. The model runs in eval mode,
    without gradients; its train/eval mode is restored afterwards.

    Example:
        >>> def stat(name, layer): return InputHessian(layer.in_features)
        >>> calibrate_sequentially(llama, samples, layers, stat, my_compress)  # doctest: +SKIP
    """
    blocks = find_blocks(model)
    grouped = layers_by_block(model, layers)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            inputs = capture_block_inputs(model, blocks[0][1], samples)
            bar = tqdm(list(enumerate(blocks)), desc=desc, unit="block", leave=False, disable=None)
            for index, (_, block) in bar:
                own = grouped[index]
                undo = None
                if own:
                    stats = _gather(block, inputs, own, make_statistic)
                    undo = compress(index, own, stats)
                try:
                    if index + 1 < len(blocks):
                        inputs = [inp.with_hidden(block_output(block, inp)) for inp in inputs]
                finally:
                    if undo is not None:
                        undo()
    finally:
        model.train(was_training)


def statistic_columns(layer: nn.Module) -> int:
    """The input width of a linear (in_features; Conv1D's weight is (in, out)).

    Example:
        >>> statistic_columns(nn.Linear(5, 3))
        5
    """
    return weight_matrix(layer).shape[1]


def obs_sequentially(model: nn.Module, samples: Sequence[CalibrationSample], layers: Mapping[str, nn.Module],
                     sweep: Callable[[str, torch.Tensor, torch.Tensor], OBSResult], *, dtype: torch.dtype,
                     desc: str) -> dict[str, OBSResult]:
    """`calibrate_sequentially` with input Hessians: each layer's weight replaced by `sweep(name, W, H)`'s.

    SparseGPT and GPTQ differ only in the sweep (`obs_compress`'s arguments); per layer, its result.

    Example:
        >>> sweep = lambda name, w, h: obs_compress(w, h, sparsity=0.5, name=name)
        >>> results = obs_sequentially(llama, samples, layers, sweep,  # doctest: +SKIP
        ...                            dtype=torch.float32, desc="sparsegpt")
    """
    results: dict[str, OBSResult] = {}

    def compress_block(index: int, own: dict[str, nn.Module], stats: dict[str, InputHessian]) -> None:
        for name, layer in own.items():
            result = sweep(name, weight_matrix(layer), stats[name].hessian)
            set_weight_matrix(layer, result.weight)
            results[name] = result

    def statistic(name: str, layer: nn.Module) -> InputHessian:
        return InputHessian(weight_matrix(layer).shape[1], dtype, device=layer.weight.device)

    calibrate_sequentially(model, samples, layers, statistic, compress_block, desc=desc)
    return results
