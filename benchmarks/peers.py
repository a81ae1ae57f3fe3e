"""Our sparse kernels vs Neural Magic's DeepSparse 1.8.0 on the same shapes and masks, measured in one run.

Cases (90% sparsity): BERT FFN linears 768->3072 and 3072->768 at M = 4096 and 128 tokens,
patterns 32x32 blocks, 1x32 blocks and unstructured, fp32 and int8; plus the FFN block
768->3072->GELU->768 (unstructured on both linears, M = 4096 and 128, fp32 and int8) that ours runs
through `sparta_explore.compile`. `--quick`: 768->3072 at M = 4096 (every pattern, both
precisions) and the FFN block in fp32.

Layout: both sides get the input a transformer gives them, (B, 128, K) with the M tokens as
B sequences of 128 (M = 4096: (32, 128, K); M = 128: (1, 128, K)); DeepSparse compiles it with
`batch_size=B`. `ds2d_ms` is DeepSparse on the same x flattened to (M, K) with batch_size=M,
M one-row samples (slower: issue 27 measured 1.2-1.8x; `--no-2d` leaves it out).

Ours is measured first (in this venv, `--threads` threads): fp32 `SparseLinear` (tile search),
int8 as compile builds it for the pattern (`int8_kernel_for`: the permute kernel on scattered rows where
the CPU has AVX-512 VBMI, else the quad kernels of `Int8SparseLinear`; activations quantized per row at
run time, weights per output row),
the FFN block compiled from a pruning table (+ an 8-bit quantizer table for int8). Each case
builds into a fresh, empty kernel cache dir (`cache_dir=`): `ours_build_s` is the cold build,
tile search, C compile and check included (for the FFN block, `compile` with its measured
kernel choice; the device profile comes from the default cache, as a one-off per machine).
Then the masked weights, biases and inputs go to a temp dir and `peers_deepsparse_worker.py`,
a server under `--peer-python` (the DeepSparse venv, .venv-peers: DeepSparse is never a project
dependency), prepares the same case: ONNX export of the same module, `deepsparse.Engine(batch_size=B,
num_cores=--threads)`; `ds_compile_s` is the export plus the Engine construction. int8 there
is a static per-tensor uint8 activation scale calibrated on the very input, int8 weights per
output row (MatMulInteger graph). Both sides are warmed 0.25 s (at least 3 calls: short calls
run their first few cold), then take `--repeats` turns on the case: a block of our calls, then a
block of DeepSparse's, about 0.1 s each (`peers_client.take_turns`): on a shared machine the
speed drifts by up to 1.5x over seconds, and one side timed after the other measured the drift.
ours_ms and ds_ms are the medians of all their calls; `blocks` is the lowest and highest ratio of
one turn's two medians (how far the machine moved it), `blk_med` the median of those ratios: each
compares two blocks timed back to back, so it moves less with the machine's drift than ds/ours
(both against DeepSparse's layout that ds/ours takes). `verdict` reads the turns as a one-sided sign test
(`peers_client.Turns.verdict`): ahead or behind where one side won so many of them (8 of 9) that a fair coin
would in under 5% of runs, else level; a summary line after the table counts them and names the rows behind.

Printed: a header (CPU model, the flags that matter, threads, torch and deepsparse versions),
then one row per case: BxS, ours_ms, ds_ms, ds/ours (> 1: ours is faster; against the faster of
DeepSparse's two layouts, a note says when that is (M, K)), blocks, blk_med, verdict, ds2d_ms, ours_build_s,
ds_compile_s, ours_err and ds_err (max |y - y_ref| / max |y_ref| against the masked fp32 torch
module; int8 rows include the quantization error) and notes
(our kernel path; DeepSparse's share of supported ops, its error against the same
quantization simulated in torch, the 2-D run's error where it is worse, any failure). If
DeepSparse cannot run (no peer venv, import error, crash, unsupported CPU) one line says why,
ours is still printed, the DeepSparse columns read nan, and the exit code stays 0.

    make bench-peers ARGS=--quick                      # creates .venv-peers first
    make bench-peers ARGS=--isa=avx2                   # both sides as on an AVX2 + FMA CPU
    .venv/bin/python benchmarks/peers.py [--quick] [--isa avx2] [--repeats 5] [--no-2d] [--peer-python PY]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import tempfile
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from peers_client import PeerServer, Turns, take_turns
from torch import nn

import sparta_explore as se
from kernels import pattern_mask, warm  # benchmarks/kernels.py: this script's folder is on sys.path
from sparta_explore.compile import compile
from sparta_explore.compile.config import CompileConfig
from sparta_explore.device import DeviceProfile, cpu_model
from sparta_explore.kernels import SparseLinear, cpu_flags, set_target_isa, target_isa
from sparta_explore.kernels.build import ISA_CEILINGS
from sparta_explore.kernels.permute_int8 import int8_kernel_for
from sparta_explore.pruners import masks_to_table
from sparta_explore.quantizers import quantize
from sparta_explore.quantizers.uniform import UniformQuantConfig

HERE = Path(__file__).resolve().parent
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16")
SPARSITY = 0.9
PATTERNS = ("32x32", "1x32", "unstructured")
SEQ = 128  # tokens per sequence: M tokens reach both sides as (M // SEQ, SEQ, K)
LAYOUTS = ("3d", "2d")  # DeepSparse: (B, SEQ, K) with batch_size=B (fair), (M, K) with batch_size=M


@dataclass
class Case:
    """One row: a linear (k -> n) or the FFN block (k -> n -> k), M tokens, a pattern and a precision."""

    kind: str
    k: int
    n: int
    m: int
    pattern: str
    prec: str
    ours_ms: float = math.nan
    ours_err: float = math.nan
    ours_build_s: float = math.nan
    notes: list[str] = field(default_factory=list)
    ds: dict[str, Any] = field(default_factory=dict)  # DeepSparse on (B, SEQ, K)
    ds2d: dict[str, Any] = field(default_factory=dict)  # DeepSparse on (M, K), M one-row samples
    turns: Turns = field(default_factory=Turns)  # the (B, SEQ, K) turns: per-block ratios
    turns2d: Turns = field(default_factory=Turns)  # the (M, K) turns

    @property
    def id(self) -> str:
        return f"{self.kind}_{self.k}x{self.n}_m{self.m}_{self.pattern}_{self.prec}"

    @property
    def data_name(self) -> str:
        """The saved weights and input: shared by the fp32 and int8 rows of the same shape and mask."""
        return f"{self.kind}_{self.k}x{self.n}_m{self.m}_{self.pattern}.npz"

    @property
    def batch(self) -> str:
        return f"{self.m // SEQ}x{SEQ}"

    @property
    def shape(self) -> str:
        return f"{self.k}->{self.n}" + (f"->{self.k}" if self.kind == "ffn" else "")


def cases(quick: bool) -> list[Case]:
    shapes = [(768, 3072)] if quick else [(768, 3072), (3072, 768)]
    tokens = (4096,) if quick else (4096, 128)
    out = [Case("linear", k, n, m, p, prec) for k, n in shapes for m in tokens for p in PATTERNS
           for prec in ("fp32", "int8")]
    ffn_precs = ("fp32",) if quick else ("fp32", "int8")
    return out + [Case("ffn", 768, 3072, m, "unstructured", prec) for m in tokens for prec in ffn_precs]


def seeded(*parts: object) -> torch.Generator:
    """A generator whose seed depends only on `parts`: the same weights and masks in --quick and full runs."""
    return torch.Generator().manual_seed(zlib.crc32(repr(parts).encode()))


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-12))


def linear_data(case: Case) -> tuple[dict[str, torch.Tensor], torch.Tensor, int]:
    """Weight, bias, input, mask (and its block rows) of a linear case."""
    g = seeded(case.k, case.n)
    w, b = torch.randn(case.n, case.k, generator=g), torch.randn(case.n, generator=g)
    x = torch.randn(case.m, case.k, generator=seeded("x", case.k, case.m)).reshape(-1, SEQ, case.k)
    kept, rows = pattern_mask(case.n, case.k, case.pattern, SPARSITY, seeded(case.k, case.n, case.pattern))
    return {"w": w, "b": b, "x": x}, kept, rows


def run_linear(case: Case, cache_dir: str) -> tuple[dict[str, np.ndarray], Callable[[], Any]]:
    """Build ours into the empty `cache_dir` (timed: the cold build) and check it on x (B, SEQ, K); returns the
    saved arrays and the call to time."""
    data, kept, rows = linear_data(case)
    w, b, x = data["w"], data["b"], data["x"]
    masked = w * kept
    with torch.no_grad():
        start = time.perf_counter()
        if case.prec == "fp32":
            ours = SparseLinear(w, b, kept, block_rows=rows, tile="auto", expected_m=case.m, cache_dir=cache_dir)
        else:
            kind = int8_kernel_for(kept.numpy())  # what compile builds for this pattern on this CPU
            ours = kind(w, b, kept, block_rows=rows, expected_m=case.m, cache_dir=cache_dir)
        case.ours_build_s = time.perf_counter() - start
        if case.prec == "fp32":
            case.notes.append("fallback: " + str(ours.fallback_reason) if ours.fallback_reason else "sparse fp32")
        else:
            case.notes.append(f"{ours.variant} ({ours.dot_path})")
        case.ours_err = rel_err(ours(x), F.linear(x, masked, b))
    return {"w": masked.numpy(), "b": b.numpy(), "x": x.numpy()}, lambda: ours(x)


def ffn_model(case: Case) -> tuple[nn.Sequential, dict[str, torch.Tensor], torch.Tensor]:
    g = seeded("ffn", case.k, case.n)
    model = nn.Sequential(nn.Linear(case.k, case.n), nn.GELU(), nn.Linear(case.n, case.k)).eval()
    masks = {}
    with torch.no_grad():
        for name in ("0", "2"):
            lin = model.get_submodule(name)
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / math.sqrt(lin.in_features))
            lin.bias.copy_(torch.randn(lin.bias.shape, generator=g) * 0.1)
            masks[name] = pattern_mask(lin.out_features, lin.in_features, case.pattern, SPARSITY,
                                       seeded("ffn", name, case.pattern))[0]
    return model, masks, torch.randn(case.m, case.k, generator=seeded("x", case.k, case.m)).reshape(-1, SEQ, case.k)


def run_ffn(case: Case, cache_dir: str, device: DeviceProfile) -> tuple[dict[str, np.ndarray], Callable[[], Any]]:
    """The FFN block through capture -> table -> run_propagation -> compile (timed, into the empty `cache_dir`),
    checked against the masked module; returns the saved arrays and the call to time."""
    model, masks, x = ffn_model(case)
    graph = se.capture(model, (x,))
    table = masks_to_table(graph, {name: {"weight": mask} for name, mask in masks.items()})
    if case.prec == "int8":
        names = tuple(masks)
        q = quantize(model, UniformQuantConfig(weight_bits=8, activation_bits=8, activation_fmt="int",
                                               op_types=("Linear",), op_names=names), "uniform", graph=graph)
        table = table.merge(q)
    propagated = se.run_propagation(graph, table)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        cm = compile(graph, propagated, config=CompileConfig(runs=3, cache_dir=cache_dir, device=device))
        case.ours_build_s = time.perf_counter() - start
    masked = nn.Sequential(nn.Linear(case.k, case.n), nn.GELU(), nn.Linear(case.n, case.k)).eval()
    with torch.no_grad():
        for name, mask in masks.items():
            src, dst = model.get_submodule(name), masked.get_submodule(name)
            dst.weight.copy_(src.weight * mask)
            dst.bias.copy_(src.bias)
        case.ours_err = rel_err(cm(x), masked(x))
    case.notes.append("compile: " + ", ".join(str(op.chosen) for op in cm.plan.ops.values()))
    fusion = [note for op in cm.plan.ops.values() for note in op.notes if note.startswith("fus")]
    case.notes += fusion  # whether the FFN ran as one fused int8 pair, with both measured times
    arrays = {"w1": masked[0].weight.detach().numpy(), "b1": masked[0].bias.detach().numpy(),
              "w2": masked[2].weight.detach().numpy(), "b2": masked[2].bias.detach().numpy(), "x": x.numpy()}
    return arrays, lambda: cm(x)


def timed_case(case: Case, call: Callable[[], Any], peer: PeerServer, tmp: Path, layouts: tuple[str, ...],
               blocks: int) -> None:
    """Warm ours, then per DeepSparse layout: prepare it (export, compile, check, warm) and take turns timing."""
    ours_call_s = warm(call)
    for layout in layouts:
        run_id = f"{case.id}_{layout}"
        record = peer.ask({"prepare": {"id": run_id, "layout": layout, "kind": case.kind, "prec": case.prec,
                                       "file": str(tmp / case.data_name)}})
        turns = take_turns(call, ours_call_s, peer, run_id, record.get("call_s", ours_call_s), blocks,
                           error=record.get("error"))
        if "error" not in record:
            peer.ask({"drop": run_id})
        if turns.error is not None:
            record["error"] = turns.error
        elif turns.peer:
            record["ms"] = statistics.median(turns.peer) * 1e3
        if layout == "3d":
            case.ours_ms, case.ds, case.turns = statistics.median(turns.ours) * 1e3, record, turns
        else:
            case.ds2d, case.turns2d = record, turns


def fmt(value: float, spec: str) -> str:
    """`value` in `spec` (width.precision + type); nan right-aligned in the same width."""
    return format(value, spec) if math.isfinite(value) else format("nan", f">{spec.split('.')[0]}")


def print_table(rows: list[Case], threads: int, failure: str | None, load: float) -> None:
    flags = cpu_flags()
    versions = next((c.ds for c in rows if "engine" in c.ds), next((c.ds for c in rows if "deepsparse" in c.ds), {}))
    engine = versions.get("engine", {})
    print(f"cpu: {cpu_model()} | flags: " + " ".join(f"{f}={'yes' if f in flags else 'no'}" for f in FLAGS)
          + ("" if target_isa() == "native" else f" (ISA ceiling {target_isa()} set on this CPU: its clocks and "
                                                 "caches, narrower instructions)"))
    print(f"threads={threads} (ours: torch.set_num_threads, DeepSparse: num_cores) torch={torch.__version__} "
          f"deepsparse={versions.get('deepsparse', '-')}"
          + (f" (engine: {engine.get('avx')}, vnni={engine.get('vnni')}, int8 graph {versions.get('int8')})"
             if engine else "") + f" sparsity={SPARSITY:.0%}")
    if engine.get("vnni") and "avx512_vnni" not in flags and "avx_vnni" not in flags:
        # NM_ARCH=avx2 picks DeepSparse's AVX2 build, which still runs VNNI where the CPU has it (an AVX2 + VNNI
        # machine), while our ceiling hides VNNI too (a plain AVX2 machine): its int8 rows are not like for like
        print("note: DeepSparse runs VNNI under this ceiling (its AVX2 build on a VNNI CPU); ours has no VNNI "
              "here, so the int8 rows compare an AVX2 + VNNI machine with a plain AVX2 one")
    busy = " (other work on this machine: timings are noisy, DeepSparse's pinned threads most)" if load > 0.5 else ""
    print(f"load average (1 min) before this run: {load:.2f}{busy}")
    if failure is not None:
        print(f"DeepSparse did not run: {failure}")
    print(f"input: ours and ds (B, {SEQ}, K), DeepSparse batch_size=B; ds2d: (M, K), batch_size=M | build and "
          "compile: cold (ours: an empty kernel cache per case; ds: ONNX export + Engine)")
    print(f"{'K->N':<15} {'BxS':>6} {'pattern':>12} {'prec':>5} {'ours_ms':>9} {'ds_ms':>9} {'ds/ours':>8} "
          f"{'blocks':>9} {'blk_med':>7} {'verdict':>7} {'ds2d_ms':>9} {'ours_build_s':>12} {'ds_compile_s':>12} "
          f"{'ours_err':>9} {'ds_err':>9}"
          "  notes")
    verdicts = []
    for c in rows:
        ds_ms, ds_err = float(c.ds.get("ms", math.nan)), float(c.ds.get("err", math.nan))
        best_ms = min(ds_ms, float(c.ds2d.get("ms", math.inf)))  # the peer as it runs best (nan stays nan)
        notes = list(c.notes)
        turns = c.turns
        if best_ms < ds_ms:
            notes.append("ds/ours against DS in 2-D, its faster layout here")
            turns = c.turns2d
        verdict = turns.verdict()  # over the turns of the layout ds/ours takes
        for label, ds in (("DS", c.ds), ("DS 2-D", c.ds2d)):
            if "error" in ds and failure is None:
                notes.append(f"{label} failed: {ds['error']}")
            if ds.get("supported_ops", 1.0) < 1.0:
                notes.append(f"{label} supported ops {ds['supported_ops']:.0%}")
        if "err_sim" in c.ds:
            notes.append(f"DS vs same quant in torch {c.ds['err_sim']:.1e}")
        if c.ds2d.get("err", 0.0) > max(2 * ds_err, 1e-5):  # also when the 3-D run has no error to compare
            notes.append(f"DS 2-D err {c.ds2d['err']:.1e}")
        print(f"{c.shape:<15} {c.batch:>6} {c.pattern:>12} {c.prec:>5} {fmt(c.ours_ms, '9.2f')} {fmt(ds_ms, '9.2f')} "
              f"{fmt(best_ms / c.ours_ms, '8.2f')} {turns.ratio_range():>9} {fmt(turns.median_ratio(), '7.2f')} "
              f"{verdict:>7} "
              f"{fmt(float(c.ds2d.get('ms', math.nan)), '9.2f')} "
              f"{fmt(c.ours_build_s, '12.2f')} {fmt(float(c.ds.get('compile_s', math.nan)), '12.2f')} "
              f"{fmt(c.ours_err, '9.1e')} {fmt(ds_err, '9.1e')}  {'; '.join(notes)}", flush=True)
        verdicts.append((c.id, verdict))
    print(verdict_line(verdicts))


def verdict_line(verdicts: list[tuple[str, str]]) -> str:
    """One line counting the rows' verdicts and naming those behind (the issue 27 goal: none).

    Example:
        >>> print(verdict_line([("a", "ahead"), ("b", "level"), ("c", "behind")]))
        verdicts (sign test over each row's turns, 5%): 1 ahead, 1 level, 1 behind: c; at or ahead: 2 of 3
    """
    count = {v: sum(got == v for _, got in verdicts) for v in ("ahead", "level", "behind")}
    behind = [case for case, got in verdicts if got == "behind"]
    timed = count["ahead"] + count["level"] + count["behind"]
    return (f"verdicts (sign test over each row's turns, 5%): {count['ahead']} ahead, {count['level']} level, "
            f"{count['behind']} behind" + (": " + ", ".join(behind) if behind else "")
            + f"; at or ahead: {count['ahead'] + count['level']} of {timed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="768->3072 at M=4096 and the FFN block in fp32")
    parser.add_argument("--repeats", type=int, default=9, help="turns: blocks of ours, then of DeepSparse's")
    parser.add_argument("--threads", type=int, default=2, help="ours: torch threads; DeepSparse: num_cores")
    parser.add_argument("--peer-python", type=Path, default=HERE.parent / ".venv-peers" / "bin" / "python",
                        help="python of the venv that has deepsparse==1.8.0 (make bench-peers creates it)")
    parser.add_argument("--isa", choices=sorted(ISA_CEILINGS), default="native",
                        help="avx2: both sides run as on an AVX2 + FMA CPU (ours: no AVX-512/VNNI flags, gcc "
                             "-mno-avx512f -mno-avxvnni; DeepSparse: NM_ARCH=avx2)")
    parser.add_argument("--only", metavar="REGEX", help="run only the cases whose id matches, e.g. 'ffn_.*int8'")
    parser.add_argument("--no-2d", action="store_true", help="skip DeepSparse on the (M, K) layout (ds2d_ms)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    set_target_isa(args.isa)
    warnings.simplefilter("ignore")
    rows = [c for c in cases(args.quick) if args.only is None or re.search(args.only, c.id)]
    if not rows:
        parser.error(f"--only {args.only!r} matches no case id (e.g. {cases(False)[0].id})")
    load_before = os.getloadavg()[0]
    device = DeviceProfile.load_or_measure() if any(c.kind == "ffn" for c in rows) else None
    layouts = LAYOUTS[:1] if args.no_2d else LAYOUTS
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp_dir:
        tmp = Path(tmp_dir)
        peer = PeerServer(args.peer_python, tmp, args.threads, args.isa)
        for case in rows:
            print(f"{case.id} ...", flush=True)
            cache_dir = tempfile.mkdtemp(prefix="cache-", dir=tmp)  # empty: ours_build_s is a cold build
            data, call = (run_ffn(case, cache_dir, device) if case.kind == "ffn" else run_linear(case, cache_dir))
            path = tmp / case.data_name
            if not path.exists():
                np.savez(path, **{k: np.ascontiguousarray(v, dtype=np.float32) for k, v in data.items()})
            timed_case(case, call, peer, tmp, layouts, args.repeats)
            del call, data  # this case's kernels and buffers go before the next one's are built
        peer.close()
        failure = None if any("ms" in c.ds for c in rows) else peer.unavailable or next(
            (c.ds["error"] for c in rows if "error" in c.ds), "no case ran")
    print()
    print_table(rows, args.threads, failure, load_before)


if __name__ == "__main__":
    main()
