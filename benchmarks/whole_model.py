"""Whole compiled models, pass by pass, against dense, Torch-Pruning and torch dynamic int8 (the graph passes' goals).

Every number is a median of whole-model forward calls in this run, on this machine; the
models of one case are called alternately, call by call, so a load burst hits them all.
Cases (`--only` picks some by name prefix):

  channel  mobilenetv2-32 (inverted residuals: expand-BN-ReLU6, depthwise-BN-ReLU6,
           project-BN, add) and resnet-32 (basic blocks), NNI L1NormPruner 50% of every
           groups-1 conv's filters, batch 8 and 1. Columns: dense as given (NCHW),
           Torch-Pruning 1.6.1 physically pruning the same model with the same masks
           (its DepGraph prunes a residual group's channels together: there, the channels
           every member pruned), timed NCHW and channels-last, the faster kept; ours after
           each graph pass (the rewritten torch model, no kernels yet); ours compiled.
           Exactness: compiled vs the model masked with the pruner's table.
  bert     12-layer BERT-base encoder in plain PyTorch (eager matmul/softmax attention),
           batch 8 x 128, 90% unstructured on every Linear, fp32 and w8a8 (8-bit weights and
           inputs), each also without the graph and epilogue passes (what compile did before
           them): x dense fp32, share of time outside the weight ops (sparse kernels and
           shrunk dense linears, epilogues included) and outside weight ops + attention
           (every node timed in place, `time_split`).
  heads    the same encoder with 50% of its attention heads pruned (whole heads, by the L2
           norm of each head's Q/K/V rows and O columns) + 90% unstructured FFN: compiled
           with every pass and without `shrink`.
  hf       Hugging Face ViT (4 layers, hidden 192, 224x224, batch 8) and DistilBERT (4 layers,
           hidden 256, batch 8 x 128), random weights, 90% 32x32 blocks on every encoder Linear.
  tiny     a Linear called twice; Embedding + LSTM + a half-pruned Linear head.

    python benchmarks/whole_model.py                  # everything (~20 min on 2 cores, compiles included)
    python benchmarks/whole_model.py --only channel   # the CNN table with the Torch-Pruning column
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch.fx as fx
from torch import nn

import sparta_explore as se
from sparta_explore.compile import CompileConfig, compile
from sparta_explore.compile.passes.pipeline import graph_pass_names, run_passes
from sparta_explore.compile.table_reference import split_unread
from sparta_explore.graph import rewritten
from sparta_explore.kernels import cpu_flags
from sparta_explore.zoo import build_model, example_inputs

ROWS: list[dict] = []


def alternating(fns: list[Callable[[], object]], runs: int) -> list[float]:
    """Median ms of each function over `runs` rounds, one call of each per round (after two warm-ups)."""
    times: list[list[float]] = [[] for _ in fns]
    with torch.inference_mode():
        for fn in fns:
            fn()
            fn()
        for _ in range(runs):
            for i, fn in enumerate(fns):
                t0 = time.perf_counter()
                fn()
                times[i].append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def macs(model: nn.Module, x: tuple) -> float:
    """Multiply-accumulates of one sample through every conv and linear (millions)."""
    total = [0]

    def hook(m: nn.Module, _: tuple, out: torch.Tensor) -> None:
        if isinstance(m, nn.Conv2d):
            total[0] += out[0].numel() * m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
        elif isinstance(m, nn.Linear):
            total[0] += out[0].numel() // m.out_features * m.in_features * m.out_features
    handles = [m.register_forward_hook(hook) for m in model.modules()]
    with torch.no_grad():
        model(*[t[:1] for t in x])
    for h in handles:
        h.remove()
    return total[0] / 1e6


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / (1 + want.abs().max()))


def add_row(case: str, what: str, ms: float, dense_ms: float, **extra: object) -> None:
    row = {"case": case, "what": what, "ms": ms, "x_dense": dense_ms / ms, **extra}
    ROWS.append(row)
    more = "  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in extra.items())
    print(f"{case:28s} {what:34s} {ms:9.3f} {dense_ms / ms:8.2f}  {more}", flush=True)


def quiet_compile(graph, table, **options) -> se.compile.CompiledModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile(graph, table, config=CompileConfig(**options))


# ---- channel pruning: ours vs Torch-Pruning ---------------------------------------------------------------

def torch_pruning_copy(model: nn.Module, x: tuple, pruned: dict[str, set[int]]) -> nn.Module:
    """`model` physically pruned by Torch-Pruning's DepGraph with the pruner's channel sets.

    A group of coupled convs (a residual stream) loses the channels every member pruned.
    """
    import torch_pruning as tp

    out = copy.deepcopy(model)
    names = {id(m): n for n, m in out.named_modules()}
    graph = tp.DependencyGraph().build_dependency(out, example_inputs=x[0])
    done: set[int] = set()
    for name, module in list(out.named_modules()):
        if name not in pruned or id(module) in done:
            continue
        group = graph.get_pruning_group(module, tp.prune_conv_out_channels, idxs=[0])
        members = [dep.target.module for dep, _ in group if dep.handler == tp.prune_conv_out_channels
                   and isinstance(dep.target.module, nn.Conv2d) and dep.target.module.groups == 1]
        done |= {id(m) for m in members}
        common = set.intersection(*(pruned.get(names[id(m)], set()) for m in members)) if members else set()
        if common and len(common) < module.out_channels:
            group = graph.get_pruning_group(module, tp.prune_conv_out_channels, idxs=sorted(common))
            if graph.check_pruning_group(group):
                group.prune()
    return out.eval()


def channel_case(name: str, batch: int, runs: int) -> None:
    from sparta_explore.pruners import prune
    from sparta_explore.pruners.nni_pruners import NNIPruneConfig

    case = f"{name} l1norm 50% b{batch}"
    model = build_model(name)
    g = torch.Generator().manual_seed(0)
    for m in model.modules():  # trained-looking BatchNorms: their shifts are what constant channels carry
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1, generator=g)
            m.running_var.uniform_(0.5, 2.0, generator=g)
            m.weight.data.uniform_(0.5, 1.5, generator=g)
            m.bias.data.normal_(0, 0.1, generator=g)
    x = example_inputs(name, batch=batch)
    graph = se.capture(model, x)
    convs = tuple(n for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.groups == 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = prune(model, NNIPruneConfig(0.5, op_types=("Conv2d",), op_names=convs), pruner="l1norm",
                      graph=graph)
        result = se.run_propagation(graph, table)
    pruned = {n: set(table[f"{n}.weight"].pruned.reshape(table[f"{n}.weight"].shape[0], -1).all(dim=1)
                     .nonzero().flatten().tolist()) for n in convs}
    try:
        tp_model = torch_pruning_copy(model, x, pruned)
    except ImportError:
        print("Torch-Pruning is not installed: `make bench-whole-model` installs it (the `bench` extra)")
        tp_model = None
    x_cl = tuple(t.contiguous(memory_format=torch.channels_last) for t in x)
    masked = se.masked_copy(model, table)
    work = copy.deepcopy(graph.module)
    usable, _ = split_unread(graph, work, result.table)
    se.apply_table(work, usable)
    _, _, reports = run_passes(rewritten(graph, work), usable, keep_graphs=True)
    cm = quiet_compile(graph, result)
    before = quiet_compile(graph, result, passes=("fuse_pairs",), guard=False)  # what compile did before passes
    fns = [lambda: model(*x), lambda: before(*x)]
    if tp_model is not None:
        tp_cl = copy.deepcopy(tp_model).to(memory_format=torch.channels_last)
        fns += [lambda: tp_model(*x), lambda: tp_cl(*x_cl)]
    fns += [lambda m=r.graph.module: m(*x) for r in reports] + [lambda: cm(*x)]
    ms = alternating(fns, runs)
    dense_ms, before_ms, ours_ms, passes_ms = ms[0], ms[1], ms[-1], ms[-1 - len(reports):-1]
    ms = ms[:1] + ms[2:]
    with torch.no_grad():
        err = rel_err(cm(*x), masked(*x))
    add_row(case, "dense (as given, NCHW)", dense_ms, dense_ms, MACs=macs(model, x))
    add_row(case, "compiled, no passes (as before)", before_ms, dense_ms)
    versus = {}
    if tp_model is not None:
        add_row(case, "Torch-Pruning (NCHW)", ms[1], dense_ms, MACs=macs(tp_model, x))
        add_row(case, "Torch-Pruning (channels-last)", ms[2], dense_ms)
        versus = {"x_torch_pruning": min(ms[1], ms[2]) / ours_ms}
    for r, t in zip(reports, passes_ms):
        add_row(case, f"after {r.name}", t, dense_ms, changed=r.summary)
    add_row(case, "ours compiled", ours_ms, dense_ms, **versus, err=err, MACs=macs(reports[-1].graph.module, x),
            runs=cm.guard["runs"] if cm.guard else "-", compile_s=cm.seconds)


# ---- transformers -------------------------------------------------------------------------------------------

def time_split(cm: nn.Module, graph, runs: int) -> tuple[float, float, float]:
    """(weight ops, attention, everything) ms of the compiled model, each node timed in place.

    Weight ops: every conv / linear / compiled kernel module, with its fused epilogue (pruned to
    sparse kernels or shrunk to smaller dense ones alike). Attention: SDPA, or the matmuls and
    softmax where they stayed. The rest (LayerNorm, adds, reshapes, the interpreter's
    calls) is what the graph passes can still remove.
    """
    from sparta_explore.compile.epilogue import Epilogue
    from sparta_explore.kernels.compiled_op import CompiledOp

    names = ("scaled_dot_product_attention", "matmul", "softmax", "bmm")
    weights = (nn.Linear, nn.Conv2d, CompiledOp, Epilogue)
    gm = cm.module

    class Timer(fx.Interpreter):
        def __init__(self) -> None:
            super().__init__(gm)
            self.ms = [0.0, 0.0, 0.0]

        def run_node(self, n: fx.Node):
            t0 = time.perf_counter()
            out = super().run_node(n)
            ms = (time.perf_counter() - t0) * 1e3
            target = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
            if n.op == "call_module" and isinstance(gm.get_submodule(n.target), weights):
                self.ms[0] += ms
            elif n.op in ("call_function", "call_method") and target in names:
                self.ms[1] += ms
            self.ms[2] += ms
            return out

    timer = Timer()
    with torch.inference_mode():
        timer.run(*graph.example_inputs)
        timer.ms = [0.0, 0.0, 0.0]
        for _ in range(runs):
            timer.run(*graph.example_inputs)
    return tuple(t / runs for t in timer.ms)


def transformer_row(case: str, what: str, model: nn.Module, graph, table, runs: int, reference: nn.Module,
                    **options) -> None:
    """One compiled row; `options` are `CompileConfig` fields (its timing rounds: `compile_runs`)."""
    if "compile_runs" in options:
        options["runs"] = options.pop("compile_runs")
    cm = quiet_compile(graph, table, **options)
    dense_ms, ours_ms = alternating([lambda: graph.run(model), lambda: graph.run(cm)], runs)
    with torch.no_grad():
        err = rel_err(se.compile.verify.tensor_leaves(graph.run(cm))[0],
                      se.compile.verify.tensor_leaves(graph.run(reference))[0])
    weights, attention, total = time_split(cm, graph, 3)
    add_row(case, what, ours_ms, dense_ms, outside_weight_ops=1 - weights / total,
            outside_weight_ops_attention=1 - (weights + attention) / total, err=err,
            runs=cm.guard["runs"] if cm.guard else "-", compile_s=cm.seconds)


def bert_tables(model: nn.Module, graph, heads: bool):
    """90% unstructured on every Linear; with `heads`, instead 50% of heads whole + 90% unstructured FFN."""
    from sparta_explore.pruners import prune
    from sparta_explore.pruners.block import BlockPruneConfig

    names = tuple(n for n, m in model.named_modules() if isinstance(m, nn.Linear))
    ffn = tuple(n for n in names if ".ffn." in n)
    table = prune(model, BlockPruneConfig(0.9, (1, 1), op_names=ffn if heads else names), pruner="block",
                  graph=graph)
    if heads:
        for layer in model.layers:
            attn, prefix = layer.attn, [n for n, m in model.named_modules() if m is layer.attn][0]
            d = attn.head_dim
            score = sum(getattr(attn, p).weight.detach().reshape(attn.heads, d, -1).pow(2).sum(dim=(1, 2))
                        for p in ("query", "key", "value"))
            score = score + attn.out.weight.detach().reshape(-1, attn.heads, d).pow(2).sum(dim=(0, 2))
            dead = torch.zeros(attn.heads * d, dtype=torch.bool)
            for h in score.argsort()[: attn.heads // 2]:
                dead[h * d:(h + 1) * d] = True
            for p in ("query", "key", "value"):
                table[f"{prefix}.{p}.weight"] = se.TeSA.from_mask(~dead[:, None].expand(-1, attn.heads * d))
                table[f"{prefix}.{p}.bias"] = se.TeSA.from_mask(~dead)
            table[f"{prefix}.out.weight"] = se.TeSA.from_mask(~dead[None, :].expand(attn.heads * d, -1))
    return table


def encoder_case(layers: int, heads: bool):
    """The plain-PyTorch BERT-base encoder (seeded), its graph on 8 x 128 tokens, its table and propagation."""
    from sparta_explore.zoo.bert import BertConfig, BertEncoder

    torch.manual_seed(0)
    model = BertEncoder(BertConfig(layers=layers)).eval()
    graph = se.capture(model, (torch.randn(8, 128, 768),))
    table = bert_tables(model, graph, heads=heads)
    return model, graph, table, se.run_propagation(graph, table)


def bert_case(runs: int, layers: int) -> None:
    from sparta_explore.quantizers import quantize
    from sparta_explore.quantizers.uniform import UniformQuantConfig

    model, graph, table, result = encoder_case(layers, heads=False)
    case = f"bert-base x{layers} 90% unstr b8x128"
    reference = se.masked_copy(model, table)
    transformer_row(case, "fp32 compiled", model, graph, result, runs, reference, compile_runs=3)
    transformer_row(case, "fp32 compiled, no passes (as before)", model, graph, result, runs, reference,
                    compile_runs=3, passes=("fuse_pairs",))
    q = quantize(model, UniformQuantConfig(weight_bits=8, activation_bits=8, activation_fmt="int",
                                           op_types=("Linear",)), "uniform", graph=graph)
    w8 = se.run_propagation(graph, table.merge(q))
    transformer_row(case, "w8a8 compiled", model, graph, w8, runs, reference, compile_runs=3)
    transformer_row(case, "w8a8 compiled, no passes (as before)", model, graph, w8, runs, reference,
                    compile_runs=3, passes=("fuse_pairs",))


def heads_case(runs: int, layers: int) -> None:
    model, graph, table, result = encoder_case(layers, heads=True)
    case = f"bert-base x{layers} heads50%+ffn90%"
    reference = se.masked_copy(model, table)
    transformer_row(case, "fp32 compiled, every pass", model, graph, result, runs, reference, compile_runs=3)
    without = tuple(n for n in graph_pass_names() if n != "shrink") + ("fuse_pairs", "fuse_epilogue")
    transformer_row(case, "fp32 compiled, no shrink", model, graph, result, runs, reference, compile_runs=3,
                    passes=without)


def hf_case(runs: int) -> None:
    from transformers import DistilBertConfig, DistilBertModel, ViTConfig, ViTModel

    from sparta_explore.pruners import prune
    from sparta_explore.pruners.block import BlockPruneConfig

    torch.manual_seed(0)
    vit = ViTModel(ViTConfig(num_hidden_layers=4, hidden_size=192, num_attention_heads=3, intermediate_size=768,
                             image_size=224, patch_size=16), add_pooling_layer=False).eval()
    distil = DistilBertModel(DistilBertConfig(n_layers=4, dim=256, n_heads=4, hidden_dim=1024)).eval()
    cases = [("hf vit 4x192 90% 32x32 b8", vit, {"pixel_values": torch.randn(8, 3, 224, 224)}),
             ("hf distilbert 4x256 90% 32x32 b8", distil,
              {"input_ids": torch.randint(0, 30522, (8, 128)), "attention_mask": torch.ones(8, 128, dtype=torch.long)})]
    for case, model, x in cases:
        graph = se.capture(model, x)
        names = tuple(n for n, m in model.named_modules() if isinstance(m, nn.Linear))  # every one is the encoder's
        table = prune(model, BlockPruneConfig(0.9, (32, 32), op_names=names), pruner="block", graph=graph)
        result = se.run_propagation(graph, table)
        reference = se.masked_copy(model, table)
        transformer_row(case, "fp32 compiled", model, graph, result, runs, reference)
        transformer_row(case, "fp32 compiled, no passes (as before)", model, graph, result, runs, reference,
                        passes=("fuse_pairs",))


def tiny_case(runs: int) -> None:
    from sparta_explore.pruners import prune
    from sparta_explore.pruners.block import BlockPruneConfig

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.relu(self.fc(x)))

    class Recurrent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.lstm = nn.Embedding(100, 32), nn.LSTM(32, 64, batch_first=True)
            self.head = nn.Linear(64, 8)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.lstm(self.embed(ids))[0][:, -1])

    torch.manual_seed(0)
    for case, model, x, names in [("tiny linear called twice", Twice().eval(), (torch.randn(16, 64),), ("fc",)),
                                  ("tiny embedding+lstm+head", Recurrent().eval(), (torch.randint(0, 100, (4, 12)),),
                                   ("head",))]:
        graph = se.capture(model, x)
        table = prune(model, BlockPruneConfig(0.5, (1, 1), op_names=names), pruner="block", graph=graph)
        cm = quiet_compile(graph, se.run_propagation(graph, table))
        dense_ms, ours_ms = alternating([lambda m=model, x=x: m(*x), lambda m=cm, x=x: m(*x)], runs * 10)
        add_row(case, "compiled", ours_ms, dense_ms, runs=cm.guard["runs"] if cm.guard else "-")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=None, help="case names to run: channel bert heads hf tiny")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--layers", type=int, default=12, help="BERT encoder layers (bert, heads)")
    args = p.parse_args()
    torch.set_num_threads(2)
    print(f"cpu={platform.processor() or platform.machine()} avx512={'avx512f' in cpu_flags()} threads=2 "
          f"torch={torch.__version__}")
    print(f"{'case':28s} {'what':34s} {'ms':>9s} {'x_dense':>8s}")
    wanted = lambda name: args.only is None or name in args.only  # noqa: E731
    if wanted("channel"):
        for name in ("mobilenetv2-32", "resnet-32"):
            for batch in (8, 1):
                channel_case(name, batch, args.runs)
    if wanted("tiny"):
        tiny_case(args.runs)
    if wanted("hf"):
        hf_case(max(5, args.runs // 3))
    if wanted("heads"):
        heads_case(max(5, args.runs // 3), args.layers)
    if wanted("bert"):
        bert_case(max(5, args.runs // 3), args.layers)


if __name__ == "__main__":
    main()
