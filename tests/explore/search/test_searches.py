"""The protocol's searches: each proposes points of the space and sees only its own cost."""

import math

import pytest

from sparta_explore.errors import ConfigError
from sparta_explore.explore.search.dimensions import Space
from sparta_explore.explore.search.searches import SEARCHES, make_search

SPACE = {"s": {"_type": "choice", "_value": [0.5, 0.7, 0.8, 0.9, 0.95]},
         "p": {"_type": "choice", "_value": ["a", "b", "c"]},
         "q": {"_type": "choice", "_value": [32, 8]}}


def row_of(point):
    # latency and FLOPs disagree on purpose: "q"=8 is fast but FLOPs cannot see it, "c" looks cheap to FLOPs only
    s = point["s"]
    return {"accuracy": 1.0 - 0.3 * s ** 4 - (0.01 if point["q"] == 8 else 0.0),
            "latency_ratio": (0.5 if point["q"] == 8 else 1.0) * (1.0 - 0.5 * s),
            "flops_ratio": (0.5 if point["p"] == "c" else 1.0) * (1.0 - s)}


def drive(name, seed, start, budget):
    search = make_search(name, SPACE, seed=seed, startup=len(start), target=0.25)
    for p in start:
        search.observe(p, row_of(p))
    made = []
    for _ in range(budget):
        p = search.propose()
        search.observe(p, row_of(p))
        made.append(p)
    return search, made


START = [{"s": 0.5, "p": "a", "q": 32}, {"s": 0.9, "p": "c", "q": 32}, {"s": 0.7, "p": "b", "q": 8}]


@pytest.mark.parametrize("name", list(SEARCHES))
def test_proposals_are_new_points_of_the_space_and_repeatable(name):
    space = Space.from_nni(SPACE)
    _, made = drive(name, 3, START, 10)
    keys = [space.key_of(p) for p in made]
    assert all(space.contains(p) for p in made)
    assert len(set(keys)) == len(keys) and not set(keys) & {space.key_of(p) for p in START}
    _, again = drive(name, 3, START, 10)
    assert again == made  # same seed, same tells: the protocol resumes by replaying


def test_pareto_searches_see_only_their_own_cost():
    lat, _ = drive("latency", 0, START, 2)
    flo, _ = drive("flops", 0, START, 2)
    assert [e.cost for e in lat.tpe.finished[:3]] == [row_of(p)["latency_ratio"] for p in START]
    assert [e.cost for e in flo.tpe.finished[:3]] == [row_of(p)["flops_ratio"] for p in START]


def test_nni_tpe_maximizes_the_mnas_reward_of_its_own_cost():
    search = make_search("tpe-flops", SPACE, seed=0, startup=3, target=0.25)
    row = row_of(START[1])
    assert search._reward(row) == pytest.approx(row["accuracy"] * (row["flops_ratio"] / 0.25) ** -0.07)
    other = make_search("tpe-latency", SPACE, seed=0, startup=3, target=0.25)
    assert other._reward(row) == pytest.approx(row["accuracy"] * (row["latency_ratio"] / 0.25) ** -0.07)


@pytest.mark.parametrize("name", list(SEARCHES))
def test_failed_trials_are_told_as_failures_and_the_search_goes_on(name):
    search = make_search(name, SPACE, seed=1, startup=2, target=0.25)
    for p in START[:2]:
        search.observe(p, {"accuracy": math.nan, "latency_ratio": None, "flops_ratio": None})
    for _ in range(3):
        p = search.propose()
        search.observe(p, {"accuracy": None, "latency_ratio": math.nan, "flops_ratio": math.nan})
    assert Space.from_nni(SPACE).contains(search.propose())


def test_unknown_search_names_the_registered_ones():
    with pytest.raises(ConfigError, match="unknown search 'grid'; registered: latency, flops, tpe-latency, tpe-flops"):
        make_search("grid", SPACE, seed=0)


def useless_when_fast(point):
    # "c" halves the latency and breaks the model: non-dominated on cost, useless to anyone
    row = row_of(point)
    if point["p"] == "c":
        return {**row, "accuracy": 0.1, "latency_ratio": 0.1 * row["latency_ratio"]}
    return row


def test_the_accuracy_floor_keeps_the_search_off_fast_useless_models():
    def useless_share(floor):
        count = 0
        for seed in range(4):
            search = make_search("latency", SPACE, seed=seed, startup=3, floor=floor)
            for p in START:
                search.observe(p, useless_when_fast(p))
            for _ in range(12):
                p = search.propose()
                search.observe(p, useless_when_fast(p))
                count += p["p"] == "c"
        return count / 48
    assert make_search("flops", SPACE, seed=0, floor=0.88).tpe.config.value_floor == 0.88
    assert useless_share(0.5) < useless_share(None)
