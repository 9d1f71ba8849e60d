"""What-ifs (the ``whatif:`` section and ``run(whatif=...)``): validation, folding, seeds, CLI.

The models of time each what-if adds (closed forms, longest paths, re-routing, failures)
are tested in ``test_whatif_models.py``.
"""

from __future__ import annotations

import pytest
import yaml

from simulator.cli import main
from simulator.engine import run
from simulator.scenario import load_scenario
from simulator.engine import JobStopped, expected_max_lognormal
from simulator.scenario import WhatIf
from tests.simulator.test_fold import assert_same_run
from topologies import ConfigError

#: 32 GPUs on 4 DGX hosts, 2 hosts per leaf: DP and PP traffic crosses the spines.
SMALL = {"model": {"preset": "tiny-dense", "num_layers": 4},
         "cluster": {"preset": "dgx-h100", "num_nodes": 4, "hosts_per_leaf": 2},
         "parallel": {"tp": 2, "pp": 2, "dp": 8, "global_batch_size": 16, "seq_len": 512},
         "num_steps": 2, "host": "none"}


def with_whatif(wi: dict, base: dict = SMALL, **kw) -> dict:
    return {**base, "whatif": wi, **kw}


# -- validation --------------------------------------------------------------------------------------
@pytest.mark.parametrize("wi, field", [
    ({"slow_gpu": {1: 1.5}}, "whatif.slow_gpu"),                                   # unknown key
    ({"slow_gpus": {32: 1.5}}, "whatif.slow_gpus"),                                 # GPUs 0..31
    ({"slow_gpus": {1: 0}}, "whatif.slow_gpus.1"),
    ({"slow_gpus": {1: -2.0}}, "whatif.slow_gpus.1"),
    ({"slow_gpus": {1: {"compute": 1.2, "nic": 0}}}, "whatif.slow_gpus.1.nic"),
    ({"slow_gpus": {1: {"memory": 2}}}, "whatif.slow_gpus.1.memory"),
    ({"slow_ranks": {40: 1.2}}, "whatif.slow_ranks"),
    ({"jitter": {"scope": "layer", "dist": "lognormal(0, 0.1)"}}, "whatif.jitter[0].scope"),
    ({"jitter": {"scope": "op", "dist": "normal(0, 0.1)"}}, "whatif.jitter[0].dist"),
    ({"jitter": {"scope": "op", "dist": "lognormal(0, -1)"}}, "whatif.jitter[0].dist"),
    ({"jitter": {"scope": "op", "dist": "bernoulli_stall(1.5, 0.01)"}}, "whatif.jitter[0].dist"),
    ({"jitter": {"scope": "op", "dist": "lognormal(0, 0.1)", "gpus": [3, 99]}}, "whatif.jitter[0].gpus"),
    ({"thermal": {"factor": 1.2}}, "whatif.thermal[0].start_s"),
    ({"thermal": {"factor": 1.2, "start_step": 2}}, "whatif.thermal[0].start_step"),    # num_steps 2
    ({"thermal": {"factor": 0, "start_s": 0.1}}, "whatif.thermal[0].factor"),
    ({"degraded_links": [{"link": ["leaf0.0", "spine9.9"], "bandwidth_factor": 0.5}]},
     "whatif.degraded_links[0].link"),
    ({"degraded_links": [{"link": ["leaf0.0", "spine0.0"], "bandwidth_factor": 0}]},
     "whatif.degraded_links[0].bandwidth_factor"),
    ({"degraded_links": [{"link": ["leaf0.0", "spine0.0"], "extra_latency": "-1 us"}]},
     "whatif.degraded_links[0].extra_latency"),
    ({"failed_links": [["nic0.0", "leaf0.0"]]}, "whatif.failed_links[0]"),               # a NIC: failed_nics
    ({"failed_links": [["gpu0", "nvsw0"]]}, "whatif.failed_links[0]"),                   # NVLink: not modelled
    ({"failed_links": [["leaf0.0", "leaf0.1"]]}, "whatif.failed_links[0]"),             # no such link
    ({"failed_nics": ["nic7.0"]}, "whatif.failed_nics[0].nic"),                         # 4 hosts
    ({"failed_nics": [{"gpu": 99}]}, "whatif.failed_nics[0].gpu"),
    ({"degraded_nics": [{"nic": "nic0.9", "bandwidth_factor": 0.5}]}, "whatif.degraded_nics[0].nic"),
    ({"nic_failover": "yes"}, "whatif.nic_failover"),
    ({"placement": [0, 1, 2]}, "whatif.placement"),
])
def test_bad_whatifs_name_the_field(wi, field):
    with pytest.raises(ConfigError) as e:
        load_scenario(with_whatif(wi))
    assert e.value.field == field, str(e.value)


def test_the_python_api_validates_like_the_yaml():
    with pytest.raises(ConfigError, match="whatif.slow_gpus"):
        run(SMALL, whatif={"slow_gpus": {99: 1.5}})
    with pytest.raises(ConfigError, match="whatif.slow_gpus"):
        run(SMALL, whatif=WhatIf(slow_gpus={99: 1.5}))


def test_whatif_round_trips_through_its_yaml_form():
    wi = {"slow_gpus": {3: 1.5, 5: {"compute": 1.2, "nic": 2.0}}, "slow_ranks": {7: 1.1},
          "jitter": [{"scope": "gpu_step", "dist": "lognormal(0.0, 0.1)", "gpus": "all"},
                     {"scope": "op", "dist": "bernoulli_stall(0.01, 0.002)", "gpus": [1, 2]}],
          "thermal": [{"factor": 1.3, "gpus": [4], "start_s": 0.5}],
          "degraded_links": [{"link": ["leaf0.0", "spine0.1"], "bandwidth_factor": 0.5, "extra_latency": 5e-6}],
          "failed_links": [["leaf0.1", "spine0.0"]],
          "degraded_nics": [{"nic": "nic1.2", "bandwidth_factor": 0.5, "extra_latency": 0.0}],
          "failed_nics": [{"nic": "nic2.0", "at_s": 0.0}], "nic_failover": "pxn"}
    w = WhatIf.from_dict(wi)
    assert WhatIf.from_dict(w.to_dict()) == w
    load_scenario(with_whatif(w.to_dict()))             # valid on the cluster too
    assert WhatIf.from_dict({}).empty and not w.empty


def test_the_stable_simple_form_slows_one_gpu():
    sc = load_scenario(with_whatif({"slow_gpus": {17: 1.5}}))
    assert sc.whatif.slow_gpus == {17: 1.5}
    base, slow = run(SMALL), run(sc)
    assert slow.metrics["step_time_s"] > base.metrics["step_time_s"]


# -- folding stays exact -------------------------------------------------------------------------------
WHATIFS = [
    pytest.param({"slow_gpus": {3: 1.5}}, id="slow_gpu"),
    pytest.param({"slow_ranks": {9: 1.3}, "placement": list(range(31, -1, -1))}, id="slow_rank-reversed_placement"),
    pytest.param({"slow_gpus": {3: {"compute": 1.2, "nic": 4.0}}}, id="slow_gpu_and_nic"),
    pytest.param({"jitter": {"scope": "gpu_step", "dist": "lognormal(0, 0.1)"}}, id="gpu_step_jitter"),
    pytest.param({"jitter": {"scope": "op", "dist": "lognormal(0, 0.2)", "gpus": [0, 1, 17]}}, id="op_jitter"),
    pytest.param({"jitter": {"scope": "host_step", "dist": "bernoulli_stall(0.5, 1e-4)"}}, id="host_stall"),
    pytest.param({"thermal": {"factor": 1.3, "start_s": 5e-4, "gpus": [8, 9]}}, id="thermal"),
    pytest.param({"degraded_links": [{"link": ["leaf0.0", "spine0.0"], "bandwidth_factor": 0.25,
                                      "extra_latency": "5 us"}]}, id="degraded_link"),
    pytest.param({"failed_links": [["leaf0.0", "spine0.0"]]}, id="failed_link"),
    pytest.param({"degraded_nics": [{"gpu": 9, "bandwidth_factor": 0.3}]}, id="degraded_nic"),
    pytest.param({"failed_nics": ["nic0.0"], "nic_failover": "pxn"}, id="failed_nic_pxn"),
]


@pytest.mark.parametrize("wi", WHATIFS)
def test_folded_equals_unfolded_under_whatifs(wi):
    """Every what-if is part of the refinement: the folded run equals the unfolded run op
    for op and link for link."""
    sc = with_whatif(wi)
    folded, unfolded = run(sc), run(sc, fold=False)
    assert_same_run(folded, unfolded, str(wi))


def test_a_whatif_on_one_rank_splits_only_the_cells_it_touches():
    """DP 32 x PP 2 (128 GPUs folds to 2 cells); one slow GPU leaves at most 1/8 of the
    world as cells, and degrading one spine link adds no rank cell beyond those it touches."""
    big = {**SMALL, "cluster": {"preset": "dgx-h100", "num_nodes": 16, "hosts_per_leaf": 8},
           "parallel": {"tp": 2, "pp": 2, "dp": 32, "global_batch_size": 64, "seq_len": 512}, "num_steps": 1}
    base = run(big)
    slow = run(with_whatif({"slow_gpus": {77: 1.2}}, big))
    assert base.metrics["fold"]["rank_cells"] == 2
    assert 2 < slow.metrics["fold"]["rank_cells"] <= 128 // 8
    assert (77,) in slow.folding.cells


# -- seeds ---------------------------------------------------------------------------------------------
def test_same_seed_same_results_different_seed_different():
    wi = {"jitter": [{"scope": "op", "dist": "lognormal(0, 0.2)", "gpus": [0, 5]},
                     {"scope": "gpu_step", "dist": "bernoulli_stall(0.3, 1e-4)"}]}
    a, b = run(with_whatif(wi, seed=1)), run(with_whatif(wi, seed=1))
    c = run(with_whatif(wi, seed=2))
    assert a.timeline.equals(b.timeline)
    assert a.metrics["step_time_s"] == b.metrics["step_time_s"]
    assert not a.timeline.equals(c.timeline)
    assert a.metrics["step_time_s"] != c.metrics["step_time_s"]


def test_expected_max_of_lognormal_draws():
    # n = 1: the lognormal mean exp(mu + sigma^2 / 2); n = 2: exp(mu + s^2/2) * 2 Phi(s / sqrt 2)
    import math
    assert expected_max_lognormal(1, 0.1, 0.5) == pytest.approx(math.exp(0.1 + 0.125), rel=1e-9)
    s = 0.5
    phi = 0.5 * (1 + math.erf(s / math.sqrt(2) / math.sqrt(2)))
    assert expected_max_lognormal(2, 0.0, s) == pytest.approx(math.exp(s * s / 2) * 2 * phi, rel=1e-9)


# -- CLI -------------------------------------------------------------------------------------------------
def test_cli_bad_whatif_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(with_whatif({"slow_gpus": {1: 0}})))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "whatif.slow_gpus.1" in err and "> 0" in err


def test_cli_reports_a_job_stopped_by_a_failed_nic(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(with_whatif({"failed_nics": ["nic1.3"]})))
    assert main(["run", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "job stopped at t =" in err and "nic1.3" in err and "gpu11" in err
    with pytest.raises(JobStopped):
        run(with_whatif({"failed_nics": ["nic1.3"]}))


# -- cp_mla_latent: the CP exchange of an MLA model carries the latent ---------------------------------
#: DeepSeek-V3's MLA (two dense layers, no MTP) at 32k tokens, TP 2 x CP 8 on 2 DGX H100: the CP
#: ring crosses InfiniBand and its exposed hops are the biggest part of the step.
MLA_CP = {"model": {"preset": "deepseek-v3", "num_layers": 2, "mtp_layers": 0, "moe": None},
          "cluster": {"preset": "dgx-h100", "num_nodes": 2},
          "parallel": {"tp": 2, "cp": 8, "dp": 1, "micro_batch_size": 1, "global_batch_size": 1, "seq_len": 32768,
                       "sequence_parallel": True},
          "num_steps": 2}


def test_cp_mla_latent_bytes_per_token_are_the_closed_form():
    from workloads import load_model
    from workloads.stacks.megatron_te.context_parallel import mla_cp_bytes_per_token
    m = load_model("deepseek-v3")
    a = m.mla
    # the preset's dims (config.json): 128 heads, q/k head 128 + 64 RoPE, v 128, latent 512
    assert (m.num_attention_heads, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim, a.kv_lora_rank) == \
        (128, 128, 64, 128, 512)
    assert mla_cp_bytes_per_token(m, 1) == (128 * (192 + 128) * 2, (512 + 64) * 2) == (81920, 1152)
    assert mla_cp_bytes_per_token(m, 2) == (64 * (192 + 128) * 2, 1152)       # the latent is not split over TP


def test_cp_mla_latent_shrinks_the_ring_counts_the_up_projection_and_speeds_a_cp_bound_step():
    from workloads.program import build_program
    sc = load_scenario(MLA_CP)
    progs = [build_program(sc.model, sc.parallel, sc.cluster.gpu, cp_mla_latent=x) for x in (False, True)]
    hop = [sum(o.size_bytes for o in p.classes[0].ops if o.name in ("cp_hop", "cp_hop_bwd")) for p in progs]
    assert hop[0] / hop[1] == pytest.approx((64 * 320 * 2) / 1152)
    # the extra work: 7 received chunks of 4,096 tokens up-projected per layer, forward once
    # and backward three times (again, dgrad, wgrad): 2 T r (heads/tp)(nope + v) FLOPs each
    up = [o for o in progs[1].classes[0].ops if o.name in ("cp_latent_up", "cp_latent_up_bwd")]
    gemm = 2 * 4096 * 512 * 64 * (128 + 128)
    assert sum(o.flops for o in up) == pytest.approx(2 * 7 * (1 + 3) * gemm)
    assert not any(o.name.startswith("cp_latent") for o in progs[0].classes[0].ops)
    base = run(MLA_CP)
    what = run(with_whatif({"cp_mla_latent": True}, MLA_CP))
    assert base.metrics["breakdown_s"]["exposed_cp"] > 0.3 * base.metrics["step_time_s"]     # CP-bound
    assert what.metrics["step_time_s"] < 0.7 * base.metrics["step_time_s"]
    line = what.metrics["whatif"][0]
    assert "what-if" in line and "no framework" in line and "1,152 B" in line and "40,960 B" in line
    # given to run() instead of the scenario: the same program, the same label
    kw = run(MLA_CP, whatif={"cp_mla_latent": True})
    assert kw.metrics["step_time_s"] == what.metrics["step_time_s"] and kw.metrics["whatif"] == [line]


@pytest.mark.parametrize("patch, needle", [
    ({"model": {"preset": "llama3-8b", "num_layers": 2}}, "multi-head latent attention"),
    ({"parallel": {**MLA_CP["parallel"], "cp": 1, "dp": 8, "global_batch_size": 8}}, "parallel.cp > 1"),
    ({"parallel": {**MLA_CP["parallel"], "cp_comm_type": "a2a"}}, "splits heads"),
])
def test_cp_mla_latent_is_refused_where_it_does_not_apply(patch, needle):
    with pytest.raises(ConfigError, match="whatif.cp_mla_latent") as err:
        load_scenario(with_whatif({"cp_mla_latent": True}, {**MLA_CP, **patch}))
    assert needle in str(err.value)
    with pytest.raises(ConfigError, match="must be true or false"):
        load_scenario(with_whatif({"cp_mla_latent": "yes"}, MLA_CP))
