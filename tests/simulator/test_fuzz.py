"""Random small scenarios: valid ones run and keep their invariants, invalid ones raise ConfigError."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from simulator.engine import run
from topologies import ConfigError

# valid values dominate (repeated), a few invalid ones stay in to exercise the errors
layouts = st.fixed_dictionaries({
    "tp": st.sampled_from([1, 2, 4, 2, 4, 3]),
    "pp": st.sampled_from([1, 2, 4, 2]),
    "dp": st.sampled_from([-1, -1, -1, 1, 2]),
    "micro_batch_size": st.sampled_from([1, 1, 2]),
    "global_batch_size": st.sampled_from([8, 16, 16, 6]),
    "seq_len": st.sampled_from([256, 512, 256, 500]),
    "schedule": st.sampled_from(["1f1b", "gpipe", "zb_h1", "interleaved_1f1b", "dualpipe"]),
    "vpp": st.sampled_from([1, 2]),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "sequence_parallel": st.booleans(),
})


def _check(par, model, nodes, tidy=False, unfold=False):
    if tidy:        # most draws: a layout that can be valid (dp fills the cluster, vpp fits the schedule)
        par = {**par, "dp": -1, "vpp": 2 if par["schedule"] == "interleaved_1f1b" else 1}
    sc = {"model": model, "cluster": {"preset": "dgx-h100", "num_nodes": nodes}, "parallel": par, "num_steps": 1}
    try:
        res = run(sc)
    except ConfigError:
        return
    m = res.metrics
    assert m["step_time_s"] > 0
    assert abs(sum(m["breakdown_s"].values()) - m["step_time_s"]) <= 1e-9 * m["step_time_s"]
    net = res.network
    busy = net.link_busy_s > 0
    # no link above capacity on average over its busy time
    assert np.all(net.link_bytes[busy] / net.link_busy_s[busy] <= net.capacity[busy] * (1 + 1e-6))
    tl = res.timeline
    assert (tl["end_s"] >= tl["start_s"]).all()
    if unfold:
        ref = run(sc, fold=False)
        assert abs(ref.metrics["step_time_s"] - m["step_time_s"]) <= 1e-9 * m["step_time_s"]
        np.testing.assert_allclose(ref.network.link_bytes, net.link_bytes, rtol=1e-9, atol=1e-3)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts, st.sampled_from(["tiny-dense", "tiny-moe"]), st.sampled_from([1, 2]), st.integers(0, 3))
def test_random_small_scenarios(par, model, nodes, tidy):
    _check(par, model, nodes, tidy > 0)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts, st.sampled_from(["tiny-dense", "tiny-moe"]), st.sampled_from([1, 2]), st.integers(0, 3))
def test_random_small_scenarios_many(par, model, nodes, tidy):
    """Also: the unfolded run gives the folded step time (folding is exact)."""
    _check(par, model, nodes, tidy > 0, unfold=True)
