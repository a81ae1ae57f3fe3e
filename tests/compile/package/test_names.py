"""Code by name: only trusted roots resolve, and nothing that loads, saves or runs other code does."""

import operator

import pytest
import torch

from sparta_explore.compile.package.names import check_name, qualified_name, resolve
from sparta_explore.errors import PackageError


@pytest.mark.parametrize("fn", [torch.reshape, operator.getitem, getattr, torch.ops.aten.__and__.Tensor,
                                torch.nn.functional.gelu, torch._C._nn.scaled_dot_product_attention])
def test_the_functions_graphs_call_resolve_back(fn):
    assert resolve(qualified_name(fn), "node") is fn or resolve(qualified_name(fn), "node").__name__ == fn.__name__


@pytest.mark.parametrize("name", ["os.system", "subprocess.run", "builtins.eval", "builtins.open",
                                  "builtins.__import__",
                                  "torch.hub.load", "torch.load", "torch.utils.cpp_extension.load",
                                  "transformers.AutoModel.from_pretrained", "sparta_explore.kernels.build.build",
                                  "sparta_explore.workload.load_workload", "torch.Tensor.__reduce_ex__", "not a name"])
def test_code_outside_the_trusted_roots_is_refused(name):
    with pytest.raises(PackageError):
        check_name(name)


def test_a_users_own_package_is_allowed_when_named():
    with pytest.raises(PackageError, match="allow=\\['json'\\]"):
        resolve("json.dumps", "module")
    assert resolve("json.dumps", "module", allow=("json",))([1]) == "[1]"


def test_a_moved_class_resolves_under_the_name_older_packages_hold():
    from sparta_explore.kernels import Int8SparseLinear

    assert resolve("sparta_explore.kernels.sparse_linear.Int8SparseLinear", "module fc") is Int8SparseLinear
