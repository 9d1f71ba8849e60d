"""Configuration search: candidates, screening, the closed-form estimate against the engine."""

import json
import math
import time

import numpy as np
import pytest
import yaml

from simulator.cli import main
from simulator.engine import run
from simulator.explore.estimate import estimate
from simulator.explore.search import SearchSpec, candidates, pareto_mask, screen, search
from simulator.explore.sweep import LocalExecutor, Store
from tests.experiment_scripts import load_experiment
from topologies import ConfigError

TINY8 = {"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "global_batch_size": 16,
         "seq_len": 1024}
CASE = {"preset": "dgx-h100", "num_nodes": 8, "hosts_per_rack": 1, "xrack_bandwidth_per_host": "25 GB/s"}


def _case(dp, pp, tp, xrack="25 GB/s"):
    return {"model": "llama3-70b", "cluster": {**CASE, "xrack_bandwidth_per_host": xrack},
            "parallel": {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": 1, "global_batch_size": 128,
                         "seq_len": 4096, "recompute": "full", "zero_stage": 1, "distributed_optimizer": True}}


def test_candidates_cover_every_factorisation_and_respect_fixed_and_bounds():
    spec = SearchSpec.from_dict({**TINY8, "fixed": {"schedule": "1f1b", "recompute": "full", "zero_stage": 1,
                                                    "micro_batch_size": 1}})
    cands = candidates(spec)
    shapes = {(c["tp"], c["pp"], c["dp"]) for c in cands}
    # tiny-dense: 8 heads, 4 layers; tp <= 8 (one NVLink domain), pp | 4, dp = 8 / (tp pp)
    assert shapes == {(tp, pp, 8 // (tp * pp)) for tp in (1, 2, 4, 8) for pp in (1, 2, 4) if 8 % (tp * pp) == 0}
    assert all(c["schedule"] == "1f1b" and c["recompute"] == "full" for c in cands)
    assert all(c["sequence_parallel"] == (c["tp"] > 1) for c in cands)
    bounded = candidates(SearchSpec.from_dict({**TINY8, "bounds": {"tp": [2, 4], "pp": [2, 2]}}))
    assert {c["tp"] for c in bounded} == {2, 4} and {c["pp"] for c in bounded} == {2}
    assert {c["schedule"] for c in bounded} == {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "dualpipe", "zb_v"}
    assert {c["vpp"] for c in bounded if c["schedule"] == "interleaved_1f1b"} == {2, 4}
    assert {c["vpp"] for c in bounded if c["schedule"] == "zb_v"} == {2}


@pytest.mark.parametrize("bad, field", [({"fixed": {"warp": 2}}, "search.fixed.warp"),
                                        ({"bounds": {"tp": [4, 2]}}, "search.bounds.tp"),
                                        ({"bounds": {"schedule": [1, 2]}}, "search.bounds.schedule"),
                                        ({"simulate": -1}, "search.simulate"),
                                        ({"global_batch_size": 0}, "search.global_batch_size"),
                                        ({"colour": 1}, "search.colour")])
def test_bad_search_specs_name_the_field(bad, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        SearchSpec.from_dict({**TINY8, **bad})


def test_screen_marks_invalid_and_out_of_memory_with_reasons():
    spec = SearchSpec.from_dict({"model": "llama3-70b", "cluster": CASE, "global_batch_size": 128,
                                 "seq_len": 4096, "fixed": {"micro_batch_size": 1, "schedule": "1f1b",
                                                            "recompute": "full", "zero_stage": 1}})
    table = screen(spec, candidates(spec))
    assert set(table["status"]) == {"ok", "oom", "invalid"}
    # TP 16 (64 heads divide it) is tried and rejected by the placement rule, naming it
    bad = table[table["status"] == "invalid"]
    assert set(bad["tp"]) == {16} and bad["reason"].str.contains("tp_within_nvlink_domain").all()
    oom = table[table["status"] == "oom"]
    assert (oom["memory_gb"] > 80 * 2**30 / 1e9).all() and oom["reason"].str.len().min() > 0
    # tp=1 pp=1 holds the whole 70B model per GPU: out of memory
    assert "oom" in set(table[(table.tp == 1) & (table.pp == 1)]["status"])
    ok = table[table["status"] == "ok"]
    assert ok["est_step_s"].gt(0).all()
    dualpipe = screen(SearchSpec.from_dict({**TINY8, "fixed": {"schedule": "dualpipe", "pp": 2,
                                                               "micro_batch_size": 4, "tp": 1}}),
                      [{"tp": 1, "cp": 1, "pp": 2, "dp": 4, "ep": 1, "micro_batch_size": 4, "schedule": "dualpipe",
                        "vpp": 1, "recompute": "full", "zero_stage": 1}])
    assert dualpipe["status"][0] == "invalid" and "num_microbatches" in dualpipe["reason"][0]


@pytest.mark.parametrize("shape, xrack, tol", [((8, 1, 8), "25 GB/s", 0.03), ((1, 8, 8), "25 GB/s", 0.05),
                                               ((8, 1, 8), "200 GB/s", 0.06), ((4, 2, 8), "25 GB/s", 0.05)])
def test_estimate_tracks_the_engine_on_the_case_study(shape, xrack, tol):
    """The estimate has no contention between different collectives; on the case study it
    is within a few per cent (the DP reduction of the 8 TP peers sharing one host's
    cross-rack link is what it must get right).  At TP 8 it is the slower one (+2.3 % and
    +5.2 %): it floors each schedule action at the eager host's time to issue it, where the
    engine lets the host run ahead across actions, and with the backward's input re-gather
    overlapping the dgrad a TP-8 backward takes the GPU less than its issue time."""
    sc = {**_case(*shape, xrack), "num_steps": 2}
    est = estimate(sc)["step_time_s"]
    sim = run(sc).metrics["step_time_s"]
    assert est == pytest.approx(sim, rel=tol)


def test_an_estimator_refuses_another_cluster():
    from simulator.explore.estimate import Estimator
    from simulator.scenario import load_scenario
    a = load_scenario({**_case(8, 1, 8), "num_steps": 1})
    b = load_scenario({**_case(8, 1, 8, "200 GB/s"), "num_steps": 1})
    est = Estimator(a.cluster)
    assert est.estimate(load_scenario({**_case(8, 1, 8), "num_steps": 1}))["step_time_s"] > 0   # an equal cluster
    with pytest.raises(ValueError, match="cluster"):
        est.estimate(b)


def test_pareto_mask():
    import pandas as pd
    df = pd.DataFrame({"m": [1, 2, 3, 2, 4], "t": [5, 4, 4, 6, 1]})
    assert pareto_mask(df, "m", "t").tolist() == [True, True, False, False, True]


@pytest.mark.slow
def test_estimate_ranks_200_candidates_like_the_simulator(capsys):
    """Spearman rank correlation >= 0.9 between estimate and simulation on 200 feasible
    layouts (a 16-GPU, 2-host search space of a small Llama, every knob free).  The layouts
    and runs are experiments/docs_figures.py's, which quotes the figures in the docs."""
    figures = load_experiment("docs_figures")
    est, sims = figures.estimate_against_simulation(200)
    assert len(est) == 200
    rho = figures.rank_correlation(est, sims)
    with capsys.disabled():
        print(f"\nestimate vs simulation on 200 candidates: Spearman {rho:.3f}, "
              f"median |est/sim - 1| {np.median(np.abs(est / sims - 1)):.1%}")
    assert rho >= 0.9


@pytest.mark.slow
def test_simulating_the_best_ten_percent_finds_the_brute_force_best(tmp_path):
    spec = {**TINY8, "fixed": {"recompute": "selective", "zero_stage": 1}}
    brute = search(SearchSpec.from_dict({**spec, "simulate": "all"}), executor=LocalExecutor(2),
                   store=Store(tmp_path / "all.sqlite"), progress=False)
    table = brute["table"]
    n_ok = brute["counts"]["ok"]
    assert brute["counts"]["simulated"] == n_ok >= 30
    best = table.iloc[0]
    k = max(1, n_ok // 10)
    top = search(SearchSpec.from_dict({**spec, "simulate": k}), executor=LocalExecutor(2),
                 store=Store(tmp_path / "top.sqlite"), progress=False)["table"]
    assert top.iloc[0]["sim_step_s"] == pytest.approx(best["sim_step_s"], rel=1e-12)


def test_cli_search_json_and_plot(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({**TINY8, "fixed": {"recompute": "full", "zero_stage": 1, "schedule": "1f1b",
                                                   "micro_batch_size": 1}, "simulate": 3}))
    png = tmp_path / "s.png"
    rc = main(["search", str(spec), "--json", "--top", "5", "--workers", "1", "--plot", str(png),
               "--db", str(tmp_path / "s.sqlite")])
    assert rc == 0 and png.stat().st_size > 10_000
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 5 and [r["rank"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["source"] for r in rows] == ["sim"] * 3 + ["est"] * 2
    simulated = [r["sim_step_time_s"] for r in rows if r["sim_step_time_s"] is not None]
    assert len(simulated) == 3 and simulated == sorted(simulated)
    # each row's step time is the number it is ranked by, from the source it names
    assert all(r["step_time_s"] == r[f"{r['source']}_step_time_s"] and r["mfu"] == r[f"{r['source']}_mfu"]
               for r in rows)
    assert {"tp", "pp", "dp", "schedule"} <= set(rows[0]["parallel"])
    assert all(not math.isnan(r["est_step_time_s"]) for r in rows)


def _ranked(tmp_path, simulate=3):
    spec = SearchSpec.from_dict({**TINY8, "fixed": {"recompute": "full", "zero_stage": 1, "micro_batch_size": 1},
                                 "simulate": simulate})
    return search(spec, executor=LocalExecutor(1), store=Store(tmp_path / f"r{simulate}.sqlite"), progress=False)


def test_one_ranking_simulated_first_then_estimates_each_number_marked(tmp_path):
    """Rank 1..n over the feasible candidates: the simulated ones by simulated step time,
    then the estimate-only ones by estimate, each row's step_s / mfu from its ``source``;
    the plot marks the same #1 and names each tp x pp once in its legend."""
    from simulator.explore.search import plot_search
    out = _ranked(tmp_path)
    t = out["table"]
    ok = t[t["rank"] > 0]
    assert list(ok["rank"]) == list(range(1, len(ok) + 1)) and (t.loc[t["status"] != "ok", "rank"] == 0).all()
    sim, est = ok[ok["source"] == "sim"], ok[ok["source"] == "est"]
    assert len(sim) == 3 and sim.index.max() < est.index.min()
    assert list(sim["step_s"]) == sorted(sim["step_s"]) and (sim["step_s"] == sim["sim_step_s"]).all()
    assert list(est["step_s"]) == sorted(est["step_s"]) and (est["step_s"] == est["est_step_s"]).all()
    assert est["sim_step_s"].isna().all() and (est["mfu"] == est["est_mfu"]).all()
    # an estimate-only candidate with a smaller number than #1 may exist; it still ranks below
    drawn = plot_search(t, tmp_path / "p.png", hbm_gb=80)
    first = t.iloc[0]
    assert drawn["best"]["step_s"] == first["step_s"] and drawn["best"]["source"] == "sim"
    assert all(drawn["best"][k] == first[k] for k in ("tp", "pp", "dp", "schedule", "micro_batch_size"))
    labels = drawn["legend"]
    assert len(labels) == len(set(labels))
    assert sum(lbl.startswith("tp·pp") for lbl in labels) == (ok["tp"] * ok["pp"]).nunique()
    # nothing simulated: a plot of estimates, its #1 marked as an estimate
    drawn = plot_search(_ranked(tmp_path, simulate=0)["table"], tmp_path / "e.png")
    assert drawn["best"]["source"] == "est" and "Pareto set of the estimates" in drawn["legend"]


def test_search_emit_writes_the_winner_as_a_scenario_run_reproduces(tmp_path, capsys):
    """``search --emit best.yaml`` writes #1 as a scenario; ``clustersim run`` on it gives the
    step the search reported for it (the same simulation)."""
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({**TINY8, "fixed": {"recompute": "full", "zero_stage": 1, "schedule": "1f1b",
                                                       "micro_batch_size": 1}, "simulate": 2}))
    best = tmp_path / "out" / "best.yaml"
    assert main(["search", str(spec), "--json", "--workers", "1", "--emit", str(best)]) == 0
    top = json.loads(capsys.readouterr().out)[0]
    assert top["rank"] == 1 and top["source"] == "sim"
    emitted = yaml.safe_load(best.read_text())
    assert {k: emitted["parallel"][k] for k in top["parallel"]} == top["parallel"]
    assert main(["run", str(best), "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] == top["step_time_s"]
    # the table says the same, with its source
    assert main(["search", str(spec), "--workers", "1", "--no-progress", "--emit", str(best)]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.split()[:1] == ["1"])
    assert f"{top['step_time_s']:.3f}" in row and " sim " in row
    assert lines[-1] == f"wrote {best}: #1 as a scenario (clustersim run {best})"


def test_search_emit_without_a_feasible_layout_is_one_line(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({**TINY8, "fixed": {"tp": 8, "pp": 1, "micro_batch_size": 1},
                                    "hbm_headroom": 0.9999}))
    assert main(["search", str(spec), "--workers", "1", "--no-progress", "--emit", str(tmp_path / "b.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--emit" in err[0] and "no feasible layout" in err[0]
    assert not (tmp_path / "b.yaml").exists()


def test_cli_search_bad_input_is_one_line(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({**TINY8, "bounds": {"tp": [8, 2]}}))
    assert main(["search", str(spec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "search.bounds.tp" in err[0]


def test_a_moe_search_finds_feasible_expert_parallel_layouts():
    # Mixtral 8x7B on 4 DGX H100 hosts: every ep > 1 candidate used to be refused
    # ("tp*cp*dp*pp = 64 must equal the number of GPUs, 32"): the candidate's dp is the dense
    # degree, which includes ep (MoE parallel folding), so it must reach the scenario as such
    spec = SearchSpec.from_dict({"model": "mixtral-8x7b", "cluster": {"preset": "dgx-h100", "num_nodes": 4},
                                 "global_batch_size": 64, "seq_len": 4096,
                                 "fixed": {"micro_batch_size": 1, "schedule": "1f1b", "recompute": "full",
                                           "zero_stage": 1}})
    cands = candidates(spec)
    assert {c["ep"] for c in cands} == {1, 2, 4, 8}
    assert all((c["tp"] * c["cp"] * c["dp"]) % (c["etp"] * c["ep"]) == 0 for c in cands)
    assert all(c["etp"] in (1, c["tp"]) for c in cands)
    table = screen(spec, cands)
    moe = table[table["ep"] > 1]
    assert not moe["reason"].str.contains("must equal the number of GPUs").any()
    feasible = moe[moe["status"] == "ok"]
    assert len(feasible) > 0 and {2, 4, 8} <= set(feasible["ep"])
    assert (feasible["etp"] == 1).any() and (feasible["etp"] > 1).any()     # both foldings tried
    assert (feasible["est_step_s"] > 0).all()


def test_placement_rules_name_the_rule_they_apply():
    from simulator.explore.search import placement_violation
    from workloads import ParallelConfig

    def par(**kw):
        return ParallelConfig(**{"global_batch_size": 64, **kw}).resolve(64)

    # TP 16 on 8-GPU domains: rejected unless the rule is lifted; TP 8 fits
    assert "tp_within_nvlink_domain" in placement_violation(par(tp=16, dp=-1), 8)
    assert placement_violation(par(tp=16, dp=-1), 8, {"tp_within_nvlink_domain": False}) is None
    assert placement_violation(par(tp=8, dp=-1), 8) is None
    # a TP group of 8 strided by dp (mesh order dp first) spans 64 ranks: outside a domain
    assert "spans 64" in placement_violation(par(tp=8, dp=-1, mesh_order="dp-tp-cp-ep-pp"), 8)
    # TP 16 inside a 72-GPU NVL72 domain does not divide it: groups would straddle two
    assert placement_violation(par(tp=16, dp=-1), 72) is not None
    assert placement_violation(par(tp=8, dp=-1), 72) is None              # 72 = 9 x 8
    # TP x CP across domains: refused by default, naming the rule
    cross = par(tp=8, cp=2, dp=-1)
    msg = placement_violation(cross, 8)
    assert "TP x CP group (tp 8 x cp 2) spans 16" in msg and "search.placement.tp_cp_within_nvlink_domain" in msg
    assert placement_violation(par(tp=4, cp=2, dp=-1), 8) is None
    # with the TP x CP rule lifted, CP may cross with the default ring (p2p), unless its own rule is off
    free = {"tp_cp_within_nvlink_domain": False}
    assert placement_violation(cross, 8, free) is None
    assert "cp_across_nvlink_domains" in placement_violation(cross, 8, {**free, "cp_across_nvlink_domains": False})
    assert placement_violation(par(tp=4, cp=2, dp=-1), 8, {**free, "cp_across_nvlink_domains": False}) is None
    # the TP x CP rule contains the TP rule once cp > 1; with cp = 1 only the TP rule applies
    assert "tp_cp_within_nvlink_domain" in placement_violation(par(tp=16, cp=2, dp=-1), 8,
                                                                {"tp_within_nvlink_domain": False})
    # an axis between TP and CP in mesh_order widens the group's block: tp 2 x dp 16 x cp 2 = 64 ranks
    assert "spans 64" in placement_violation(par(tp=2, cp=2, dp=-1, mesh_order="tp-dp-cp-ep-pp"), 8)


def test_hbm_headroom_turns_tight_layouts_out_of_memory():
    base = {"model": "llama3-70b", "cluster": CASE, "global_batch_size": 128, "seq_len": 4096,
            "fixed": {"micro_batch_size": 1, "schedule": "1f1b", "recompute": "full", "zero_stage": 1, "tp": 8}}
    loose = screen(SearchSpec.from_dict(base), candidates(SearchSpec.from_dict(base)))
    tight_spec = SearchSpec.from_dict({**base, "hbm_headroom": 0.3})
    tight = screen(tight_spec, candidates(tight_spec))
    assert (tight["status"] == "oom").sum() > (loose["status"] == "oom").sum()
    # a stage fits when its total is at most 70 % of 80 GiB
    ok = tight[tight["status"] == "ok"]
    assert (ok["memory_gb"] <= 0.7 * 80 * 2**30 / 1e9).all()
    newly = tight[(tight["status"] == "oom") & (loose["status"] == "ok")]
    assert len(newly) and (newly["memory_gb"] > 0.7 * 80 * 2**30 / 1e9).all()


@pytest.mark.parametrize("bad, field", [({"placement": {"tp_inside": True}}, "search.placement.tp_inside"),
                                        ({"placement": {"tp_within_nvlink_domain": "yes"}},
                                         "search.placement.tp_within_nvlink_domain"),
                                        ({"placement": [1]}, "search.placement")])
def test_bad_placement_rules_name_the_field(bad, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        SearchSpec.from_dict({**TINY8, **bad})


def test_cp_may_cross_nvlink_domains_only_with_ring_attention():
    from simulator.explore.search import placement_violation
    from workloads import ParallelConfig

    def par(kind):
        return ParallelConfig(tp=8, cp=2, dp=-1, global_batch_size=8, cp_comm_type=kind).resolve(16)

    free = {"tp_cp_within_nvlink_domain": False}
    assert placement_violation(par("p2p"), 8, free) is None
    for kind in ("all_gather", "a2a"):
        rule = placement_violation(par(kind), 8, free)
        assert rule and f"cp_comm_type '{kind}'" in rule and "cp_across_nvlink_domains" in rule


def test_a_candidate_past_the_point_timeout_keeps_its_estimate(tmp_path, capsys):
    """``--point-timeout`` stops a candidate's simulation; it stays in the table with its
    estimate, marked ``timeout``, and the search finishes.  A limit that is not positive is
    refused before any candidate is enumerated."""
    spec = SearchSpec.from_dict({"model": "llama3-70b", "cluster": CASE, "global_batch_size": 128, "seq_len": 4096,
                                 "fixed": {"tp": 8, "pp": 4, "recompute": "full", "zero_stage": 1},
                                 "simulate": 1})
    t0 = time.perf_counter()
    out = search(spec, executor=LocalExecutor(1), progress=False, timeout_s=0.05)
    assert time.perf_counter() - t0 < 30
    sim = out["table"][out["table"]["sim_status"] != ""]
    assert len(sim) == 1 and sim["sim_status"].iloc[0] == "timeout"
    assert np.isnan(sim["sim_step_s"].iloc[0]) and sim["est_step_s"].iloc[0] > 0
    assert "0.05 s" in sim["reason"].iloc[0]
    with pytest.raises(ConfigError, match="--point-timeout"):
        search(spec, progress=False, timeout_s=0)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"model": "llama3-70b", "cluster": CASE, "global_batch_size": 128,
                                    "seq_len": 4096, "simulate": 1,
                                    "fixed": {"tp": 8, "pp": 4, "recompute": "full", "zero_stage": 1}}))
    assert main(["search", str(path), "--workers", "1", "--no-progress", "--point-timeout", "0.05",
                 "--top", "1"]) == 0
    assert "timeout" in capsys.readouterr().out.splitlines()[-1]
    assert main(["search", str(path), "--point-timeout", "-1"]) == 2


def test_tp_x_cp_across_an_nvlink_domain_is_excluded_by_default_and_allowed_when_relaxed():
    """Llama-3 8B (8 layers) at 32k tokens on 2 DGX H100 with TP 8: CP 2 makes a TP x CP group of
    16 ranks across the two 8-GPU domains, refused by default with the rule's name; with
    ``tp_cp_within_nvlink_domain: false`` the ring (p2p) CP crosses and the layout is screened."""
    base = {"model": {"preset": "llama3-8b", "num_layers": 8}, "cluster": {"preset": "dgx-h100", "num_nodes": 2},
            "global_batch_size": 8, "seq_len": 32768,
            "fixed": {"tp": 8, "cp": 2, "pp": 1, "micro_batch_size": 1, "schedule": "1f1b", "recompute": "full",
                      "zero_stage": 1}}
    spec = SearchSpec.from_dict(base)
    assert spec.placement["tp_cp_within_nvlink_domain"] is True
    strict = screen(spec, candidates(spec))
    assert len(strict) == 1 and strict.iloc[0]["status"] == "invalid"
    assert "search.placement.tp_cp_within_nvlink_domain" in strict.iloc[0]["reason"]
    relaxed_spec = SearchSpec.from_dict({**base, "placement": {"tp_cp_within_nvlink_domain": False}})
    relaxed = screen(relaxed_spec, candidates(relaxed_spec))
    assert len(relaxed) == 1 and relaxed.iloc[0]["status"] == "ok" and relaxed.iloc[0]["est_step_s"] > 0
