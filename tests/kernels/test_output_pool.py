"""The output pool reuses only memory nobody can read any more; results stay intact while held."""

import torch

from sparta_explore.kernels import SparseLinear, output_pool


def test_a_dropped_output_is_reused_and_a_held_one_never_is():
    output_pool.clear()
    first = output_pool.take((8, 16))
    ptr = first.data_ptr()
    held = output_pool.take((8, 16))  # first is still held: a new buffer
    assert held.data_ptr() != ptr
    del first
    again = output_pool.take((16, 8))  # same element count, another shape: a view of the freed buffer
    assert again.data_ptr() == ptr and again.shape == (16, 8)
    output_pool.clear()


def test_a_kernel_never_overwrites_a_result_someone_holds(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(64, 32)
    layer = SparseLinear(w, None, torch.rand(64, 32) > 0.5, cache_dir=tmp_path)
    x1, x2 = torch.randn(100, 32), torch.randn(100, 32)
    y1 = layer(x1)
    keep = y1.clone()
    y2 = layer(x2)
    assert torch.equal(y1, keep) and y1.data_ptr() != y2.data_ptr()
    ptr = y2.data_ptr()
    del y2
    y3 = layer(x2)
    assert y3.data_ptr() == ptr  # the dropped result's memory came back: no fresh pages
    assert torch.allclose(y3, layer.reference(x2), atol=1e-4)


def test_pooled_outputs_can_be_updated_in_place_outside_inference_mode(tmp_path):
    output_pool.clear()
    layer = SparseLinear(torch.randn(8, 8), None, torch.ones(8, 8, dtype=torch.bool), cache_dir=tmp_path)
    with torch.inference_mode():
        del_me = layer(torch.randn(4, 8))
    del del_me
    y = layer(torch.randn(4, 8))  # reuses the buffer first allocated inside inference mode
    y.add_(1.0)
    assert not y.is_inference()
