"""NNI pruner adapters: the TeSA's zeros are exactly the zeros of NNI's own masks."""

import copy

import pytest
import torch
from nni.compression.pruning import FPGMPruner, L1NormPruner, L2NormPruner, LevelPruner

from sparta_explore import TeSA, capture
from sparta_explore.errors import ConfigError
from sparta_explore.pruners import NNIPruneConfig, from_nni_masks, get_pruner, prune
from sparta_explore.pruners.nni_evaluator import quiet_nni

MODELS = ["digits-mlp", "digits-cnn"]
HEAD = {"digits-mlp": "head", "digits-cnn": "fc2"}


def _config(model_name, pruner):
    op_types = ("BatchNorm2d",) if pruner == "slim" and model_name == "digits-cnn" else ("Linear", "Conv2d")
    return NNIPruneConfig(0.5, op_types=op_types, exclude_op_names=(HEAD[model_name],), training_steps=8,
                          schedule_times=2)


def _assert_table_matches(table, masks, model):
    params = dict(model.named_parameters())
    masked_names = set()
    for module, targets in masks.items():
        for target, mask in targets.items():
            name = f"{module}.{target}"
            masked_names.add(name)
            assert torch.equal(table[name].pruned, mask == 0), name
            assert table[name].kept_bits() in ([32], [])
    for name in params:
        if name not in masked_names:
            assert table[name].sparsity == 0.0, f"{name} has no NNI mask but was pruned"


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("cls,name", [(LevelPruner, "level"), (L1NormPruner, "l1norm"), (L2NormPruner, "l2norm"),
                                      (FPGMPruner, "fpgm")])
def test_one_shot_pruners_match_nni_run_directly(trained, model_name, cls, name):
    model = trained(model_name)
    reference = copy.deepcopy(model)
    config = _config(model_name, name)
    with quiet_nni():
        pruner = cls(reference, config.to_config_list())
        _, nni_masks = pruner.compress()
    table = prune(model, config, pruner=name)
    _assert_table_matches(table, nni_masks, model)
    weights = [n for n in table if n.endswith("weight") and not n.startswith(HEAD[model_name])]
    assert all(abs(table[n].sparsity - 0.5) < 0.06 for n in weights if "bn" not in n)


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("name", ["taylor", "slim", "movement", "agp", "linear"])
def test_training_pruners_tables_equal_their_masks(trained, digits, digits_task, model_name, name):
    model = trained(model_name)
    config = _config(model_name, name)
    masks = get_pruner(name).fn(model, config, digits_task(model_name))
    assert masks, f"{name} returned no masks"
    table = from_nni_masks(capture(model, digits.test_x[:2]), masks)
    _assert_table_matches(table, masks, model)
    assert any(table[f"{m}.weight"].sparsity > 0.2 for m in masks)
    # NNI's wrappers are gone: the model is plain torch again and still runs
    assert not any("_nni_wrapper" in n for n, _ in model.named_parameters())
    assert model(digits.test_x[:4]).shape == (4, 10)


def test_prune_accepts_raw_nni_config_list(trained):
    model = trained("digits-mlp")
    table = prune(model, [{"op_names": ["layers.0"], "sparse_ratio": 0.75}], pruner="LevelPruner")
    assert table["layers.0.weight"].sparsity == pytest.approx(0.75, abs=0.01)
    assert table["layers.1.weight"].sparsity == 0.0


def test_prune_leaves_one_shot_weights_untouched(trained):
    model = trained("digits-mlp")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    prune(model, {"sparsity": 0.5}, pruner="l1norm")
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_table_bound_to_graph_when_inputs_given(trained, digits):
    model = trained("digits-cnn")
    table = prune(model, {"sparsity": 0.5, "exclude_op_names": ["fc2"]}, pruner="l1norm",
                  example_inputs=digits.test_x[:2])
    assert table.shapes is not None and "relu" in table.shapes
    with pytest.raises(Exception, match="fc9"):
        table["fc9.weight"] = TeSA.dense((1,))


def test_training_pruner_without_evaluator_is_a_clear_error(trained):
    with pytest.raises(ConfigError, match="taylor.*evaluator"):
        prune(trained("digits-mlp"), {"sparsity": 0.5}, pruner="taylor")


def test_an_evaluator_that_is_no_workload_is_a_clear_error(trained, digits):
    # pruners take a workload (its batches, loss and metric), not a data set
    with pytest.raises(ConfigError, match="NNI Evaluator or a workload that can train.*got DataSplit"):
        prune(trained("digits-mlp"), {"sparsity": 0.5, "training_steps": 1}, pruner="taylor", evaluator=digits)


def test_bad_configs_name_the_key(trained):
    model = trained("digits-mlp")
    with pytest.raises(ConfigError, match="sparsity"):
        prune(model, {"sparsity": 1.5}, pruner="l1norm")
    with pytest.raises(ConfigError, match="spars"):
        prune(model, {"sparsty": 0.5}, pruner="l1norm")
    with pytest.raises(ConfigError, match="layers.9"):
        prune(model, {"sparsity": 0.5, "op_names": ["layers.9"]}, pruner="level")
    with pytest.raises(ConfigError, match="unknown pruner 'magic'"):
        prune(model, {"sparsity": 0.5}, pruner="magic")


def test_from_nni_masks_rejects_unknown_modules(trained):
    model = trained("digits-mlp")
    with pytest.raises(ConfigError, match="layers.7"):
        from_nni_masks(model, {"layers.7": {"weight": torch.ones(3)}})


@pytest.mark.parametrize("name", ["l1norm", "taylor"])
def test_bias_free_convs_regression(trained, digits_task, name):
    # NNI reports a None "bias" mask for conv layers built with bias=False (ResNet/MobileNet style)
    model = trained("digits-resnet")
    table = prune(model, NNIPruneConfig(0.5, exclude_op_names=("fc",), training_steps=4), pruner=name,
                  evaluator=digits_task("digits-resnet"))
    assert table["stem.0.weight"].sparsity == pytest.approx(0.5, abs=0.07)
    assert "stem.0.bias" not in table


def test_slim_factor_is_folded_so_unwrapped_model_matches_nni(trained, digits, digits_task):
    # SlimPruner's wrapped forward computes weight * slim_factor * mask; after our unwrap
    # the plain model with the table's masks applied must compute the same outputs.
    from nni.compression.pruning import SlimPruner

    from sparta_explore import masked_copy
    from sparta_explore.pruners.nni_evaluator import workload_evaluator

    config = NNIPruneConfig(0.5, op_types=("BatchNorm2d",), training_steps=6)
    reference = trained("digits-cnn")
    ours = copy.deepcopy(reference)
    x = digits.test_x[:32]
    torch.manual_seed(0)
    with quiet_nni():
        evaluator = workload_evaluator(reference, digits_task("digits-cnn"))
        pruner = SlimPruner(reference, config.to_config_list(), evaluator, training_steps=6, regular_scale=1.0)
        pruner.compress()
        reference.eval()
        with torch.no_grad():
            expected = reference(x)
        pruner.unwrap_model()
    torch.manual_seed(0)
    table = prune(ours, config, pruner="slim", evaluator=digits_task("digits-cnn"))
    with torch.no_grad():
        got = masked_copy(ours, table).eval()(x)
    assert table["bn1.weight"].sparsity == pytest.approx(0.5, abs=0.07)
    assert torch.allclose(got, expected, atol=1e-4)
