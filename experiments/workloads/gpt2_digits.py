"""Workload: a GPT-2-style decoder from `transformers` (Conv1D layers), classifying digit token sequences.

What it is, honestly:

* `transformers.GPT2ForSequenceClassification` from a config (random init, no hub):
  2 layers, width 512, 8 heads; its attention and MLP projections are GPT-2's `Conv1D`
  (a linear whose weight is stored in x out), which sparta-explore prunes and compiles in
  the kernels' (out, in) layout;
* the causal decoder reads the digits as 9 tokens (`digit_tokens`) and classifies from
  its last real token; trained once (cached), scored by accuracy on the 450 test digits;
* latency at batch 8 x 128 tokens, padded (GPT-2 finds the last real token from the pad id).

Use it: ``sparta-explore sweep --workload experiments/workloads/gpt2_digits.py:workload``.
"""

from __future__ import annotations

from digit_tokens import PAD, VOCAB, accuracy, batches, load_token_digits, loss, trained

from sparta_explore.workload import Workload

LATENCY_BATCH, LATENCY_SEQ = 8, 128


def gpt2_digits_workload(layers: int = 2, width: int = 512, heads: int = 8, epochs: int = 10, lr: float = 2e-4,
                         cache_dir: str | None = None) -> Workload:
    """The workload; smaller sizes make quick variants.

    Example:
        >>> w = gpt2_digits_workload(layers=1, width=64, heads=4, epochs=1)  # doctest: +SKIP
    """
    from transformers import GPT2Config, GPT2ForSequenceClassification

    data = load_token_digits()
    config = GPT2Config(vocab_size=VOCAB, n_positions=LATENCY_SEQ, n_embd=width, n_layer=layers, n_head=heads,
                        num_labels=10, pad_token_id=PAD, bos_token_id=PAD, eos_token_id=PAD, use_cache=False,
                        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.0)

    def build():
        return trained(f"gpt2-digits-{layers}x{width}", lambda: GPT2ForSequenceClassification(config), data,
                       epochs=epochs, lr=lr, cache_dir=cache_dir)

    val_ids, val_y = data.train_ids[-384:], data.train_y[-384:]
    return Workload(
        name=f"gpt2-digits-{layers}x{width}", model=build, inputs=data.padded(2, LATENCY_SEQ),
        metric=lambda m: accuracy(m, data.test_ids, data.test_y), metric_name="accuracy",
        latency_inputs=lambda batch: data.padded(batch, LATENCY_SEQ), default_batch=LATENCY_BATCH,
        train_batches=batches(data.train_ids, data.train_y), loss=loss,
        validation_metric=lambda m: accuracy(m, val_ids, val_y), head="score",
        description="HF GPT2ForSequenceClassification (Conv1D), 2 layers, width 512, digits as 9-token sequences")


def workload() -> Workload:
    """The default variant: 2 layers, width 512."""
    return gpt2_digits_workload()


def tiny() -> Workload:
    """A variant small enough for tests (1 layer, width 64)."""
    return gpt2_digits_workload(layers=1, width=64, heads=4, epochs=30, lr=2e-3)
