"""DeepSparse side of `benchmarks/peers.py`: runs only inside the peer venv (.venv-peers), never the project's.

A server on stdin/stdout, one JSON object a line, so that peers.py can take turns with it: a
block of our calls, then a block of DeepSparse's, on the same case, a few times over (on a
shared machine the speed moves by 1.5x over seconds: timed one side after the other, a
ratio measured the drift). Requests:

* `{"prepare": {"id", "layout", "kind", "prec", "file"}}`: load the case peers.py saved (an
  `.npz` with the masked weights, biases and the input x of shape (B, S, K)), build the same
  torch module (nn.Linear, or the FFN block Linear -> GELU -> Linear), export it to ONNX with
  the legacy TorchScript exporter (static shapes, opset 13), compile `deepsparse.Engine(model,
  batch_size=..., num_cores=...)`, check it and warm it for 0.25 s (at least 3 calls). Layout
  "3d" (the fair one) feeds x as a transformer gives it, (B, S, K) with batch_size=B: the
  exporter writes each Linear as MatMul(x, W^T) -> Add(b). Layout "2d" flattens x to (B*S, K)
  with batch_size=B*S, one-row samples (each Linear a Gemm): DeepSparse is slower so (issue
  27: 1.2-1.8x), and it is kept only to show that. The reply: `compile_s` (the ONNX export,
  and for int8 the quantized graph, plus the Engine construction), `export_s` (the first
  part), `err`, `call_s` (a warm call), `supported_ops`, the engine's ISA.
* `{"time": id, "calls": n}`: the seconds of n calls, `{"times": [...]}`.
* `{"drop": id}`: free the engine.

Replies start with `PEER ` (DeepSparse may print to stdout too); a request that fails
replies `{"id", "error", "trace"}` and the server goes on.

int8 cases get a quantized graph written here with the `onnx` helper API. Each Gemm or
MatMul -> Add reads x quantized to uint8 with a static per-tensor scale and zero point
calibrated on this very x (DeepSparse's best case) and symmetric int8 weights, one scale per
output row (`--weight-quant tensor`: one scale). `--int8-format integer` (default) writes the
layout sparseml's exporter hands DeepSparse: QuantizeLinear -> MatMulInteger (uint8 weights,
zero point 128) -> Add (int32 bias) -> Cast -> Mul (rescale); DeepSparse runs all of it
(supported_ops 1.0). `--int8-format qdq` writes QuantizeLinear/DequantizeLinear pairs around
the float Gemm / MatMul instead: DeepSparse 1.8.0 compiles none of the 2-D (Gemm) graph
(supported_ops 0.0) and not all of the 3-D one (< 1.0), handing the rest to its fallback
runtime, so it is kept only to show that.

Every prepared case carries `err`: max |y_ds - y_torch| / max |y_torch| against the fp32 torch
module (for int8 that includes the quantization error, as ours does), and for int8 also
`err_sim`: against torch doing the same rounding, so a broken export shows as a large
`err_sim`.

    .venv-peers/bin/python benchmarks/peers_deepsparse_worker.py --tmp DIR < requests
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("NM_DISABLE_ANALYTICS", "1")  # no telemetry calls from an offline machine

import deepsparse  # noqa: E402  (first: a venv without it fails on this line)
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from torch import nn  # noqa: E402

OPSET = 13
REPLY = "PEER "  # replies start with this: DeepSparse may print its own lines to stdout
WARM_SECONDS = 0.25  # each engine runs this long before it is timed, as ours do (benchmarks/kernels.py, warm)
Ranges = list[tuple[float, float]]


def build_module(arrays: dict[str, np.ndarray], kind: str) -> nn.Module:
    """nn.Linear (w, b) or nn.Sequential(Linear, GELU, Linear) (w1, b1, w2, b2) holding the saved weights."""

    def linear(w: np.ndarray, b: np.ndarray) -> nn.Linear:
        lin = nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        return lin

    if kind == "linear":
        return linear(arrays["w"], arrays["b"]).eval()
    return nn.Sequential(linear(arrays["w1"], arrays["b1"]), nn.GELU(), linear(arrays["w2"], arrays["b2"])).eval()


def export(module: nn.Module, x: torch.Tensor, path: Path) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter is asked for on purpose
        torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=OPSET, input_names=["x"],
                          output_names=["y"], do_constant_folding=True)


def linear_input_ranges(module: nn.Module, x: torch.Tensor) -> Ranges:
    """(min, max) of the input of each nn.Linear, in module order (= the order the exporter writes them)."""
    ranges: Ranges = []
    hooks = [m.register_forward_pre_hook(lambda _m, a: ranges.append((float(a[0].min()), float(a[0].max()))))
             for m in module.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        module(x)
    for h in hooks:
        h.remove()
    return ranges


def activation_qparams(lo: float, hi: float) -> tuple[float, int]:
    """Asymmetric uint8 scale and zero point covering [lo, hi] (and 0)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max(hi - lo, 1e-8) / 255.0
    return scale, int(np.clip(round(-lo / scale), 0, 255))


def weight_qparams(w: np.ndarray, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights (N, K) and their scales (one per output row, or one scalar)."""
    amax = np.abs(w).max(axis=1) if per_channel else np.array(np.abs(w).max())
    scale = (np.maximum(amax, 1e-12) / 127.0).astype(np.float32)
    return np.clip(np.round(w / (scale[:, None] if per_channel else scale)), -127, 127).astype(np.int8), scale


def linear_sites(graph: onnx.GraphProto) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """Where the exporter wrote each nn.Linear: Gemm(x, W, b, transB=1) for a 2-D x, MatMul(x, W^T) -> Add(b) for 3-D.

    Returns {index of the Gemm or MatMul node: x, y, w (N, K), b, the initializers it replaces,
    gemm} and the indices of the Add nodes folded into a MatMul site.
    """
    inits = {t.name: t for t in graph.initializer}
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, []).append(i)
    sites, folded = {}, set()
    for i, node in enumerate(graph.node):
        trans_b = any(a.name == "transB" and a.i == 1 for a in node.attribute)
        if node.op_type == "Gemm" and trans_b and len(node.input) == 3 and {*node.input[1:]} <= inits.keys():
            w, b, y, j = node.input[1], node.input[2], node.output[0], None
        elif node.op_type == "MatMul" and node.input[1] in inits and len(consumers.get(node.output[0], [])) == 1:
            j = consumers[node.output[0]][0]
            bias = [name for name in graph.node[j].input if name != node.output[0]]
            if graph.node[j].op_type != "Add" or len(bias) != 1 or bias[0] not in inits:
                continue
            w, b, y = node.input[1], bias[0], graph.node[j].output[0]
            folded.add(j)
        else:
            continue
        weight = numpy_helper.to_array(inits[w]).astype(np.float32)
        sites[i] = {"x": node.input[0], "y": y, "w": weight if j is None else weight.T, "gemm": j is None,
                    "b": numpy_helper.to_array(inits[b]).astype(np.float32), "names": (w, b)}
    return sites, folded


def quantize_graph(src: Path, dst: Path, ranges: Ranges, per_channel: bool, fmt: str) -> list[dict[str, Any]]:
    """Write `dst`: `src` with every Linear (`linear_sites`) quantized; returns the qparams.

    fmt "integer": QuantizeLinear(x) -> MatMulInteger(x_u8, W_u8 (zero point 128)) -> Add(int32 bias)
    -> Cast -> Mul(rescale), the layout sparseml's exporter gives DeepSparse. fmt "qdq": the Gemm
    (or MatMul -> Add) reads DequantizeLinear(QuantizeLinear(x)) and DequantizeLinear(W_int8), bias fp32.
    """
    model = onnx.load(str(src))
    graph = model.graph
    sites, folded = linear_sites(graph)
    nodes, params, extra, dropped = [], [], [], set()
    for index, node in enumerate(graph.node):
        if index in folded:
            continue
        if index not in sites:
            nodes.append(node)
            continue
        site, p = sites[index], f"q{len(params)}_"
        wq, w_scale = weight_qparams(site["w"], per_channel)
        a_scale, a_zp = activation_qparams(*ranges[len(params)])
        rescale = (a_scale * w_scale).astype(np.float32)
        b_q = np.round(site["b"] / rescale).astype(np.int32)
        extra += [numpy_helper.from_array(np.array(a_scale, np.float32), p + "a_scale"),
                  numpy_helper.from_array(np.array(a_zp, np.uint8), p + "a_zp")]
        quant = helper.make_node("QuantizeLinear", [site["x"], p + "a_scale", p + "a_zp"], [p + "a_q"])
        if fmt == "integer":
            extra += [numpy_helper.from_array((wq.T.astype(np.int32) + 128).astype(np.uint8), p + "w_u8"),
                      numpy_helper.from_array(np.array(128, np.uint8), p + "w_zp"),
                      numpy_helper.from_array(b_q, p + "b_q"), numpy_helper.from_array(rescale, p + "rescale")]
            nodes += [quant,
                      helper.make_node("MatMulInteger", [p + "a_q", p + "w_u8", p + "a_zp", p + "w_zp"], [p + "acc"]),
                      helper.make_node("Add", [p + "acc", p + "b_q"], [p + "acc_b"]),
                      helper.make_node("Cast", [p + "acc_b"], [p + "acc_f"], to=TensorProto.FLOAT),
                      helper.make_node("Mul", [p + "acc_f", p + "rescale"], [site["y"]])]
            bias, dropped = b_q * rescale, dropped | set(site["names"])
        else:  # W stays (N, K) under Gemm's transB; MatMul reads it as (K, N), one scale per column
            axis = {"axis": 0 if site["gemm"] else 1} if per_channel else {}
            extra += [numpy_helper.from_array(wq if site["gemm"] else np.ascontiguousarray(wq.T), p + "w_q"),
                      numpy_helper.from_array(w_scale, p + "w_scale"),
                      numpy_helper.from_array(np.zeros(w_scale.shape, np.int8), p + "w_zp")]
            nodes += [quant,
                      helper.make_node("DequantizeLinear", [p + "a_q", p + "a_scale", p + "a_zp"], [p + "a_dq"]),
                      helper.make_node("DequantizeLinear", [p + "w_q", p + "w_scale", p + "w_zp"], [p + "w_dq"],
                                       **axis)]
            nodes += ([helper.make_node("Gemm", [p + "a_dq", p + "w_dq", site["names"][1]], [site["y"]], transB=1)]
                      if site["gemm"] else
                      [helper.make_node("MatMul", [p + "a_dq", p + "w_dq"], [p + "mm"]),
                       helper.make_node("Add", [p + "mm", site["names"][1]], [site["y"]])])
            bias, dropped = site["b"], dropped | {site["names"][0]}
        params.append({"a_scale": a_scale, "a_zp": a_zp, "w_scale": w_scale, "wq": wq, "bias": bias})
    if len(params) != len(ranges):
        raise RuntimeError(f"quantized {len(params)} Linear layers in the graph, the module has {len(ranges)}")
    kept = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept + extra)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return params


def simulate(module: nn.Module, x: torch.Tensor, params: list[dict[str, Any]]) -> torch.Tensor:
    """The torch module with the quantized graph's rounding: fake-quantized Linear inputs, weights and bias."""
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    hooks = []
    with torch.no_grad():
        for lin, p in zip(linears, params):
            scale = torch.from_numpy(np.asarray(p["w_scale"])).float()
            lin.weight.copy_(torch.from_numpy(p["wq"]).float() * (scale.reshape(-1, 1) if scale.ndim else scale))
            lin.bias.copy_(torch.from_numpy(np.asarray(p["bias"], np.float32)))

            def fake(_m: nn.Module, a: tuple, s: float = p["a_scale"], z: int = p["a_zp"]) -> tuple:
                return ((torch.clamp(torch.round(a[0] / s) + z, 0, 255) - z) * s,)

            hooks.append(lin.register_forward_pre_hook(fake))
        y = module(x)
    for h in hooks:
        h.remove()
    return y


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / max(float(np.abs(ref).max()), 1e-12))


def prepare(case: dict[str, Any], tmp: Path, num_cores: int, weight_quant: str,
            int8_format: str) -> tuple[Any, list[np.ndarray], dict[str, Any]]:
    """Export and compile one case in one layout ("3d": the saved x (B, S, K) with batch_size=B, "2d" its (B*S, K)
    flattening); check it against torch and warm it. Returns the engine, its inputs and the record."""
    arrays = dict(np.load(case["file"]))
    x_np = arrays["x"] if case.get("layout", "3d") == "3d" else arrays["x"].reshape(-1, arrays["x"].shape[-1])
    x_np = np.ascontiguousarray(x_np)
    x = torch.from_numpy(x_np)
    module = build_module(arrays, case["kind"])
    with torch.no_grad():
        reference = module(x).numpy()
    path = tmp / f"{case['id']}_fp32.onnx"
    out: dict[str, Any] = {"id": case["id"], "shape": list(x.shape), "deepsparse": deepsparse.__version__,
                           "int8": f"{int8_format}/{weight_quant}"}
    start = time.perf_counter()
    export(module, x, path)
    if case["prec"] == "int8":
        qpath = tmp / f"{case['id']}_int8.onnx"
        params = quantize_graph(path, qpath, linear_input_ranges(module, x), weight_quant == "channel", int8_format)
        path = qpath
    out["export_s"] = time.perf_counter() - start
    start = time.perf_counter()
    engine = deepsparse.Engine(model=str(path), batch_size=x.shape[0], num_cores=num_cores)
    out["compile_s"] = out["export_s"] + time.perf_counter() - start
    inputs = [x_np]
    y = engine.run(inputs)[0]
    out["err"] = rel_err(y, reference)
    if case["prec"] == "int8":
        out["err_sim"] = rel_err(y, simulate(module, x, params).numpy())
    start, done = time.perf_counter(), 0
    while done < 3 or time.perf_counter() - start < WARM_SECONDS:
        engine.run(inputs)
        done += 1
    out["call_s"] = (time.perf_counter() - start) / done
    out["supported_ops"] = float(getattr(engine, "fraction_of_supported_ops", float("nan")))
    out["engine"] = {"avx": str(getattr(engine, "cpu_avx_type", "?")), "vnni": bool(getattr(engine, "cpu_vnni", 0))}
    return engine, inputs, out


def timed(engine: Any, inputs: list[np.ndarray], calls: int) -> list[float]:
    """Seconds of each of `calls` engine runs."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        engine.run(inputs)
        times.append(time.perf_counter() - start)
    return times


def answer(request: dict[str, Any], engines: dict[str, tuple], tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One request: {"prepare": case}, {"time": id, "calls": n} or {"drop": id}."""
    if "prepare" in request:
        case = request["prepare"]
        engine, inputs, out = prepare(case, tmp, args.num_cores, args.weight_quant, args.int8_format)
        engines[case["id"]] = (engine, inputs)
        return out
    if "time" in request:
        engine, inputs = engines[request["time"]]
        return {"id": request["time"], "times": timed(engine, inputs, int(request["calls"]))}
    engines.pop(request["drop"], None)
    return {"id": request["drop"], "dropped": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tmp", type=Path, required=True, help="folder for the ONNX files")
    parser.add_argument("--num-cores", type=int, default=2)
    parser.add_argument("--weight-quant", choices=("channel", "tensor"), default="channel")
    parser.add_argument("--int8-format", choices=("integer", "qdq"), default="integer")
    args = parser.parse_args()
    torch.set_num_threads(args.num_cores)
    engines: dict[str, tuple] = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            reply = answer(request, engines, args.tmp, args)
        except Exception as exc:  # one case failing (export, engine) must not stop the others
            case_id = (request.get("prepare") or {}).get("id") or request.get("time") or request.get("drop")
            reply = {"id": case_id, "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                     "trace": traceback.format_exc(limit=3)}
        print(REPLY + json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
