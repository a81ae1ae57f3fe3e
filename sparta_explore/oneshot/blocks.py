"""A model's repeated blocks, the linears inside them, and the inputs its first block receives.

One-shot compressors calibrate block by block ("layer by layer" in the papers): a
transformer's decoder layers are the longest `nn.ModuleList` of modules of one class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sparta_explore.errors import ConfigError
from sparta_explore.oneshot.calibration import CalibrationSample, to_device
from sparta_explore.tracing.kv_cache import kv_cache_off

# classes whose forward is a GEMM on the last dim of their input: nn.Linear (and subclasses),
# and Hugging Face's Conv1D (GPT-2), which stores its weight transposed, (in, out)
LINEAR_TYPES = frozenset({"Linear", "Conv1D"})
TRANSPOSED_TYPES = frozenset({"Conv1D"})


@dataclass(frozen=True)
class BlockInput:
    """The positional and keyword inputs one block receives for one sample.

    Example:
        >>> BlockInput((torch.zeros(1, 2, 8),), {"use_cache": False}).hidden.shape
        torch.Size([1, 2, 8])
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def hidden(self) -> torch.Tensor:
        """The hidden states: the first positional input, else the `hidden_states` keyword."""
        return self.args[0] if self.args else self.kwargs["hidden_states"]

    def with_hidden(self, hidden: torch.Tensor) -> BlockInput:
        """The same inputs with the hidden states replaced (the previous block's output)."""
        if self.args:
            return BlockInput((hidden, *self.args[1:]), self.kwargs)
        return BlockInput((), {**self.kwargs, "hidden_states": hidden})


def is_linear(module: nn.Module) -> bool:
    """Whether `module` is a GEMM on its input's last dim (nn.Linear, a subclass, or HF Conv1D).

    Example:
        >>> is_linear(nn.Linear(2, 3)), is_linear(nn.Conv2d(2, 3, 1))
        (True, False)
    """
    return bool({c.__name__ for c in type(module).__mro__} & LINEAR_TYPES) and getattr(module, "weight", None) \
        is not None


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks, (FQN, module) in order: the longest `nn.ModuleList` of one class.

    A model without such a list is one block, itself (FQN "").

    Example:
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]))
        >>> [name for name, _ in find_blocks(net)]
        ['1.0', '1.1']
        >>> [name for name, _ in find_blocks(nn.Linear(4, 4))]
        ['']
    """
    best: tuple[str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        same_class = isinstance(module, nn.ModuleList) and len(module) > 0 and len({type(m) for m in module}) == 1
        if same_class and (best is None or len(module) > len(best[1])):
            best = (name, module)
    if best is None:
        return [("", model)]
    prefix, blocks = best
    return [(f"{prefix}.{i}" if prefix else str(i), block) for i, block in enumerate(blocks)]


def inside(name: str, block: str) -> bool:
    """Whether module FQN `name` is block `block` or lies inside it ("" is the whole model).

    Example:
        >>> inside("layers.1.mlp", "layers.1"), inside("layers.10", "layers.1")
        (True, False)
    """
    return block in ("", name) or name.startswith(block + ".")


def select_linears(model: nn.Module, blocks: Sequence[str], op_names: Sequence[str] | None = None,
                   exclude_op_names: Sequence[str] = ()) -> dict[str, nn.Module]:
    """The linears a one-shot compressor works on, by FQN in module order.

    Default: every linear inside the blocks (so embeddings and `lm_head` stay dense).
    `op_names` picks some; a name that is not a submodule, not a linear, or outside the
    blocks (calibration never reaches it) is a `ConfigError` naming it.

    Example:
        >>> net = nn.Sequential(nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)]), nn.Linear(4, 2))
        >>> list(select_linears(net, ["0.0", "0.1"]))
        ['0.0', '0.1']
        >>> select_linears(net, ["0.0", "0.1"], op_names=["head"])
        Traceback (most recent call last):
        ...
        sparta_explore.errors.ConfigError: op_names ['head'] are not submodules of Sequential
    """
    named = dict(model.named_modules())
    for key, names in (("op_names", op_names or ()), ("exclude_op_names", exclude_op_names)):
        missing = [n for n in names if n not in named]
        if missing:
            raise ConfigError(f"{key} {missing} are not submodules of {type(model).__name__}")

    def in_blocks(name: str) -> bool:
        return any(inside(name, b) for b in blocks)

    if op_names is not None:
        for name in op_names:
            if not is_linear(named[name]):
                raise ConfigError(f"op_names: {name!r} is a {type(named[name]).__name__}; one-shot compressors work "
                                  "on linear layers (nn.Linear, Conv1D)")
            if not in_blocks(name):
                raise ConfigError(f"op_names: {name!r} lies outside the model's repeated blocks ({blocks[0]} .. "
                                  f"{blocks[-1]}); block-by-block calibration never reaches it")
    if op_names is not None:
        wanted = set(op_names)
        chosen = {n: m for n, m in named.items() if n in wanted and n not in exclude_op_names}
    else:
        chosen = {n: m for n, m in named.items() if n and n not in exclude_op_names and in_blocks(n) and is_linear(m)}
    if not chosen:
        raise ConfigError(f"no linear layer of {type(model).__name__} is left to compress "
                          f"(op_names={list(op_names) if op_names is not None else None}, "
                          f"exclude_op_names={list(exclude_op_names)})")
    return chosen


def linears_in_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """Every linear inside the model's repeated blocks, by FQN (empty when there is none).

    Example:
        >>> list(linears_in_blocks(nn.Sequential(nn.ModuleList([nn.Linear(2, 2)]), nn.Linear(2, 2))))
        ['0.0']
    """
    blocks = [name for name, _ in find_blocks(model)]
    return {n: m for n, m in model.named_modules() if n and is_linear(m) and any(inside(n, b) for b in blocks)}


def weight_matrix(module: nn.Module) -> torch.Tensor:
    """The module's weight as a GEMM sees it, (out, in): transposed for Conv1D.

    Example:
        >>> weight_matrix(nn.Linear(3, 2)).shape
        torch.Size([2, 3])
    """
    return module.weight.t() if type(module).__name__ in TRANSPOSED_TYPES else module.weight


def set_weight_matrix(module: nn.Module, matrix: torch.Tensor) -> None:
    """Overwrite the module's weight, in place, with an (out, in) matrix (stored transposed for Conv1D)."""
    stored = matrix.t() if type(module).__name__ in TRANSPOSED_TYPES else matrix
    with torch.no_grad():
        module.weight.copy_(stored.to(module.weight.dtype))


class _Caught(Exception):
    """Raised by the pre-hook on the first block: the model's forward stops there (the Catcher trick)."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("first block reached")
        self.args_, self.kwargs_ = args, kwargs


def _no_cache(kwargs: dict[str, Any]) -> dict[str, Any]:
    # each sample is replayed many times: a KV cache would grow with every replay
    out = dict(kwargs)
    if "use_cache" in out:
        out["use_cache"] = False
    if "past_key_values" in out:
        out["past_key_values"] = None
    return out


def model_device(model: nn.Module) -> torch.device:
    """Where the model's first parameter lives (CPU for a model without parameters)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def capture_block_inputs(model: nn.Module, first_block: nn.Module,
                         samples: Sequence[CalibrationSample]) -> list[BlockInput]:
    """What `first_block` receives for each sample: the model runs up to it, then a pre-hook stops it.

    Attention masks, position ids and rotary `position_embeddings` come along as keyword
    inputs; KV caches are switched off (`use_cache=False`). When `first_block` is the
    model itself, the samples are its inputs.

    Example:
        >>> blocks = find_blocks(llama)                                      # doctest: +SKIP
        >>> inputs = capture_block_inputs(llama, blocks[0][1], samples)     # doctest: +SKIP
    """
    device = model_device(model)
    if first_block is model:
        return [BlockInput(to_device(s.args, device), _no_cache(to_device(s.kwargs, device))) for s in samples]

    def stop(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        raise _Caught(args, kwargs)

    handle = first_block.register_forward_pre_hook(stop, with_kwargs=True)
    captured = []
    try:
        with torch.no_grad(), kv_cache_off(model):
            for i, sample in enumerate(samples):
                try:
                    model(*to_device(sample.args, device), **to_device(sample.kwargs, device))
                except _Caught as caught:
                    captured.append(BlockInput(caught.args_, _no_cache(caught.kwargs_)))
                else:
                    raise ConfigError(f"calibration sample {i} ran through {type(model).__name__} without calling "
                                      "its first repeated block")
    finally:
        handle.remove()
    return captured


def block_output(block: nn.Module, inp: BlockInput) -> torch.Tensor:
    """The block's hidden-state output for one input (the first element when it returns a tuple)."""
    out = block(*inp.args, **inp.kwargs)
    if isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise ConfigError(f"block {type(block).__name__} returned a {type(out).__name__}, not hidden states")
    return out
