"""Scenario loading: the contract's sections, cross-section rules, clear errors."""

from pathlib import Path

import pytest

from simulator.scenario import load_scenario
from topologies import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "experiments" / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_canonical_scenarios_load(path):
    sc = load_scenario(path)
    assert sc.parallel.world_size == sc.cluster.num_gpus


BASE = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
        "parallel": {"tp": 2, "dp": -1, "global_batch_size": 8}}


@pytest.mark.parametrize("patch, field", [
    ({"bogus": 1}, "scenario.bogus"),
    ({"parallel": {"tp": 2, "dp": 2}}, "parallel"),                       # 4 ranks on 8 GPUs
    ({"precision": "nvfp4"}, "precision"),                                 # needs Blackwell
    ({"whatif": {"slow_gpus": {8: 1.5}}}, "whatif.slow_gpus"),            # GPUs 0..7
    ({"overlap": {"tp_comm": "yes"}}, "overlap.tp_comm"),
    ({"grad_reduce_dtype": "fp64"}, "grad_reduce_dtype"),
    ({"overlap": {"everything": True}}, "overlap.everything"),
    ({"num_steps": 0}, "scenario.num_steps"),
    ({"moe_routing": "uniform"}, "scenario.moe_routing"),
])
def test_cross_section_rules(patch, field):
    with pytest.raises(ConfigError) as e:
        load_scenario({**BASE, **patch})
    assert e.value.field == field


def test_dp_rest_is_resolved_against_the_cluster():
    assert load_scenario(BASE).parallel.dp == 4
