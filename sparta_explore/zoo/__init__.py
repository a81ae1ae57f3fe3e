"""Embedded models and data: digits classifiers, BERT-style encoders, ResNet/MobileNet-style nets.

Importing the zoo registers the digits models (`zoo.workloads`) and the LLMs ``smollm2-135m`` and
``smollm2-tiny`` (`zoo.llm`, which loads `transformers` and the weights only when used) as built-in workloads;
`sparta_explore.workload` names the zoo as a source and imports it on the first lookup by name.

Example:
    >>> from sparta_explore import zoo
    >>> model, acc = zoo.pretrained("digits-cnn")  # doctest: +SKIP
"""

from sparta_explore.zoo.bert import BertConfig, BertEncoder, DigitsTransformer
from sparta_explore.zoo.convnets import MobileNetMini, ResNetMini
from sparta_explore.zoo.data import DataSplit, load_digits_split, load_npz_split
from sparta_explore.zoo.digits_models import DigitsCNN, DigitsMLP
from sparta_explore.zoo.registry import ModelSpec, build_model, example_inputs, get_spec, model_names, register_model
from sparta_explore.zoo.training import TrainConfig, evaluate, pretrained, train
from sparta_explore.zoo.workloads import digits_workload

# isort: split
from sparta_explore.zoo import llm  # noqa: F401  registers smollm2-135m and smollm2-tiny (loaded when used)

__all__ = ["BertConfig", "BertEncoder", "DataSplit", "DigitsCNN", "DigitsMLP", "DigitsTransformer", "MobileNetMini",
           "ModelSpec", "ResNetMini", "TrainConfig", "build_model", "digits_workload", "evaluate", "example_inputs",
           "get_spec", "load_digits_split", "load_npz_split", "model_names", "pretrained", "register_model", "train"]
