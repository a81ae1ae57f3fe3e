"""Workload: Hugging Face `BertForSequenceClassification` with BERT-base widths, classifying digit token sequences.

What it is, honestly:

* the model is `transformers.BertForSequenceClassification` built from a config (random
  init, no hub): BERT-base widths (hidden 768, 12 heads, FFN 3072) but 2 layers, not 12,
  so that training from scratch fits in a few minutes on 2 cores;
* the task is the bundled digits as 9-token sequences (`digit_tokens`: one token per image
  row): trained once, 8 epochs (~1 minute on 2 cores, then cached in the sparta-explore
  cache; 94% test accuracy measured), scored by accuracy on the 450 test digits,
  fine-tuned and calibrated on the train split only;
* latency is timed at batch 8 x 128 tokens (sequences padded with an attention mask),
  BERT's usual shape, so the kernels see BERT-base GEMMs (1024 x 768 -> 3072 and back).

Use it: ``sparta-explore sweep --workload experiments/workloads/bert_digits.py:workload``,
or the NNI experiment ``experiments/bert_latency_guided.yml``. A 12-layer BERT-base with
random weights (latency only) is in ``benchmarks/bert_model.py``.
"""

from __future__ import annotations

from digit_tokens import VOCAB, accuracy, batches, load_token_digits, loss, trained

from sparta_explore.workload import Workload

LATENCY_BATCH, LATENCY_SEQ = 8, 128


def bert_digits_workload(layers: int = 2, hidden: int = 768, heads: int = 12, ffn: int = 3072, epochs: int = 8,
                         lr: float = 1e-4, cache_dir: str | None = None) -> Workload:
    """The workload; smaller sizes make quick variants (tests use hidden 64, 1 layer).

    Example:
        >>> w = bert_digits_workload(layers=1, hidden=64, heads=4, ffn=128, epochs=1)  # doctest: +SKIP
    """
    from transformers import BertConfig, BertForSequenceClassification

    data = load_token_digits()
    config = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=ffn, max_position_embeddings=LATENCY_SEQ, num_labels=10,
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0)

    def build():
        return trained(f"bert-digits-{layers}x{hidden}", lambda: BertForSequenceClassification(config), data,
                       epochs=epochs, lr=lr, cache_dir=cache_dir)

    val_ids, val_y = data.train_ids[-384:], data.train_y[-384:]
    return Workload(
        name=f"bert-digits-{layers}x{hidden}", model=build,
        inputs=data.padded(2, LATENCY_SEQ),
        metric=lambda m: accuracy(m, data.test_ids, data.test_y), metric_name="accuracy",
        latency_inputs=lambda batch: data.padded(batch, LATENCY_SEQ), default_batch=LATENCY_BATCH,
        train_batches=batches(data.train_ids, data.train_y), loss=loss,
        validation_metric=lambda m: accuracy(m, val_ids, val_y),
        head="classifier",
        description="HF BertForSequenceClassification, BERT-base widths, 2 layers, digits as 9-token sequences")


def workload() -> Workload:
    """The default variant: BERT-base widths, 2 layers."""
    return bert_digits_workload()


def tiny() -> Workload:
    """A variant small enough for tests (1 layer, hidden 64): trains in seconds."""
    return bert_digits_workload(layers=1, hidden=64, heads=4, ffn=128, epochs=30, lr=2e-3)
