"""The figures of `llm.py`'s table that are pure arithmetic on what it measured: weight bytes, decode rate, goals.

* `weights_bytes`: the bytes a deployment holds for the weights (the formula is in its docstring);
* `decode_tok_s`: tokens per second of the decode part of `generate`, from two timed calls;
* `goal_lines`: the goals of the LLM benchmark, PASS / MISS / n/a, from one run's perplexities and seconds.

Example:
    >>> decode_tok_s(1.3, 0.3, 11)
    10.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# the row names llm.py gives its compressors; the goals read these
DENSE, WANDA_50, SPARSEGPT_50 = "dense", "wanda-50%", "sparsegpt-50%"
WANDA_24, SPARSEGPT_24 = "wanda-2:4", "sparsegpt-2:4"
# GPTQ's groups, as the goal asks: SmolLM2's hidden width 576 is 4 x 128 + a last group of 64
GPTQ_GROUP = 128
GPTQ_8, GPTQ_4 = f"gptq-w8g{GPTQ_GROUP}", f"gptq-w4g{GPTQ_GROUP}"
PEER_Q4_K_M = "llama.cpp-Q4_K_M"
COMPILED = ":compiled"  # suffix of a compiled row; the row without it is what was compiled
CALIB_LIMIT_S = 300.0
SCALE_BYTES = 2  # one fp16 scale per group


@dataclass(frozen=True)
class LinearWeights:
    """One linear's weight as stored: `rows` x `cols`, of which `kept` are held (the rest pruned)."""

    rows: int
    cols: int
    kept: int


def weights_bytes(linears: Sequence[LinearWeights], other_params: int, bits: int = 32,
                  group_size: int | None = None) -> float:
    """Bytes of the weights: the compressed linears, plus every other parameter at fp32.

    bits=32 (fp32, dense or pruned): 4 bytes per kept weight. bits < 32 (GPTQ): bits/8 per
    kept weight, plus per group of `group_size` input columns of each row (None: one per row)
    an fp16 scale and a bits-wide zero point: rows * ceil(cols / group_size) * (2 + bits/8).
    A pruned layer's index (which weights are kept) is not counted: a bitmap would add
    rows * cols / 8 bytes. `other_params` (embeddings, norms) are 4 bytes each in every row.

    Example:
        >>> weights_bytes([LinearWeights(2, 256, 512)], other_params=10)   # dense fp32
        2088.0
        >>> weights_bytes([LinearWeights(2, 256, 256)], other_params=0)    # 50% pruned fp32
        1024.0
        >>> weights_bytes([LinearWeights(2, 256, 512)], 0, bits=4, group_size=128)  # 256 + 4 groups x 2.5
        266.0
    """
    total = 4.0 * other_params
    for w in linears:
        if bits >= 32:
            total += 4.0 * w.kept
        else:
            groups = w.rows * (1 if group_size is None else math.ceil(w.cols / group_size))
            total += w.kept * bits / 8 + groups * (SCALE_BYTES + bits / 8)
    return total


def decode_tok_s(seconds_n: float, seconds_1: float, n: int) -> float:
    """Decode tokens per second from `generate` timed with max_new_tokens=n and with 1: (n - 1) / the difference.

    Both calls run the same prefill and pick the first token from its logits; the n-token call
    adds n - 1 one-token forwards with the KV cache. nan where that is not measurable.

    Example:
        >>> decode_tok_s(2.0, 0.5, 31)
        20.0
        >>> decode_tok_s(0.5, 0.6, 31)
        nan
    """
    extra = seconds_n - seconds_1
    return (n - 1) / extra if n >= 2 and extra > 0 else math.nan


def _ppl(ppl: Mapping[str, float], name: str) -> float | None:
    value = ppl.get(name)
    return value if value is not None and math.isfinite(value) else None


def goal_lines(ppl: Mapping[str, float], calib_s: Mapping[str, float], *, calib_windows: int,
               calib_limit_s: float = CALIB_LIMIT_S) -> list[str]:
    """The goal lines, each "PASS  ...", "MISS  ..." or "n/a   ..." (a row it needs did not run or failed).

    `ppl`: perplexity by row name (ours and the peer's, `PEER_Q4_K_M`); `calib_s`: our rows'
    compressor seconds. Compiled rows ("<row>:compiled") each add the check that the compiled
    model scores as the compressed one did, within 0.1%.

    Example:
        >>> goal_lines({"wanda-50%": 22.0, "sparsegpt-50%": 21.0}, {}, calib_windows=8)[0]
        'PASS  SparseGPT 50% ppl 21.00 <= Wanda 50% ppl 22.00'
    """
    lines = []

    def verdict(ok: bool | None, text: str) -> None:
        lines.append(f"{'n/a ' if ok is None else 'PASS' if ok else 'MISS'}  {text}")

    def compare(left: str, left_label: str, right: str, right_label: str, factor: float = 1.0) -> None:
        a, b = _ppl(ppl, left), _ppl(ppl, right)
        scaled = f"{factor:g} x " if factor != 1 else ""
        if a is None or b is None:
            verdict(None, f"{left_label} ppl <= {scaled}{right_label} ppl (needs rows {left} and {right})")
        else:
            verdict(a <= factor * b, f"{left_label} ppl {a:.2f} <= {scaled}{right_label} ppl {b:.2f}"
                    + (f" = {factor * b:.2f}" if factor != 1 else ""))

    compare(SPARSEGPT_50, "SparseGPT 50%", WANDA_50, "Wanda 50%")
    compare(SPARSEGPT_24, "SparseGPT 2:4", WANDA_24, "Wanda 2:4", 0.8)
    compare(GPTQ_4, f"GPTQ 4-bit g{GPTQ_GROUP}", PEER_Q4_K_M, "llama.cpp Q4_K_M")
    q8, dense = _ppl(ppl, GPTQ_8), _ppl(ppl, DENSE)
    if q8 is None or dense is None:
        verdict(None, f"GPTQ 8-bit within 1% of dense (needs rows {GPTQ_8} and {DENSE})")
    else:
        verdict(abs(q8 / dense - 1) <= 0.01, f"GPTQ 8-bit within 1% of dense: ppl {q8:.3f} / {dense:.3f} = "
                                              f"{q8 / dense:.4f}")
    timed = {name: s for name, s in calib_s.items()  # one compressor's calibration: not a chained row's sum
             if name.startswith(("sparsegpt", "gptq")) and "+" not in name and math.isfinite(s)}
    if not timed:
        verdict(None, f"calibration of the whole model (SparseGPT, GPTQ) under {calib_limit_s:g} s (none ran)")
    else:
        slowest = max(timed, key=timed.__getitem__)
        verdict(timed[slowest] < calib_limit_s, f"calibration of the whole model (SparseGPT, GPTQ) under "
                                                f"{calib_limit_s:g} s on {calib_windows} windows: slowest {slowest} "
                                                f"{timed[slowest]:.1f} s")
    for name in ppl:
        if name.endswith(COMPILED):
            got, want = _ppl(ppl, name), _ppl(ppl, name[:-len(COMPILED)])
            base = name[:-len(COMPILED)]
            if got is None or want is None:
                verdict(None, f"{base} compiled equals compressed (a perplexity is missing)")
            else:
                verdict(abs(got / want - 1) < 1e-3, f"{base} compiled equals compressed: |ppl {got:.4f} / "
                                                    f"{want:.4f} - 1| = {abs(got / want - 1):.2e} < 1e-3")
    return lines


@dataclass(frozen=True)
class Speed:
    """One row's perplexity and timings, for the decode goals; `runtime` starts with "step" for the decode step."""

    ppl: float
    prefill_ms: float
    tok_s: float
    runtime: str


def decode_goal_lines(rows: Mapping[str, Speed], factor: float = 1.3, dense_factor: float = 2.5) -> list[str]:
    """Issue 51's goal lines: our decode step against llama.cpp's types at equal or lower perplexity.

    Example:
        >>> rows = {"dense:step": Speed(14.8, 300, 90, "step a32"), "llama.cpp-Q8_0": Speed(14.9, 400, 60, "llama.cpp")}
        >>> decode_goal_lines(rows)[1]
        'PASS  decode at ppl <= llama.cpp Q8_0 (14.90): dense:step 90.0 tok/s >= 1.3 x 60.0 = 78.0'
    """
    lines = []
    ours = {n: r for n, r in rows.items() if r.runtime.startswith("step") and math.isfinite(r.ppl)}
    peers = {n: r for n, r in rows.items() if n.startswith("llama.cpp-") and math.isfinite(r.ppl)}

    def verdict(ok: bool | None, text: str) -> None:
        lines.append(f"{'n/a ' if ok is None else 'PASS' if ok else 'MISS'}  {text}")

    def best_at(ppl: float, key: str) -> tuple[str, Speed] | None:
        fit = [(n, r) for n, r in ours.items() if r.ppl <= ppl and math.isfinite(getattr(r, key))]
        pick = max if key == "tok_s" else min
        return pick(fit, key=lambda item: getattr(item[1], key)) if fit else None

    for qtype in ("Q4_K_M", "Q8_0"):
        peer = peers.get(f"llama.cpp-{qtype}")
        best = best_at(peer.ppl, "tok_s") if peer else None
        if peer is None or best is None:
            verdict(None, f"decode at ppl <= llama.cpp {qtype} (needs that row and a step row at its perplexity)")
            continue
        verdict(best[1].tok_s >= factor * peer.tok_s, f"decode at ppl <= llama.cpp {qtype} ({peer.ppl:.2f}): "
                f"{best[0]} {best[1].tok_s:.1f} tok/s >= {factor:g} x {peer.tok_s:.1f} = {factor * peer.tok_s:.1f}")
    if peers:
        fastest_name, fastest = max(peers.items(), key=lambda item: item[1].tok_s)
        beat = [(n, r) for n, r in ours.items() if r.tok_s > fastest.tok_s and r.ppl < fastest.ppl]
        text = f"faster than llama.cpp's fastest type {fastest_name[10:]} ({fastest.tok_s:.1f} tok/s, ppl " \
               f"{fastest.ppl:.2f}) at a lower perplexity"
        verdict(bool(beat), text + (f": {beat[0][0]} {beat[0][1].tok_s:.1f} tok/s, ppl {beat[0][1].ppl:.2f}"
                                    if beat else ""))
        peer = peers.get("llama.cpp-Q4_K_M")
        best = best_at(peer.ppl, "prefill_ms") if peer else None
        if peer is not None and best is not None:
            verdict(best[1].prefill_ms < peer.prefill_ms, f"prefill of 128 tokens at ppl <= Q4_K_M's: {best[0]} "
                    f"{best[1].prefill_ms:.0f} ms < {peer.prefill_ms:.0f} ms")
    step, eager = rows.get("dense:step-f32"), rows.get("dense")
    if step is None or eager is None:
        verdict(None, f"dense fp32 decode >= {dense_factor:g} x Hugging Face eager (needs dense and dense:step-f32)")
    else:
        verdict(step.tok_s >= dense_factor * eager.tok_s, f"dense fp32 decode {step.tok_s:.1f} tok/s >= "
                f"{dense_factor:g} x Hugging Face eager {eager.tok_s:.1f} = {dense_factor * eager.tok_s:.1f}")
    return lines
