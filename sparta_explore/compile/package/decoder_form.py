"""The package of a compressed Llama that decodes through the compiled step: its weights as the step reads them.

A model whose weights lie on quantization grids (GPTQ, `quantize_output_head`, a GGUF's own
types) is kept the way `CompiledDecoder` packs it (`kernels/packed_weights.py`): per projection
and the output head, the integer codes in their layout (4-bit nibbles, bytes) with a scale and
offset per group, or the float32 rows (pruned rows stored as values and a bit mask). Everything
else (norms, an untied embedding) is kept as it is. So a 4-bit model is a 4-bit file, and what
loads is what the step computed with when the package was written, bit for bit.

The package keeps:

* ``identity``: the Hugging Face class and config the model is rebuilt from;
* ``packed``: per weight its layout, shape, bits, group and tensors; ``state``: the other weights;
* ``act_bits``: the activation width it decodes with (`generate` uses it by default);
* the example: a prompt and its logits through the model's own modules (inputs rounded as the
  step rounds them at 8 bits), checked at load.

Loading rebuilds the model from its config, puts every packed weight back as the values the step
reads (`PackedWeight.dequantize`), ties the head and embedding as the config says, checks the
example, and attaches the packed layouts (`DecodeSettings`): `se.generate` decodes with them at
once, without packing again.

Example:
    >>> save_decoder(llama, Path("pick.sparta"), act_bits=8)       # doctest: +SKIP
    >>> model = se.load("pick.sparta"); se.generate(model, ids, 32)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sparta_explore.compile.decoder import PROJECTIONS, rounded_inputs, why_not_step_shaped
from sparta_explore.compile.generate import DecodeSettings
from sparta_explore.compile.llama_step import why_not_llama
from sparta_explore.compile.package.archive import write_package
from sparta_explore.compile.package.inplace_form import fresh_model, model_identity
from sparta_explore.compile.package.names import qualified_name
from sparta_explore.compile.package.parts import example_record, manifest, package_parts
from sparta_explore.compile.package.reading import OpenedPackage, checked_example, load_notes
from sparta_explore.compile.package.tensors import TensorStore
from sparta_explore.compile.record import CompileRecord
from sparta_explore.errors import PackageError
from sparta_explore.kernels.bitmask_rows import COLUMNS, PAD
from sparta_explore.kernels.packed_weights import FORMATS, TILE, PackedWeight, pack_weight
from sparta_explore.tracing.kv_cache import kv_cache_off

KIND = "decoder"
TOLERANCE = 1e-3  # the example's logits, relative: the step's weights on another CPU's float rounding
_FIELDS = ("data", "scale", "offset", "mask", "starts")


def decoder_weights(model: nn.Module) -> list[str]:
    """The module paths whose weights the decode step packs: each layer's projections, then the output head.

    Example:
        >>> from sparta_explore.zoo.llm.workloads import tiny_llama
        >>> decoder_weights(tiny_llama(layers=1))[-2:]
        ['model.layers.0.mlp.down_proj', 'lm_head']
    """
    return [f"model.layers.{i}.{path}" for i in range(len(model.model.layers)) for _, path in PROJECTIONS] + \
        ["lm_head"]


def _run(model: nn.Module, act_bits: int):
    def run(input_ids: torch.Tensor) -> torch.Tensor:
        with kv_cache_off(model), rounded_inputs(model) if act_bits == 8 else nullcontext():
            return model(input_ids=input_ids).logits
    return run


def _packed_record(store: TensorStore, packed: PackedWeight) -> dict[str, Any]:
    tensors = {f: store.add(getattr(packed, f)) for f in _FIELDS if getattr(packed, f) is not None}
    return {"fmt": packed.fmt, "n": packed.n, "k": packed.k, "bits": packed.bits, "group": packed.group,
            "tiles": packed.tiles, **tensors}


def _put_weights(model: nn.Module, packed: Mapping[str, PackedWeight]) -> None:
    """Each packed weight's values into its module (a tied head writes the embedding too)."""
    with torch.no_grad():
        for name, p in packed.items():
            weight = model.get_submodule(name).weight
            weight.copy_(p.dequantize().to(weight.dtype))


def packed_for_decode(model: nn.Module) -> dict[str, PackedWeight]:
    """Pack `model`'s decoder weights as the step reads them and put those values back into it (changed in place):
    afterwards the model computes what its package will, and `save_decoder(..., packed=)` saves it as measured.

    Example:
        >>> from sparta_explore.zoo.llm.workloads import tiny_llama
        >>> sorted({p.fmt for p in packed_for_decode(tiny_llama(layers=1)).values()})
        ['f32']
    """
    packed = {name: pack_weight(model.get_submodule(name).weight.detach()) for name in decoder_weights(model)}
    _put_weights(model, packed)
    return packed


def save_decoder(model: nn.Module, path: Path, *, act_bits: int = 32, example_ids: torch.Tensor | None = None,
                 metadata: Mapping[str, Any] | None = None, packed: Mapping[str, PackedWeight] | None = None
                 ) -> Path:
    """Write the Llama `model` (weights as they are: pruned, on grids or float) as a decoder package (see the module
    docstring); `example_ids` (1, t) is the prompt checked at load (default: the first 16 token ids); `packed`:
    what `packed_for_decode(model)` returned (the model holds its values), else the weights are packed here.

    Example:
        >>> save_decoder(llama, Path("m.sparta"), act_bits=8, metadata={"trial": "ab12"})   # doctest: +SKIP
    """
    why = why_not_llama(model) or why_not_step_shaped(model)
    if why is not None:
        raise PackageError(f"{type(model).__name__} cannot be saved as a decoder package: {why}")
    if act_bits not in (8, 32):
        raise PackageError(f"act_bits must be 32 or 8, got {act_bits!r}")
    if "config" not in model_identity(model):
        raise PackageError(f"{qualified_name(type(model))} is not a Hugging Face model: a decoder package rebuilds "
                           "the model from its config")
    started = time.perf_counter()
    names = decoder_weights(model)
    as_loaded = model
    if packed is None:
        packed = {name: pack_weight(model.get_submodule(name).weight.detach()) for name in names}
        as_loaded = copy.deepcopy(model)  # the example's logits from the values a load puts back
        _put_weights(as_loaded, packed)
    elif sorted(packed) != sorted(names):
        raise PackageError("save_decoder: `packed` must hold every decoder weight (packed_for_decode(model))")
    held = {f"{name}.weight" for name in names}
    head, embed = model.lm_head.weight, model.model.embed_tokens.weight
    tied = head.data_ptr() == embed.data_ptr()
    if tied:
        held.add("model.embed_tokens.weight")
    store = TensorStore()
    state = {name: store.add(t) for name, t in model.state_dict().items() if name not in held}
    # in the layout its activation width reads (int8: tiles), so a load decodes without re-laying a weight
    records = {name: _packed_record(store, p.to_tiles() if act_bits == 8 else p.to_rows())
               for name, p in packed.items()}
    ids = example_ids if example_ids is not None else torch.arange(min(16, model.config.vocab_size))[None]
    example, example_arrays = example_record(_run(as_loaded, act_bits), ((), {"input_ids": ids[:1].clone()}))
    arrays, meta = store.arrays()
    bytes_token = sum(p.nbytes for p in packed.values())
    data = {"kind": KIND, "identity": model_identity(model), "act_bits": int(act_bits), "tied": tied,
            "packed": records, "state": state, "tensors": meta, "libraries": {},
            "example": {**example, "tolerance": TOLERANCE}, "notes": [],
            "formats": {fmt: sum(p.fmt == fmt for p in packed.values()) for fmt in FORMATS},
            "bytes_per_token": bytes_token}
    parts = package_parts(data, arrays, example_arrays, {}, CompileRecord())
    return write_package(path, parts, manifest(KIND, started, 0, [], metadata))


def _packed_weight(opened: OpenedPackage, name: str, record: Mapping[str, Any]) -> PackedWeight:
    tensors = opened.decoder.tensors
    try:
        fields = {f: tensors.get(record[f]) if f in record else None for f in _FIELDS}
        p = PackedWeight(str(record["fmt"]), int(record["n"]), int(record["k"]), int(record["bits"]),
                         int(record["group"]), **fields, tiles=bool(record.get("tiles", False)))
    except (KeyError, TypeError, ValueError) as e:
        raise PackageError(f"{opened.reader.path}: the packed weight {name!r} is malformed ({e})") from None
    if p.fmt not in FORMATS or p.data is None or p.tiles and not p.can_tile:
        raise PackageError(f"{opened.reader.path}: the packed weight {name!r} has unknown layout {p.fmt!r}"
                           + (" in tiles" if p.tiles else ""))
    if p.fmt == "s32":
        _check_bitmask_rows(opened, name, p)
        return p
    rows = -(-p.n // TILE) * TILE if p.tiles else p.n
    want = rows * p.k // (2 if p.fmt == "u4" else 1)
    if p.data.numel() != want:
        raise PackageError(f"{opened.reader.path}: the packed weight {name!r} holds {p.data.numel()} values, its "
                           f"layout ({p.fmt}, {p.n} x {p.k}{', tiles' if p.tiles else ''}) takes {want}")
    return p


def _check_bitmask_rows(opened: OpenedPackage, name: str, p: PackedWeight) -> None:
    """An s32 weight's mask, row starts and values must agree, so no kernel reads past them."""
    shape = f"({p.n} x {p.k})"
    dtypes = (torch.float32, torch.uint8, torch.int32)
    if (p.mask is None or p.starts is None or p.k % COLUMNS or p.mask.numel() != p.n * p.k // COLUMNS
            or (p.data.dtype, p.mask.dtype, p.starts.dtype) != dtypes):
        raise PackageError(f"{opened.reader.path}: the packed weight {name!r} {shape} lacks its mask of "
                           f"{p.n * p.k // COLUMNS} bytes (values float32, mask uint8, starts int32)")
    kept = (p.mask.reshape(p.n, -1)[..., None].to(torch.int32) >> torch.arange(COLUMNS)) & 1
    starts = torch.zeros(p.n + 1, dtype=torch.int64)
    starts[1:] = kept.reshape(p.n, -1).sum(dim=1).cumsum(0)
    if p.starts.numel() != p.n + 1 or not torch.equal(p.starts.to(torch.int64), starts):
        raise PackageError(f"{opened.reader.path}: the packed weight {name!r} {shape}: its row starts do not "
                           "match its mask")
    if p.data.numel() != int(starts[-1]) + PAD:
        raise PackageError(f"{opened.reader.path}: the packed weight {name!r} {shape} holds {p.data.numel()} "
                           f"values, its mask keeps {int(starts[-1])} (+{PAD} padding)")


def load_decoder(opened: OpenedPackage, model: nn.Module | None, started: float) -> nn.Module:
    """The model of a decoder package: `model` (or one rebuilt from the saved config) with its weights, checked,
    its packed layouts attached for `generate`.

    Example:
        >>> model = load_decoder(open_package(reader, None, ()), None, time.perf_counter())   # doctest: +SKIP
    """
    data, path = opened.data, opened.reader.path
    identity = data.get("identity") or {}
    if model is None:
        model = fresh_model(identity, opened.decoder.allow, path)
    elif qualified_name(type(model)) != identity.get("class"):
        raise PackageError(f"{path}: holds a {identity.get('class')}, the given model is a "
                           f"{qualified_name(type(model))}")
    packed = {name: _packed_weight(opened, name, record) for name, record in (data.get("packed") or {}).items()}
    want = decoder_weights(model)
    if sorted(packed) != sorted(want):
        raise PackageError(f"{path}: its packed weights do not match the model's decoder "
                           f"({len(packed)} held, {len(want)} wanted): another architecture")
    state = {name: opened.decoder.tensors.get(key) for name, key in (data.get("state") or {}).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    held = {f"{name}.weight" for name in packed} | ({"model.embed_tokens.weight"} if data.get("tied") else set())
    missing = [n for n in missing if n not in held]
    if missing or unexpected:
        what = f"lacks {missing[0]!r}" if missing else f"holds {unexpected[0]!r}, which the model has not"
        raise PackageError(f"{path}: the package {what}: the model is another architecture")
    if bool(data.get("tied")) != (model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()):
        raise PackageError(f"{path}: the saved model's head and embedding were "
                           f"{'' if data.get('tied') else 'not '}tied; this model's are not the same")
    for name, p in packed.items():
        weight = model.get_submodule(name).weight
        if tuple(weight.shape) != (p.n, p.k):
            raise PackageError(f"{path}: {name} is {tuple(weight.shape)} here, ({p.n}, {p.k}) in the package")
    _put_weights(model, packed)
    model.eval()
    act_bits = int(data.get("act_bits", 32))
    check = checked_example(opened, _run(model, act_bits), model)
    loaded = load_notes(opened, check, time.perf_counter() - started)
    DecodeSettings.attach(model, act_bits, packed, loaded)
    return model
