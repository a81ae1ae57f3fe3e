"""A model de-quantized from a GGUF file, kept as float32 safetensors: read once, then in seconds.

Reading SmolLM2's GGUF through `transformers` takes ~40 s on 2 cores, nearly all of it in the
`gguf` package's Python reader (field parsing, tensor-name maps), not in de-quantization. Every
process that loads the model (a test, a notebook, each NNI trial) paid it. The first load saves
the float32 model with `save_pretrained` (safetensors, tied weights kept tied, its config and
generation config) under the cache folder; later loads read that folder with `from_pretrained`.

The entry's key is the GGUF file's path, size and modification time and the versions of
`transformers`, `gguf` and `torch`: a changed file or reader makes a new entry. Entries are
written to a temporary folder and renamed into place, so concurrent first loads never see a
torn one; a cache that cannot be written costs only the speed.

Example:
    >>> model = cached_fp32_model(gguf_path, lambda: slow_gguf_load(gguf_path))  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from torch import nn

from sparta_explore.cache import content_key, resolve_cache_dir

SUB = "zoo/gguf-fp32"
READERS = ("transformers", "gguf", "torch")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"


def entry_key(source: Path) -> str:
    """The cache key of a model read from `source`: the file's identity and the readers' versions.

    Example:
        >>> len(entry_key(Path(__file__)))
        16
    """
    stat = source.stat()
    return content_key({"file": str(source.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                        **{name: _version(name) for name in READERS}})


def cached_fp32_model(source: str | os.PathLike, load: Callable[[], nn.Module],
                      cache_dir: str | os.PathLike | None = None) -> nn.Module:
    """`load()`'s model (a float32 Hugging Face causal LM read from the file `source`), from the cache when an
    entry for `source` exists, else loaded and saved there. Returned in eval mode.

    Example:
        >>> llm = cached_fp32_model(gguf, lambda: AutoModelForCausalLM.from_pretrained(...))  # doctest: +SKIP
    """
    from transformers import AutoModelForCausalLM

    source = Path(source)
    try:
        entry = resolve_cache_dir(cache_dir, SUB) / entry_key(source)
    except OSError as e:
        warnings.warn(f"no cache folder for {source.name}'s float32 copy ({e}); reading the file", stacklevel=2)
        return load().eval()
    if (entry / "config.json").is_file():
        import torch

        model = AutoModelForCausalLM.from_pretrained(entry, local_files_only=True, dtype=torch.float32)
        model.config._name_or_path = str(source.parent)  # as the file's own load names it, not the cache folder
        return model.eval()
    model = load()
    try:
        staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}."))
        try:
            model.save_pretrained(staging, safe_serialization=True)
            os.replace(staging, entry)
        except OSError:
            if not (entry / "config.json").is_file():  # not another process's finished entry: a real failure
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as e:
        warnings.warn(f"could not keep {source.name}'s float32 copy in {entry.parent} ({e}); the next load reads "
                      "the file again", stacklevel=2)
    return model.eval()
