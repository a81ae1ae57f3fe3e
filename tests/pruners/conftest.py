"""A tiny random Llama with outlier input channels, and its calibration / held-out token ids (one-shot pruner tests)."""

from collections.abc import Callable

import pytest
import torch

transformers = pytest.importorskip("transformers")

# embedding columns scaled up, so input channels are unequal as in real LLMs; spread out, as real outliers
# are, so each lies in its own N:M group
OUTLIER_CHANNELS = (3, 21, 38, 57)


def build_tiny_llama() -> torch.nn.Module:
    """The same random 2-block Llama (hidden 64, MLP 128, 4 heads, vocab 256) on every call."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(1234)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                      use_cache=False)
    model = transformers.LlamaForCausalLM(config).eval()
    torch.random.set_rng_state(generator_state)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, list(OUTLIER_CHANNELS)] *= 20
    return model


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: the ops are tiny, and on a shared 2-core machine a second thread only adds contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
