"""The estimator against the engine on the context-parallel variants."""

import pytest

from simulator import run
from simulator.explore.estimate import estimate

BASE = {"model": {"preset": "llama3-8b", "num_layers": 4}, "cluster": {"preset": "dgx-h100", "num_nodes": 2},
        "num_steps": 2, "host": "none", "overlap": {"comm_slowdown": False}}


@pytest.mark.parametrize("extra", [{"cp_comm_type": "p2p"}, {"cp_comm_type": "all_gather"}, {"cp_comm_type": "a2a"},
                                   {"cp_comm_type": "a2a+p2p", "hierarchical_context_parallel_sizes": [2, 2]},
                                   {"cp_comm_type": "p2p", "cp_split": "sequential"}],
                         ids=["p2p", "all_gather", "a2a", "a2a+p2p", "p2p-sequential"])
def test_estimate_tracks_the_engine_on_cp_variants(extra):
    """CP 4 across two hosts (the ring crosses them): the estimate (no contention, no
    compute slowdown -- switched off here) within 3 % of the engine."""
    par = {"tp": 2, "cp": 4, "pp": 1, "dp": 2, "global_batch_size": 4, "seq_len": 32768,
           "sequence_parallel": True, **extra}
    sc = {**BASE, "parallel": par}
    assert estimate(sc)["step_time_s"] == pytest.approx(run(sc).metrics["step_time_s"], rel=0.03)
