"""cat and split: pruning follows each element to its place in the joined or split tensor."""

import torch
from torch import nn

from .helpers import newly_pruned, propagate_checked, prune_rows


class CatSplit(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 5)
        self.mix = nn.Linear(8, 6)
        self.left = nn.Linear(2, 2)
        self.right = nn.Linear(4, 2)

    def forward(self, x):
        h = self.mix(torch.cat([self.a(x), self.b(x)], dim=1))
        left, right = torch.split(h, [2, 4], dim=1)
        return self.left(left) + self.right(right)


def test_cat_carries_zeros_to_their_columns():
    _, result = propagate_checked(CatSplit(), torch.randn(3, 4), {"b.weight": prune_rows((5, 4), [0, 4]),
                                                                  "b.bias": prune_rows((5,), [0, 4])})
    assert newly_pruned(result, "mix.weight")[:, [3, 7]].all()  # b's rows 0 and 4 sit at columns 3 and 7
    assert not result.table["mix.weight"].pruned[:, :3].any()


def test_split_part_irrelevance_reaches_the_producer_rows():
    _, result = propagate_checked(CatSplit(), torch.randn(3, 4), {"right.weight": prune_rows((2, 4), [1], dim=1)})
    assert newly_pruned(result, "mix.weight")[3].all()  # right's input 1 is mix output 2 + 1
    assert not result.table["mix.weight"].pruned[:3].any()
