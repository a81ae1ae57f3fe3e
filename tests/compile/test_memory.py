"""What a compile leaves in memory: no cyclic garbage of its own, and a model freed the moment it is dropped."""

import copy
import gc
import weakref
from contextlib import contextmanager

import torch
import torch.fx as fx
from torch import nn

import sparta_explore as se
from sparta_explore.compile.memory import collecting_temporaries, weakly_owned
from sparta_explore.pruners import prune
from sparta_explore.pruners.block import BlockPruneConfig


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _garbage_now() -> list:
    """What a full collection finds unreachable now (kept for the test to read, then dropped)."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@contextmanager
def _no_collections():
    """No automatic garbage collection inside: what is freed there, reference counting freed."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _compiled(cache_dir, device):
    torch.manual_seed(0)
    model, x = Net().eval(), torch.randn(16, 32)
    table = prune(model, BlockPruneConfig(sparsity=0.8, block=(1, 1), op_names=("fc1", "fc2")), pruner="block")
    # no guard: the compiled graph runs (a model this small would run the user's own, masked: no graph at all)
    return se.compile(model, table, (x,), cache_dir=cache_dir, device=device, tune=False, guard=False), x


def test_a_weakly_owned_graph_module_is_freed_without_a_collection():
    gm = weakly_owned(fx.symbolic_trace(Net()))
    assert gm.graph.owning_module is gm
    ref = weakref.ref(gm)
    with _no_collections():
        del gm
        assert ref() is None


def test_a_weakly_owned_graph_module_still_edits_copies_and_runs():
    net, x = Net().eval(), torch.randn(3, 32)
    gm = weakly_owned(fx.symbolic_trace(net))
    relu = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_after(relu):
        doubled = gm.graph.call_function(torch.mul, (relu, 2.0))
    relu.replace_all_uses_with(doubled, delete_user_cb=lambda user: user is not doubled)
    gm.graph.eliminate_dead_code()   # asks owning_module whether a called module is impure
    gm.graph.lint()
    gm.recompile()
    expected = net.fc2(2 * torch.relu(net.fc1(x)))
    torch.testing.assert_close(gm(x), expected)
    twin = copy.deepcopy(gm)
    assert twin.graph.owning_module is twin
    torch.testing.assert_close(twin(x), expected)


def test_a_compile_leaves_no_cyclic_garbage_and_its_model_goes_with_its_last_reference(cache_dir, device):
    gc.collect()
    cm, x = _compiled(cache_dir, device)
    left = [o for o in _garbage_now() if isinstance(o, (fx.GraphModule, torch.Tensor))]
    assert left == []   # the compile's references were freed as it returned
    assert isinstance(cm.module, fx.GraphModule)
    module = weakref.ref(cm.module)
    assert torch.isfinite(cm(x)).all()
    with _no_collections():
        del cm
        assert module() is None


class _Pair:
    """An object that can be weakly referenced, paired into a cycle."""


def test_collecting_frees_the_blocks_cycles_and_unfreezes():
    before = _Pair()
    with collecting_temporaries():
        assert gc.get_freeze_count() > 0   # what existed before is not scanned
        a, b = _Pair(), _Pair()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        del a, b
    assert ref() is None
    assert gc.get_freeze_count() == 0
    assert before is not None


def test_collecting_does_not_unfreeze_what_the_process_froze():
    # an object the process froze stays in the permanent generation (gc.get_objects() lists the other three);
    # the freeze count alone moved by 2 in one run: frozen objects freed by reference counting leave it
    probe = [object()]
    gc.freeze()
    try:
        assert not any(o is probe for o in gc.get_objects())
        with collecting_temporaries():
            pass
        assert gc.get_freeze_count() > 0 and not any(o is probe for o in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(o is probe for o in gc.get_objects())  # the check sees an unfreeze
