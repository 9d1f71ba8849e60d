"""Validation runs each distinct scenario once, in one pool, costliest first
(:func:`simulator.validation.evaluate.validate_tables`): the de-duplication key never merges
two scenarios that differ in any field, and neither the order runs are handed out in, the
grouping of tables nor the number of workers changes a row."""

from pathlib import Path

import pytest

from simulator.validation import evaluate, load_runs, row_to_scenario
from simulator.validation.evaluate import scenario_cost, scenario_key, validate, validate_tables

REF = Path(__file__).resolve().parents[2] / "experiments" / "reference"
SINGLE = REF / "vtrain" / "ground_truth_single.csv"
FOUNDRY = REF / "published_runs_llmfoundry.csv"
H100 = REF / "published_runs_h100.csv"


def _scenarios():
    """A scenario of each input format, as validation builds them."""
    out = []
    for path in (SINGLE, H100, FOUNDRY):
        row = load_runs(path)[0]
        out.append(row_to_scenario(row, row["_format"])[0])
    return out


def _leaves(v, path=()):
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _leaves(x, path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _leaves(x, path + (i,))
    else:
        yield path, v


def _replaced(v, path, new):
    if not path:
        return new
    if isinstance(v, dict):
        return {k: (_replaced(x, path[1:], new) if k == path[0] else x) for k, x in v.items()}
    return [(_replaced(x, path[1:], new) if i == path[0] else x) for i, x in enumerate(v)]


def _others(v):
    """Values unequal to ``v`` (and of other types) that a field could hold."""
    if isinstance(v, bool):
        return [not v, int(v), str(v)]
    if isinstance(v, int):
        return [v + 1, float(v), str(v), v * 2 + 3]
    if isinstance(v, float):
        return [v * (1 + 1e-15) if v else 5e-324, v + 1, str(v)]
    if isinstance(v, str):
        return [v + "x", v.upper() if v != v.upper() else v.lower() + "_", ""]
    return [0, "None"] if v is None else ["other"]


@pytest.mark.parametrize("index", range(3))
def test_the_key_tells_apart_scenarios_that_differ_in_any_field(index):
    """Every leaf of a real scenario, changed in value or only in type (1 / 1.0 / "1" / True),
    and every key dropped or added, gives another key: de-duplication cannot merge two
    distinct scenarios.  Equal scenarios built apart, or with keys in another order, share it."""
    sc = _scenarios()[index]
    key = scenario_key(sc)
    leaves = list(_leaves(sc))
    assert len(leaves) > 20
    for path, v in leaves:
        for new in _others(v):
            assert new != v or type(new) is not type(v)
            assert scenario_key(_replaced(sc, path, new)) != key, (path, v, new)
    for k in sc:
        assert scenario_key({x: y for x, y in sc.items() if x != k}) != key, k
    assert scenario_key({**sc, "extra": None}) != key
    assert scenario_key(dict(reversed(list(sc.items())))) == key
    assert scenario_key(_scenarios()[index]) == key


def test_the_key_keeps_types_of_mapping_keys_and_sequences():
    assert scenario_key({"slow_gpus": {5: 1.5}}) != scenario_key({"slow_gpus": {"5": 1.5}})
    assert scenario_key({"a": [1, 2]}) != scenario_key({"a": [2, 1]})
    assert scenario_key({"a": [1, 2]}) != scenario_key({"a": (1, 2)})
    assert scenario_key({"a": 0.1 + 0.2}) != scenario_key({"a": 0.3})

    class Opaque:
        def __repr__(self):
            return "same"
    assert scenario_key({"a": Opaque()}) != scenario_key({"a": Opaque()})   # never merged


def _drop_wall(rows):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def test_the_order_runs_are_handed_out_in_does_not_change_a_row(monkeypatch):
    """The same rows from one process in input order, from two workers costliest first, from
    two workers cheapest first, and with two tables validated together rather than apart."""
    alone = [validate(SINGLE, limit=4), validate(FOUNDRY, limit=3)]
    tables = [{"path": SINGLE, "limit": 4}, {"path": FOUNDRY, "limit": 3}]
    together = validate_tables(tables, workers=2)
    monkeypatch.setattr(evaluate, "scenario_cost", lambda sc: -scenario_cost(sc))
    reversed_order = validate_tables(tables, workers=2)
    for rows in (together, reversed_order):
        assert [_drop_wall(r) for r in rows] == [_drop_wall(r) for r in alone]


def test_costliest_runs_are_handed_out_first():
    """Runs are ordered by :func:`scenario_cost`, ties in input order; the H100 set's
    last row (Llama 3.1 405B on 2,304 GPUs) outranks a one-host vTrain run."""
    big = row_to_scenario(load_runs(H100)[-1], "published")[0]
    small = row_to_scenario(load_runs(SINGLE)[0], "vtrain")[0]
    assert scenario_cost(big) > 100 * scenario_cost(small) > 0
    runs = evaluate._Runs(None, 2)
    for i, sc in enumerate((small, big, small, dict(small, num_steps=3))):
        runs.add(sc, (0, i))
    assert runs.order() == [scenario_key(big), scenario_key(dict(small, num_steps=3)), scenario_key(small)]
    assert runs.count[scenario_key(small)] == 2
