"""CompiledModel.__call__: an input of a dtype an op rejects is one clear error; other errors stay PyTorch's."""

import pytest
import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile import compile
from sparta_explore.errors import InputDtypeError, SpartaError


@pytest.fixture(scope="module")
def first_op_dense(device, cache_dir):
    """A compiled MLP whose first linear is unpruned (PyTorch's own), its second one half pruned."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(4, 8)
    table = se.TeSATable({"2.weight": se.TeSA.from_mask(torch.rand(4, 16, generator=torch.Generator().manual_seed(0))
                                                        > 0.5)})
    cm = compile(model, table, (x,), device=device, cache_dir=cache_dir, tune=False, runs=1, guard=False)
    return model, table, cm, x


def test_a_float64_input_names_the_input_and_the_dtype_it_was_compiled_for(first_op_dense):
    model, table, cm, x = first_op_dense
    with pytest.raises(InputDtypeError, match=r"argument 0 is float64, but this model was compiled for float32") as e:
        cm(x.double())
    assert isinstance(e.value, SpartaError) and isinstance(e.value, TypeError)
    assert isinstance(e.value.__cause__, RuntimeError)  # PyTorch's own error stays attached
    with torch.no_grad():
        assert torch.allclose(cm(x), se.masked_copy(model, table)(x), atol=1e-5)  # float32 still runs


def test_other_failures_stay_pytorchs_own(first_op_dense):
    _, _, cm, _ = first_op_dense
    with pytest.raises(RuntimeError) as e:
        cm(torch.randn(4, 5))  # wrong width, right dtype: not a dtype problem
    assert not isinstance(e.value, InputDtypeError)
