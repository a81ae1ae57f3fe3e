# %% [markdown]
# # Which pruners and quantizers work on which embedded models
#
# Runs every registered pruner and quantizer on every digits model (trained weights
# from the cache), records whether it worked, the sparsity / bits it produced, and the
# accuracy of the masked model before and after one epoch of mask-respecting
# fine-tuning. Run with `python experiments/compressor_matrix.py [--out results/matrix]`;
# each `# %%` cell also runs on its own in an editor with cell support.

# %%
import argparse
import time
from pathlib import Path

import pandas as pd
from torch import nn

from sparta_explore import apply_table, capture, masked_copy
from sparta_explore.pruners import BlockPruneConfig, NMPruneConfig, NNIPruneConfig, prune, pruner_names
from sparta_explore.quantizers import NNIQuantConfig, UniformQuantConfig, quantize, quantizer_names
from sparta_explore.workload import load_workload
from sparta_explore.zoo import TrainConfig, evaluate, load_digits_split, model_names, pretrained, train

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--out", type=Path, default=Path("results/matrix"))
parser.add_argument("--sparsity", type=float, default=0.5)
parser.add_argument("--models", nargs="*", default=model_names("digits"))
args, _ = parser.parse_known_args()
data = load_digits_split()


def head(model: nn.Module) -> str:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]


def prune_config(name: str, model: nn.Module, sparsity: float):
    exclude = (head(model),)
    if name == "block":
        return BlockPruneConfig(sparsity, (4, 8), exclude_op_names=exclude)
    if name == "nm":
        return NMPruneConfig(2, 4, exclude_op_names=exclude)
    has_bn = any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    op_types = ("BatchNorm2d",) if name == "slim" and has_bn else ("Linear", "Conv2d")
    return NNIPruneConfig(sparsity, op_types=op_types, exclude_op_names=exclude, training_steps=20)


# %% Pruners
rows = []
for model_name in args.models:
    for pruner in pruner_names():
        model, dense_acc = pretrained(model_name, data=data)
        start = time.perf_counter()
        try:
            table = prune(model, prune_config(pruner, model, args.sparsity), pruner=pruner,
                          evaluator=load_workload(model_name),
                          example_inputs=data.test_x[:1])
        except Exception as e:  # the matrix records failures instead of stopping
            rows.append({"model": model_name, "pruner": pruner, "status": f"error: {type(e).__name__}: {e}"[:120]})
            continue
        masked = masked_copy(model, table)
        masked_acc = evaluate(masked, data.test_x, data.test_y)
        tuned_acc = train(masked, data, TrainConfig(epochs=1, lr=1e-3), after_step=lambda m, t=table: apply_table(m, t))
        weights = [n for n in table if n.endswith("weight") and table[n].numel > 1]
        pruned = sum(int(table[n].pruned.sum()) for n in weights) / sum(table[n].numel for n in weights)
        rows.append({"model": model_name, "pruner": pruner, "status": "ok", "weight_sparsity": round(pruned, 3),
                     "dense_acc": round(dense_acc, 4), "masked_acc": round(masked_acc, 4),
                     "finetuned_acc": round(tuned_acc, 4), "seconds": round(time.perf_counter() - start, 2)})
pruners_df = pd.DataFrame(rows)
print(pruners_df.to_string(index=False))

# %% Quantizers
rows = []
for model_name in args.models:
    for quantizer in quantizer_names():
        model, dense_acc = pretrained(model_name, data=data)
        graph = capture(model, data.test_x[:1])
        config = UniformQuantConfig() if quantizer == "uniform" else NNIQuantConfig(training_steps=20)
        start = time.perf_counter()
        try:
            table = quantize(model, config, quantizer=quantizer, evaluator=load_workload(model_name), graph=graph)
        except Exception as e:
            rows.append({"model": model_name, "quantizer": quantizer,
                         "status": f"error: {type(e).__name__}: {e}"[:120]})
            continue
        quantized = [n for n in table if table[n].kept_bits() != [32]]
        bits = sorted({f"{b}{'/'.join(sorted(f.name.lower() for f in table[n].formats()))}"
                       for n in quantized for b in table[n].kept_bits()})
        rows.append({"model": model_name, "quantizer": quantizer, "status": "ok", "tensors": len(quantized),
                     "bits": ",".join(bits), "float_acc_after": round(evaluate(model, data.test_x, data.test_y), 4),
                     "seconds": round(time.perf_counter() - start, 2)})
quantizers_df = pd.DataFrame(rows)
print(quantizers_df.to_string(index=False))

# %% Save
args.out.mkdir(parents=True, exist_ok=True)
pruners_df.to_csv(args.out / "pruners.csv", index=False)
quantizers_df.to_csv(args.out / "quantizers.csv", index=False)
print(f"wrote {args.out / 'pruners.csv'} and {args.out / 'quantizers.csv'}")
