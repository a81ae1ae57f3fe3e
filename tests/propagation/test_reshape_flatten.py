"""conv -> flatten -> linear: a pruned filter prunes its block of the linear's columns."""

import torch
from torch import nn

from .helpers import newly_pruned, propagate_checked, prune_rows


def test_pruned_filter_prunes_its_flattened_columns():
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, 3))
    _, result = propagate_checked(model, torch.randn(1, 2, 5, 5), {"0.weight": prune_rows((4, 2, 3, 3), [2]),
                                                                    "0.bias": prune_rows((4,), [2])})
    cols = newly_pruned(result, "3.weight")
    assert cols[:, 50:75].all() and not cols[:, :50].any() and not cols[:, 75:].any()


def test_view_and_permute_keep_element_identity():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.out = nn.Linear(6, 2)

        def forward(self, x):
            return self.out(self.fc(x).view(2, 3, 2).permute(0, 2, 1).reshape(2, 6))

    _, result = propagate_checked(M(), torch.randn(2, 6), {"out.weight": prune_rows((2, 6), [0], dim=1)})
    # out column 0 reads permuted element (0, 0) = fc output 0
    assert newly_pruned(result, "fc.weight")[0].all()
    assert result.table["fc.weight"].sparsity == 1 / 6
