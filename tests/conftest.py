"""Shared fixtures: one trained-weights cache per test session, the digits split, small models; gcc once per source."""

import importlib
import os
import random
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

# pytest-xdist workers share the cores: OpenMP threads that spin at a barrier would hold a core the other
# worker's threads need (a decode step has 180 barriers a token: minutes lost), so waiting threads sleep.
# Read once, when an OpenMP runtime starts: before torch (or any kernel library) is loaded.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1 and "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from sparta_explore.zoo import load_digits_split, pretrained  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--isa", default="native", choices=("native", "avx2"),
                     help="run every kernel as on a CPU with nothing above this instruction set "
                          "(avx2: checks the AVX2 paths on an AVX-512 machine)")


def pytest_configure(config):
    from sparta_explore.kernels import set_target_isa

    set_target_isa(config.getoption("--isa"))


def pytest_collection_modifyitems(config, items):
    """Tests marked `first(minutes)` run before the rest, longest first: started last, one would hold a worker
    alone while the other idles."""
    def order(item):
        mark = item.get_closest_marker("first")
        return (0, -float(mark.args[0] if mark.args else 1)) if mark is not None else (1, 0.0)

    items.sort(key=order)  # stable: the others keep their order


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same global random state, so none depends on which tests ran before it.

    A test that builds `nn.Linear(...)` draws its weights from torch's global generator; without
    this, a clean clone's run order once handed a constant-channels test weights under which its
    channel stayed zero (the pass rightly built no bias map, and the test failed).
    """
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)


@pytest.fixture(scope="session", autouse=True)
def _gcc_once_per_source(tmp_path_factory):
    """Each distinct kernel source is compiled once per session; a test asking for it again gets the same bytes.

    Tests build into cache folders of their own (`tmp_path`), so without this the suite ran gcc 630 times for 284
    distinct libraries (Zen 4: 458 of its 665 s, 249 s of them repeats). The key of a build names everything gcc
    reads (source, flags, compiler, CPU flags: `build.build`), and gcc's output for one input is the same every
    time, so a repeat takes a copy of the first build's library, source and record into the test's own folder:
    `build` still finds, records, checks (`library_problem`), evicts and loads it as after gcc.
    """
    build = importlib.import_module("sparta_explore.kernels.build")  # the module: the package exports `build()`
    store = tmp_path_factory.mktemp("gcc-once")
    real = build._compile
    files = (lambda path: path, lambda path: path.with_suffix(".c"), build._record_path)

    def compile_once(source: str, name: str, flags: tuple[str, ...], folder: Path, path: Path) -> None:
        first = store / path.name
        # no compiler: gcc's own path, and its error (a copy would hide a machine without gcc)
        if shutil.which(build.COMPILER) is None or not build._record_path(first).exists():
            real(source, name, flags, folder, path)
            _copy_all(files, path, first)
            return
        _copy_all(files, first, path)

    build._compile = compile_once
    yield
    build._compile = real


def _copy_all(files, source: Path, target: Path) -> None:
    # the record last, each file whole (copied aside, then renamed): a reader never sees part of an entry
    for where in files:
        aside = where(target).with_name(f".{uuid.uuid4().hex}.tmp")
        shutil.copyfile(where(source), aside)
        os.replace(aside, where(target))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """A private cache for the session: tests never read or write the user's cache."""
    return tmp_path_factory.mktemp("sparta-cache")


@pytest.fixture(scope="session")
def digits():
    return load_digits_split()


@pytest.fixture
def digits_task(cache_dir):
    """The built-in digits workload of a model, by name: the data, loss and metrics compressors train with."""
    from sparta_explore.workload import load_workload

    return lambda name: load_workload(name, cache_dir=cache_dir)


@pytest.fixture
def trained(cache_dir, digits):
    """A fresh copy of a trained digits model, by name (training happens once per session)."""
    def load(name):
        model, _ = pretrained(name, cache_dir=cache_dir, data=digits)
        return model
    return load


@pytest.fixture(scope="session")
def device(cache_dir):
    """This machine's device profile, measured once per session on the small reference problem."""
    from sparta_explore.device import DeviceProfile

    return DeviceProfile.load_or_measure(quick=True, cache_dir=cache_dir)


@pytest.fixture
def no_compiler(monkeypatch):
    """A machine without gcc: PATH empty, and the compiler lookups that are cached per process forgotten."""
    from sparta_explore.kernels.build import compiler_version, warn_compiler_missing

    monkeypatch.setenv("PATH", "/nonexistent")
    compiler_version.cache_clear()
    warn_compiler_missing.cache_clear()
    yield
    monkeypatch.undo()
    compiler_version.cache_clear()
    warn_compiler_missing.cache_clear()


# One-shot compressor tests (tests/oneshot, tests/pruners): a tiny random Llama with outlier input channels.
# embedding columns scaled up, so input channels are unequal as in real LLMs; spread out, as real outliers
# are, so each lies in its own N:M group
OUTLIER_CHANNELS = (3, 21, 38, 57)


def build_tiny_llama() -> torch.nn.Module:
    """The same random 2-block Llama (hidden 64, MLP 128, 4 heads, vocab 256) on every call."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(1234)
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                      use_cache=False)
    model = transformers.LlamaForCausalLM(config).eval()
    torch.random.set_rng_state(generator_state)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, list(OUTLIER_CHANNELS)] *= 20
    return model


@pytest.fixture
def tiny_llama() -> Callable[[], torch.nn.Module]:
    return build_tiny_llama


@pytest.fixture
def calib_ids() -> torch.Tensor:
    return torch.randint(0, 256, (32, 32), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def held_out_ids() -> torch.Tensor:
    return torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(2))


def relative_logits_error(model: torch.nn.Module, reference: torch.nn.Module, ids: torch.Tensor) -> float:
    """Mean squared logits difference, relative to the reference's mean squared logits."""
    with torch.no_grad():
        ref = reference(ids).logits
        return float((model(ids).logits - ref).square().mean() / ref.square().mean())


@pytest.fixture
def logits_error() -> Callable[[torch.nn.Module, torch.nn.Module, torch.Tensor], float]:
    return relative_logits_error
