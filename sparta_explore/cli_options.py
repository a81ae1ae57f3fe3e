"""Option sets several sub-commands share (the embedded model's pruning, the demo's sweep).

Example:
    >>> import argparse; p = argparse.ArgumentParser(); prune_arguments(p)
    >>> p.parse_args(["--sparsity", "0.7"]).sparsity
    0.7
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sparta_explore.cli_args import bits, block, fraction, grid_block, non_negative_int, positive_int


def prune_arguments(p: argparse.ArgumentParser, *, default_model: str = "digits-cnn") -> None:
    """The options of pruning one embedded model (`demo`, `prune`): model, pruner, sparsity, block, bits, ..."""
    p.add_argument("--model", default=default_model, help="embedded model (see `sparta-explore models`)")
    p.add_argument("--pruner", default="l1norm", help="pruner name (level, l1norm, ..., block, nm)")
    p.add_argument("--sparsity", type=fraction, default=0.5, help="fraction to prune per layer")
    p.add_argument("--block", type=block, default=(32, 32), help="block shape for --pruner block, e.g. 1x32")
    p.add_argument("--exclude", nargs="*", default=None,
                   help="modules left dense (default: the classifier head of digits models)")
    p.add_argument("--quantizer", default=None, help="also quantize (uniform, ptq, qat, lsq, dorefa, bnn)")
    p.add_argument("--bits", type=bits, default=8, help="weight/activation bits for --quantizer")
    p.add_argument("--finetune-epochs", type=non_negative_int, default=3, help="epochs of mask-respecting fine-tuning")
    p.add_argument("--cache-dir", type=Path, default=None, help="where trained weights are cached")


def demo_arguments(p: argparse.ArgumentParser) -> None:
    """The `demo` command's options: the pruning ones, then the small latency sweep's."""
    prune_arguments(p)
    p.add_argument("--out", type=Path, default=Path("results/demo"),
                   help="folder for the table, summary, sweep results, figures and report")
    p.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the small latency sweep (results.csv, Pareto PNGs, report.md)")
    p.add_argument("--sweep-model", default="digits-ffn", help="digits model the sweep compiles and times")
    p.add_argument("--sweep-sparsity", type=fraction, nargs="+", default=[0.5, 0.9], help="sweep sparsities")
    p.add_argument("--sweep-block", type=grid_block, nargs="+", default=["32x32", "1x1"],
                   help="block-pruner patterns, e.g. 32x32 1x32 1x1")
    p.add_argument("--sweep-bits", type=bits, nargs="+", default=[32, 8], help="32 (fp32) or 2..8 (int)")
    p.add_argument("--sweep-batch", type=positive_int, default=None, help="latency batch (default: the model's)")
    p.add_argument("--sweep-runs", type=positive_int, default=20, help="timed forward calls per latency measurement")
