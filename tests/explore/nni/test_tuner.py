"""ParetoTuner driven through NNI's Tuner methods, no nnictl: space, seeds, search quality, NNI issue 5726."""

import json
import random
import statistics
from pathlib import Path

import nni
import pytest

from sparta_explore.explore.nni.tuner import ParetoTuner
from sparta_explore.explore.report.pareto import hypervolume
from sparta_explore.explore.search.block_space import BlockSpaceConfig, block_search_space
from sparta_explore.explore.search.dimensions import Space
from sparta_explore.explore.search.pareto_tpe import Evaluated, ParetoTPE, SearchConfig, front_ranks, split_good

ROOT = Path(__file__).resolve().parents[3]

# A synthetic per-layer trade-off: 8 layers with different shares of the work and different
# sensitivities, each pruned to one of six sparsities, plus int8 or fp32. Cost is additive,
# accuracy loss is convex in each layer's sparsity: the front needs the right allocation.
LEVELS = [0.0, 0.2, 0.4, 0.6, 0.8, 0.9]
LAYERS = 8
SYNTHETIC = {f"s{i}": {"_type": "choice", "_value": LEVELS} for i in range(LAYERS)}
SYNTHETIC["bits"] = {"_type": "choice", "_value": [32, 8]}
WORK = [(i % 3 + 1) / 16 for i in range(LAYERS)]
SENSITIVITY = [0.4 * ((i * 5) % LAYERS + 1) / LAYERS for i in range(LAYERS)]
TARGET = 0.3  # a latency ratio bound: the "best model under the target" of the tests


def synthetic(params):
    scale = 0.5 if params["bits"] == 8 else 1.0
    latency_ratio = scale * sum(w * (1 - params[f"s{i}"]) for i, w in enumerate(WORK))
    accuracy = 0.98 - sum(c * params[f"s{i}"] ** 3 for i, c in enumerate(SENSITIVITY))
    accuracy -= 0.02 if params["bits"] == 8 else 0.0
    return {"default": accuracy, "accuracy": accuracy, "latency_ratio": latency_ratio, "nni_params": params}


def drive(tuner, space, budget, objective=synthetic):
    """What NNI's dispatcher does with one trial at a time: generate, run, report, end."""
    tuner.update_search_space(space)
    results = []
    for pid in range(budget):
        params = tuner.generate_parameters(pid)
        result = objective(params)
        tuner.receive_trial_result(pid, params, result)
        tuner.trial_end(pid, True)
        results.append(result)
    return results


def random_search(seed, budget):
    space, rng = Space.from_nni(SYNTHETIC), random.Random(seed)
    return [synthetic(space.sample(rng)) for _ in range(budget)]


def quality(results):
    hv = hypervolume([r["latency_ratio"] for r in results], [r["accuracy"] for r in results], ref=(1.0, 0.0))
    best = max((r["accuracy"] for r in results if r["latency_ratio"] <= TARGET), default=0.0)
    return hv, best


def test_tuner_beats_random_search_on_a_synthetic_trade_off():
    budget, seeds = 30, range(12)
    tuned = [quality(drive(ParetoTuner(seed=s), SYNTHETIC, budget)) for s in seeds]
    rand = [quality(random_search(s, budget)) for s in seeds]
    hv_t, hv_r = statistics.mean(t[0] for t in tuned), statistics.mean(r[0] for r in rand)
    best_t, best_r = statistics.mean(t[1] for t in tuned), statistics.mean(r[1] for r in rand)
    assert hv_t > hv_r, (hv_t, hv_r)
    assert best_t > best_r + 0.03, (best_t, best_r)  # the best model under the latency target


def _plausible(p):  # sparser and int8 are faster, and lose some accuracy; per-layer sparsities averaged
    layers = [v for k, v in p.items() if k.startswith("sparsity")]
    s = sum(layers) / len(layers)
    ratio = (1 - 0.8 * s * (1.0 if p["block"] != "1x32" else 0.6)) * (0.5 if p["bits"] < 32 else 1)
    acc = 0.97 - 0.3 * s ** 4 - (0.01 if p["bits"] == 8 else 0.0)
    return {"accuracy": acc, "latency_ratio": ratio, "nni_params": p}


def test_tuner_exhausts_a_space_without_repeats():
    space = block_search_space(BlockSpaceConfig(per_layer=False))
    parsed = Space.from_nni(space)
    tuner = ParetoTuner(startup=4, seed=3)
    results = drive(tuner, space, int(parsed.size), _plausible)
    seen = [parsed.key_of(r["nni_params"]) for r in results]
    assert all(parsed.contains(r["nni_params"]) for r in results)
    assert len(set(seen)) == len(seen) == parsed.size == 30
    with pytest.raises(nni.NoMoreTrialError):
        tuner.generate_parameters(999)


def test_tuner_stays_in_the_project_search_space():
    space = json.loads((ROOT / "experiments" / "search_space.json").read_text())
    parsed = Space.from_nni(space)
    results = drive(ParetoTuner(startup=4, seed=3), space, 40, _plausible)
    seen = [parsed.key_of(r["nni_params"]) for r in results]
    assert all(parsed.contains(r["nni_params"]) for r in results) and len(set(seen)) == len(seen) == 40
    assert any(k.startswith("sparsity@") for k in results[0]["nni_params"])


def test_same_seed_same_search_and_another_seed_another():
    a = [r["nni_params"] for r in drive(ParetoTuner(seed=7), SYNTHETIC, 12)]
    b = [r["nni_params"] for r in drive(ParetoTuner(seed=7), SYNTHETIC, 12)]
    c = [r["nni_params"] for r in drive(ParetoTuner(seed=8), SYNTHETIC, 12)]
    assert a == b
    assert a != c


def test_results_are_filed_under_the_echoed_parameters_not_the_parameter_id():
    # NNI issue 5726: two concurrent trials swap parameters; each result arrives under the
    # parameter_id of the parameters the trial really ran, and trial_end under the other one.
    space = {"s": {"_type": "choice", "_value": [0.5, 0.9]}, "b": {"_type": "choice", "_value": [32, 8]}}
    tuner = ParetoTuner(startup=2, seed=0)
    tuner.update_search_space(space)
    p0, p1 = tuner.generate_parameters(0), tuner.generate_parameters(1)
    tuner.trial_end(1, True)  # wrong id for the trial that ended: must not disturb anything
    tuner.receive_trial_result(0, p0, {"accuracy": 0.9, "latency_ratio": 0.7, "nni_params": p1})
    tuner.receive_trial_result(1, p1, {"accuracy": 0.8, "latency_ratio": 0.4, "nni_params": p0})
    tuner.trial_end(0, True)
    filed = {json.dumps(e.params, sort_keys=True): (e.value, e.cost) for e in tuner.search.finished}
    assert filed == {json.dumps(p1, sort_keys=True): (0.9, 0.7), json.dumps(p0, sort_keys=True): (0.8, 0.4)}
    assert tuner.mismatches == 2
    assert tuner.generate_parameters(2) not in (p0, p1)


def test_results_without_echo_or_outside_the_space_do_not_crash_the_dispatcher():
    tuner = ParetoTuner(startup=1)
    tuner.update_search_space({"s": {"_type": "choice", "_value": [0.5, 0.9]}})
    p = tuner.generate_parameters(0)
    tuner.receive_trial_result(0, p, {"accuracy": 0.9, "latency_ratio": 0.5})   # no echo: NNI's params
    tuner.receive_trial_result(1, p, {"accuracy": 0.9, "nni_params": {"s": 0.7}})  # not in the space
    tuner.receive_trial_result(2, p, 0.42)  # a bare number: kept, but unranked (no cost)
    assert [e.params for e in tuner.search.finished] == [p, p]
    assert [e.usable for e in tuner.search.finished] == [True, False]


def test_a_new_search_space_keeps_the_results_that_fit_it():
    tuner = ParetoTuner()
    tuner.update_search_space({"s": {"_type": "choice", "_value": [0.5, 0.9]}})
    tuner.import_data([{"parameter": {"s": 0.5}, "value": {"accuracy": 0.9, "latency_ratio": 0.6}},
                       {"parameter": {"s": 0.9}, "value": json.dumps({"accuracy": 0.7, "latency_ratio": 0.3})}])
    tuner.update_search_space({"s": {"_type": "choice", "_value": [0.5, 0.7]}})
    assert [e.params for e in tuner.search.finished] == [{"s": 0.5}]


def test_cost_column_is_configurable_for_flops_guided_search():
    tuner = ParetoTuner(cost="flops_ratio", startup=1)
    tuner.update_search_space({"s": {"_type": "choice", "_value": [0.5, 0.9]}})
    p = tuner.generate_parameters(0)
    tuner.receive_trial_result(0, p, {"accuracy": 0.9, "latency_ratio": 0.9, "flops_ratio": 0.2, "nni_params": p})
    assert tuner.search.finished[0].cost == 0.2


def test_front_ranks_and_good_split_prefer_the_front_and_its_spread():
    pts = [Evaluated({"i": i}, v, c) for i, (v, c) in
           enumerate([(0.95, 0.9), (0.9, 0.5), (0.6, 0.2), (0.85, 0.6), (0.5, 0.5), (0.92, 0.7)])]
    assert front_ranks(pts) == [0, 0, 0, 1, 1, 0]
    good, rest = split_good(pts, 0.5)
    # three of four front points make the good half: the two ends (infinite crowding) first
    assert {p.params["i"] for p in good} <= {0, 1, 2, 5} and {0, 2} <= {p.params["i"] for p in good}
    assert len(good) == 3 and len(rest) == 3


def test_continuous_keys_are_modelled_too():
    space = Space.from_nni({"x": {"_type": "uniform", "_value": [0.0, 1.0]},
                            "lr": {"_type": "loguniform", "_value": [1e-4, 1e-1]}})
    search = ParetoTPE(space, SearchConfig(startup=5, seed=0))
    for _ in range(30):
        p = search.ask()
        assert space.contains(p)
        # the front is x near 0.3 whatever lr: accuracy peaks there at any cost
        search.tell(p, value=1.0 - abs(p["x"] - 0.3), cost=p["lr"] * 10)
    late = [e.params["x"] for e in search.finished[-10:]]
    assert statistics.mean(abs(x - 0.3) for x in late) < 0.2
