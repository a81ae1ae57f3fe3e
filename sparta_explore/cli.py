"""The `sparta-explore` command line: one registered function per sub-command.

Heavy imports (NNI, scikit-learn) happen inside the commands, so `--help` is instant.

Example:
    $ sparta-explore demo
    $ sparta-explore prune --model digits-mlp --pruner level --sparsity 0.8 --out t.npz
    $ sparta-explore summary t.npz
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparta_explore.errors import SpartaError


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


_COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None] = lambda p: None
            ) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Decorator registering a sub-command."""
    def add(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        _COMMANDS[name] = Command(name, help, add_arguments, run)
        return run
    return add


def _block(text: str) -> tuple[int, int]:
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--block must look like 32x32, got {text!r}") from None
    return rows, cols


def _prune_arguments(p: argparse.ArgumentParser, *, default_model: str = "digits-cnn") -> None:
    p.add_argument("--model", default=default_model, help="embedded model (see `sparta-explore models`)")
    p.add_argument("--pruner", default="l1norm", help="pruner name (level, l1norm, ..., block, nm)")
    p.add_argument("--sparsity", type=float, default=0.5, help="fraction to prune per layer")
    p.add_argument("--block", type=_block, default=(32, 32), help="block shape for --pruner block, e.g. 1x32")
    p.add_argument("--exclude", nargs="*", default=None,
                   help="modules left dense (default: the classifier head of digits models)")
    p.add_argument("--quantizer", default=None, help="also quantize (uniform, ptq, qat, lsq, dorefa, bnn)")
    p.add_argument("--bits", type=int, default=8, help="weight/activation bits for --quantizer")
    p.add_argument("--finetune-epochs", type=int, default=3, help="epochs of mask-respecting fine-tuning")
    p.add_argument("--cache-dir", type=Path, default=None, help="where trained weights are cached")


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    _prune_arguments(p)
    p.add_argument("--out", type=Path, default=Path("results/demo"), help="folder for the table and summary")


@command("demo", "train (or load) the digits CNN, prune it with NNI, print its TeSA summary", _demo_arguments)
def _demo(args: argparse.Namespace) -> int:
    from sparta_explore.demo import DemoConfig, run_demo

    cfg = DemoConfig(model=args.model, pruner=args.pruner, sparsity=args.sparsity, block=args.block,
                     exclude=None if args.exclude is None else tuple(args.exclude), quantizer=args.quantizer,
                     bits=args.bits, finetune_epochs=args.finetune_epochs)
    run_demo(cfg, out=args.out, cache_dir=args.cache_dir, echo=print)
    return 0


def _prune_cmd_arguments(p: argparse.ArgumentParser) -> None:
    _prune_arguments(p)
    p.add_argument("--out", type=Path, required=True, help="where to write the TeSA table (.npz)")


@command("prune", "prune an embedded model and save its TeSA table", _prune_cmd_arguments)
def _prune(args: argparse.Namespace) -> int:
    from sparta_explore.demo import DemoConfig, run_demo

    cfg = DemoConfig(model=args.model, pruner=args.pruner, sparsity=args.sparsity, block=args.block,
                     exclude=None if args.exclude is None else tuple(args.exclude), quantizer=args.quantizer,
                     bits=args.bits, finetune_epochs=args.finetune_epochs)
    result = run_demo(cfg, out=args.out.parent, cache_dir=args.cache_dir, echo=print)
    result.table.save(args.out)
    print(f"wrote {args.out}")
    return 0


@command("summary", "print the summary of a saved TeSA table",
         lambda p: p.add_argument("table", type=Path, help="a .npz written by `prune` or TeSATable.save"))
def _summary(args: argparse.Namespace) -> int:
    from sparta_explore.tesa_table import TeSATable

    table = TeSATable.load(args.table)
    print(table.summary().to_string(index=False))
    print(f"total sparsity {table.total_sparsity():.3f} over {len(table)} tensors")
    return 0


@command("models", "list the embedded models")
def _models(args: argparse.Namespace) -> int:
    from sparta_explore.zoo import get_spec, model_names

    for name in model_names():
        spec = get_spec(name)
        shape = "x".join(map(str, (spec.default_batch, *spec.input_shape)))
        print(f"{name:20s} {shape:14s} {spec.task or 'latency':8s} {spec.description}")
    return 0


@command("pruners", "list the pruners and quantizers")
def _pruners(args: argparse.Namespace) -> int:
    from sparta_explore.pruners import pruner_names
    from sparta_explore.quantizers import quantizer_names

    print("pruners:    " + ", ".join(pruner_names()))
    print("quantizers: " + ", ".join(quantizer_names()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered sub-command."""
    parser = argparse.ArgumentParser(prog="sparta-explore", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in _COMMANDS.values():
        cmd.add_arguments(sub.add_parser(cmd.name, help=cmd.help, description=cmd.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `sparta-explore` console script; returns the exit status.

    Example:
        >>> main(["models"])  # doctest: +SKIP
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _COMMANDS[args.command].run(args)
    except (SpartaError, FileNotFoundError) as e:
        print(f"sparta-explore {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
