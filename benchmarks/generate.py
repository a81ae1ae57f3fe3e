"""A Hugging Face causal LM compiled in place: `generate` keeps its KV cache; prefill and decode against dense torch.

`transformers.LlamaForCausalLM` built from a config (random weights; the default config's
options, `use_cache=True`, at a small size: `--hidden`, `--layers`), every decoder linear
(q, k, v, o, gate, up, down) pruned in blocks (`--sparsity`, `--block`), compiled in place
on a `--prompt`-token example (`CompileConfig(inplace=True)`). Printed, from one run:

  tokens equal   greedy `generate` of the compiled model vs the model masked with the table
  prefill ms     one forward over the prompt (cache built), median, dense / masked / compiled
  decode tok/s   new tokens per second after the prefill, `generate` of `--new` tokens
  compile s      the in-place compile

Dense, masked and compiled calls alternate (a load burst hits all three alike).

    python benchmarks/generate.py                    # ~3 min on 2 cores
    python benchmarks/generate.py --layers 2 --new 16
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch import nn

import sparta_explore as se
from sparta_explore.compile.config import CompileConfig
from sparta_explore.pruners import prune
from sparta_explore.pruners.block import BlockPruneConfig


def llama(hidden: int, layers: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64, num_hidden_layers=layers,
                         num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, vocab_size=8000,
                         max_position_embeddings=1024)
    return LlamaForCausalLM(config).eval()


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> dict:
    model = llama(args.hidden, args.layers)
    prompt = torch.randint(0, 8000, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    graph = se.capture(model, {"input_ids": prompt})
    names = tuple(n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head")
    table = prune(model, BlockPruneConfig(args.sparsity, tuple(args.block), op_names=names), pruner="block",
                  graph=graph)
    dense = model
    masked = se.masked_copy(model, table)
    compiled = se.masked_copy(model, {})  # a copy to compile in place: the dense model stays the baseline
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        se.compile(compiled, se.run_propagation(se.capture(compiled, {"input_ids": prompt}), table),
                   {"input_ids": prompt}, config=CompileConfig(inplace=True))
    compile_s = time.perf_counter() - start
    kw = {"max_new_tokens": args.new, "do_sample": False, "pad_token_id": 0}
    with torch.inference_mode():
        want = masked.generate(prompt, **kw)
        got = compiled.generate(prompt, **kw)
        models = {"dense": dense, "masked": masked, "compiled": compiled}
        prefill: dict[str, list[float]] = {k: [] for k in models}
        gen: dict[str, list[float]] = {k: [] for k in models}
        for m in models.values():  # warm-up: first calls fault in pages, size buffers
            m(prompt)
        for _ in range(args.repeats):
            for name, m in models.items():
                prefill[name].append(_timed(lambda m=m: m(prompt, use_cache=True)))
                gen[name].append(_timed(lambda m=m: m.generate(prompt, **kw)))
    out = {"equal": got.tolist() == want.tolist(), "compile_s": compile_s,
           "swapped": len(compiled.sparta_compiled.swapped), "guard": compiled.sparta_compiled.guard}
    for name in models:
        p, g = statistics.median(prefill[name]), statistics.median(gen[name])
        out[name] = {"prefill_ms": 1e3 * p, "decode_tps": (args.new - 1) / max(g - p, 1e-9)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--sparsity", type=float, default=0.9)
    p.add_argument("--block", type=int, nargs=2, default=(32, 32))
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    r = run(args)
    print(f"\nLlamaForCausalLM hidden {args.hidden}, {args.layers} layers, use_cache=True, decoder linears "
          f"{args.sparsity:.0%} {args.block[0]}x{args.block[1]}, prompt {args.prompt}, {args.new} new tokens, "
          f"{torch.get_num_threads()} threads")
    print(f"compiled in place in {r['compile_s']:.1f} s ({r['swapped']} linears hold kernels); greedy tokens equal to "
          f"the masked model's: {r['equal']}")
    print(f"{'model':<10}{'prefill ms':>12}{'x dense':>9}{'decode tok/s':>14}{'x dense':>9}")
    for name in ("dense", "masked", "compiled"):
        m = r[name]
        print(f"{name:<10}{m['prefill_ms']:>12.2f}{r['dense']['prefill_ms'] / m['prefill_ms']:>9.2f}"
              f"{m['decode_tps']:>14.1f}{m['decode_tps'] / r['dense']['decode_tps']:>9.2f}")


if __name__ == "__main__":
    main()
