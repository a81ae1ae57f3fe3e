"""Block-by-block calibration: each block is compressed on the outputs of the already-compressed blocks before it.

The flow every one-shot compressor (Wanda, SparseGPT, GPTQ, OWL's outlier pass) shares:

1. run the model up to its first block and keep what that block receives, per sample;
2. for each block: hooks on its selected linears gather a statistic of their inputs while
   the block runs on every sample; the compressor compresses those linears; the block
   runs again so the next block sees the compressed block's outputs.

Only one block's inputs are held at a time, never the whole model's activations.

A caller that kept the inputs some block `start` received in an earlier run of the same
compressions (an LLM search's trials sharing a prefix of choices) resumes there: `start` and
`start_hidden` skip the blocks before it, and `after_block` sees each block's outputs (the next
block's inputs) so they can be kept.

`true_sequential` (GPTQ's ``--true-sequential``) splits step 2 within a block: its linears
are grouped by the input they read, in call order (a Llama block: q/k/v, then o, then
gate/up, then down), and each group is calibrated on the block run with the groups before
it already compressed. Each such run stops once the group's last linear has run.
"""

from __future__ import annotations

import contextlib
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
# after_block(block index, the next block's hidden inputs per sample; None after the last block)
AfterBlockFn = Callable[[int, list[torch.Tensor] | None], None]


def layers_by_block(model: nn.Module, layers: Mapping[str, nn.Module]) -> list[dict[str, nn.Module]]:
    """`layers` grouped by the repeated block they lie in, one dict per block (empty ones too).

    Example:
        >>> net = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
        >>> [list(d) for d in layers_by_block(net, {"1": net[1]})]
        [[], ['1']]
    """
    blocks = [name for name, _ in find_blocks(model)]
    return [{n: m for n, m in layers.items() if inside(n, b)} for b in blocks]


class _GroupDone(Exception):
    """Raised by the last linear of a group once it has run: the rest of the block is not needed."""


def _gather(block: nn.Module, inputs: Sequence[BlockInput], layers: Mapping[str, nn.Module],
            make_statistic: StatisticFn, *, stop_after: str | None = None) -> dict[str, Any]:
    stats = {name: make_statistic(name, layer) for name, layer in layers.items()}

    def hook_for(name: str) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            stats[name].add(args[0])
            if name == stop_after:
                raise _GroupDone
        return record

    handles = [layer.register_forward_hook(hook_for(name)) for name, layer in layers.items()]
    try:
        for inp in inputs:
            with contextlib.suppress(_GroupDone):  # the group's last linear ran: the rest is not needed
                block(*inp.args, **inp.kwargs)
    finally:
        for h in handles:
            h.remove()
    return stats


def input_groups(block: nn.Module, sample: BlockInput, layers: Mapping[str, nn.Module]) -> list[dict[str, nn.Module]]:
    """`layers` of `block` grouped by the input tensor they read, in the order the block calls them.

    Consecutive calls on one tensor form a group (a Llama block: q/k/v, o, gate/up, down).
    If the block does not call every layer on `sample`, all of them form one group.

    Example:
        >>> groups = input_groups(llama.model.layers[0], inputs[0], own)   # doctest: +SKIP
        >>> [list(g) for g in groups][0]                                    # doctest: +SKIP
        ['model.layers.0.self_attn.q_proj', 'model.layers.0.self_attn.k_proj', 'model.layers.0.self_attn.v_proj']
    """
    calls: list[tuple[str, Any]] = []  # (name, its input): the inputs are held, so no two alive share an id

    def hook_for(name: str) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple[Any, ...]) -> None:
            if all(name != n for n, _ in calls):
                calls.append((name, args[0]))
        return record

    handles = [layer.register_forward_pre_hook(hook_for(name)) for name, layer in layers.items()]
    try:
        block(*sample.args, **sample.kwargs)
    finally:
        for h in handles:
            h.remove()
    if len(calls) != len(layers):
        return [dict(layers)]
    groups: list[dict[str, nn.Module]] = []
    previous = None
    for name, x in calls:
        if previous is None or x is not previous:
            groups.append({})
        groups[-1][name] = layers[name]
        previous = x
    return groups


def calibrate_sequentially(model: nn.Module, samples: Sequence[CalibrationSample], layers: Mapping[str, nn.Module],
                           make_statistic: StatisticFn, compress: CompressFn, *, desc: str = "one-shot",
                           true_sequential: bool = False, start: int = 0,
                           start_hidden: Sequence[torch.Tensor] | None = None,
                           after_block: AfterBlockFn | None = None) -> None:
    """Run `compress` on each block's `layers`, in order, each calibrated on the compressed blocks' outputs.

    `make_statistic(name, layer)` builds what a layer's inputs accumulate into (an
    `InputHessian`, `InputChannelNorms`); `compress(index, block_layers, statistics)`
    changes the block's weights and may return an undo, run once the block's outputs are
    computed. Blocks without a selected layer are only run. The model runs in eval mode,
    without gradients; its train/eval mode is restored afterwards. `true_sequential`: see
    the module docstring (each group's undo waits for the block's outputs too). `start`,
    `start_hidden` (the hidden states block `start` receives, per sample) and `after_block`:
    resuming (the module docstring); blocks before `start` are neither run nor compressed.

    Example:
        >>> def stat(name, layer): return InputHessian(layer.in_features)
        >>> calibrate_sequentially(llama, samples, layers, stat, my_compress)  # doctest: +SKIP
    """
    blocks = find_blocks(model)
    grouped = layers_by_block(model, layers)
    if not 0 <= start < len(blocks) or (start > 0) != (start_hidden is not None):
        raise ValueError(f"calibrate_sequentially: start {start} of {len(blocks)} blocks needs the hidden states "
                         "that block receives (start_hidden), and only then")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            inputs = capture_block_inputs(model, blocks[0][1], samples)  # the other inputs (masks, rotary) too
            if start_hidden is not None:
                if len(start_hidden) != len(inputs):
                    raise ValueError(f"calibrate_sequentially: {len(start_hidden)} hidden states for "
                                     f"{len(inputs)} samples")
                inputs = [inp.with_hidden(h) for inp, h in zip(inputs, start_hidden)]
            bar = tqdm(list(enumerate(blocks))[start:], desc=desc, unit="block", leave=False, disable=None)
            for index, (_, block) in bar:
                own = grouped[index]
                undos = []
                try:
                    parts = input_groups(block, inputs[0], own) if own and true_sequential else [own] if own else []
                    for part in parts:
                        stats = _gather(block, inputs, part, make_statistic,
                                        stop_after=list(part)[-1] if true_sequential else None)
                        undos.append(compress(index, part, stats))
                    if index + 1 < len(blocks):
                        inputs = [inp.with_hidden(block_output(block, inp)) for inp in inputs]
                finally:
                    for undo in undos:
                        if undo is not None:
                            undo()
                if after_block is not None:
                    after_block(index, [inp.hidden for inp in inputs] if index + 1 < len(blocks) else None)
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
                     desc: str, true_sequential: bool = False, start: int = 0,
                     start_hidden: Sequence[torch.Tensor] | None = None,
                     after_block: AfterBlockFn | None = None) -> dict[str, OBSResult]:
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

    calibrate_sequentially(model, samples, layers, statistic, compress_block, desc=desc,
                           true_sequential=true_sequential, start=start, start_hidden=start_hidden,
                           after_block=after_block)
    return results
