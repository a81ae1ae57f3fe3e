"""The embedded models, registered by name with their example inputs.

Example:
    >>> model = build_model("digits-cnn")
    >>> x, = example_inputs("digits-cnn", batch=4)
    >>> model(x).shape
    torch.Size([4, 10])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from sparta_explore.registry import Registry
from sparta_explore.zoo.bert import BertConfig, BertEncoder, DigitsTransformer
from sparta_explore.zoo.convnets import MobileNetMini, MobileNetV2Mini, ResNetMini
from sparta_explore.zoo.digits_models import DigitsCNN, DigitsMLP


@dataclass(frozen=True)
class ModelSpec:
    """How to build one embedded model and feed it.

    `task` is "digits" for models that train on the bundled digits (they take
    (N, 1, 8, 8)); None for latency models with random weights.
    """

    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    default_batch: int
    task: str | None
    description: str


_MODELS: Registry[ModelSpec] = Registry("model")


def register_model(name: str, *, input_shape: tuple[int, ...], default_batch: int, task: str | None,
                   description: str) -> Callable[[Callable[[], nn.Module]], Callable[[], nn.Module]]:
    """Decorator adding a model builder to the zoo under `name`."""
    def add(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
        _MODELS.add(name, ModelSpec(name, build, tuple(input_shape), default_batch, task, description))
        return build
    return add


def model_names(task: str | None = None) -> list[str]:
    """Registered model names, optionally only those of one task ("digits")."""
    return [s.name for s in _MODELS.values() if task is None or s.task == task]


def get_spec(name: str) -> ModelSpec:
    """The spec of model `name`; an unknown name is a `ConfigError` listing the choices."""
    return _MODELS.get(name)


def build_model(name: str, seed: int = 0) -> nn.Module:
    """A freshly initialised model `name` (weights seeded by `seed`), in eval mode."""
    spec = get_spec(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = spec.build()
    return model.eval()


def example_inputs(name: str, batch: int | None = None, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random inputs of the model's input shape, batch `batch` (default: the spec's)."""
    spec = get_spec(name)
    g = torch.Generator().manual_seed(seed)
    b = spec.default_batch if batch is None else batch
    return (torch.rand((b, *spec.input_shape), generator=g),)


@register_model("digits-cnn", input_shape=(1, 8, 8), default_batch=64, task="digits",
                description="conv-BN-ReLU x2 + max-pool + 2 linears, for the 8x8 digits")
def _digits_cnn() -> nn.Module:
    return DigitsCNN()


@register_model("digits-mlp", input_shape=(1, 8, 8), default_batch=64, task="digits",
                description="64-256-128-10 MLP, for the 8x8 digits")
def _digits_mlp() -> nn.Module:
    return DigitsMLP()


# A CNN whose convs carry the time (64 -> 128 3x3 over 8x8 at batch 256, ~2.4 GFLOP), so conv
# kernel choice shows in measured latency; digits-cnn's 16/32-channel convs run in ~1 ms,
# mostly fixed overheads that no sparsity removes.
@register_model("digits-cnn-wide", input_shape=(1, 8, 8), default_batch=256, task="digits",
                description="conv-BN-ReLU x2 (64, 128 channels) + max-pool + 2048-256-10 head (latency batch 256)")
def _digits_cnn_wide() -> nn.Module:
    return DigitsCNN(channels=(64, 128), hidden=256)


# The embedded default for exploration: the digits' accuracy with the weight shapes of a
# BERT-base FFN (768 -> 3072 -> 768), so pruned/quantized kernels have real work to skip;
# the 64-256-128 digits MLP takes ~0.1 ms, where kernel choice cannot show in a measurement.
@register_model("digits-ffn", input_shape=(1, 8, 8), default_batch=256, task="digits",
                description="64-768-3072-768-10 MLP: BERT-base FFN shapes on the 8x8 digits (latency batch 256)")
def _digits_ffn() -> nn.Module:
    return DigitsMLP(hidden=(768, 3072, 768))


@register_model("digits-resnet", input_shape=(1, 8, 8), default_batch=64, task="digits",
                description="ResNet-style basic blocks with residual adds, for the 8x8 digits")
def _digits_resnet() -> nn.Module:
    return ResNetMini()


@register_model("digits-mobilenet", input_shape=(1, 8, 8), default_batch=64, task="digits",
                description="MobileNet-style depthwise-separable blocks, for the 8x8 digits")
def _digits_mobilenet() -> nn.Module:
    return MobileNetMini()


@register_model("digits-transformer", input_shape=(1, 8, 8), default_batch=64, task="digits",
                description="2-layer encoder over the 8 image rows as tokens, for the 8x8 digits")
def _digits_transformer() -> nn.Module:
    return DigitsTransformer()


@register_model("bert-tiny", input_shape=(16, 64), default_batch=2, task=None,
                description="2-layer BERT-style encoder, hidden 64, 4 heads, FFN 256 (tests)")
def _bert_tiny() -> nn.Module:
    return BertEncoder(BertConfig.tiny())


@register_model("bert-base", input_shape=(128, 768), default_batch=32, task=None,
                description="one BERT-base encoder layer (768 hidden, 12 heads, 3072 FFN), batch 32 x seq 128")
def _bert_base() -> nn.Module:
    return BertEncoder(BertConfig.base())


@register_model("resnet-32", input_shape=(3, 32, 32), default_batch=32, task=None,
                description="ResNet-style model, widths 32/64/128, 2 blocks each, 3x32x32 input (latency)")
def _resnet_32() -> nn.Module:
    return ResNetMini(widths=(32, 64, 128), blocks=2, in_channels=3)


@register_model("mobilenet-32", input_shape=(3, 32, 32), default_batch=32, task=None,
                description="MobileNet-style model, widths 64..512, 3x32x32 input (latency)")
def _mobilenet_32() -> nn.Module:
    return MobileNetMini(widths=(64, 128, 128, 256, 256, 512), strides=(1, 2, 1, 2, 1, 2), stem=32,
                         in_channels=3)


@register_model("mobilenetv2-32", input_shape=(3, 32, 32), default_batch=8, task=None,
                description="MobileNetV2-style inverted residuals (expand-BN-ReLU6, depthwise-BN-ReLU6, project-BN, "
                            "add), 3x32x32 input (latency)")
def _mobilenetv2_32() -> nn.Module:
    return MobileNetV2Mini()
