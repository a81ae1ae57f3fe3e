"""One activation table: the planner fuses exactly its fx targets, kernels and references read it."""

import pytest
import torch

from sparta_explore.activations import ACTIVATIONS, Activation, register_activation
from sparta_explore.kernels.bsr_codegen import _ACTIVATIONS
from sparta_explore.kernels.sparse_linear import _ACT
from sparta_explore.plan.planner import FUSABLE


def test_every_consumer_sees_the_same_names():
    assert set(_ACTIVATIONS) == set(_ACT) == set(ACTIVATIONS)
    assert set(FUSABLE.values()) == {n for n, a in ACTIVATIONS.items() if a.fx_targets}
    for act in ACTIVATIONS.values():
        assert all(FUSABLE[t] == act.name for t in act.fx_targets)


def test_torch_functions_compute_the_named_op():
    x = torch.linspace(-3, 3, 13)
    assert torch.equal(ACTIVATIONS["none"].torch_fn(x), x)
    assert torch.equal(ACTIVATIONS["relu"].torch_fn(x), x.clamp_min(0))
    assert torch.allclose(ACTIVATIONS["gelu"].torch_fn(x), 0.5 * x * (1 + torch.erf(x / 2 ** 0.5)), atol=1e-6)


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match="relu"):
        register_activation(Activation("relu", "", ACTIVATIONS["none"].torch_fn))


def test_relu6_and_silu_compute_the_named_op():
    x = torch.linspace(-90, 90, 181)
    assert torch.equal(ACTIVATIONS["relu6"].torch_fn(x), x.clamp(0, 6))
    assert torch.allclose(ACTIVATIONS["silu"].torch_fn(x), x * torch.sigmoid(x))
