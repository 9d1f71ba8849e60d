"""Configuration search: enumerate legal 5D layouts, prune by memory, screen with the
closed-form estimate, simulate the best with the engine, rank by simulated step time.

The search file (``clustersim search SEARCH.yaml``)::

    model: llama3-70b                  # a preset name or a model mapping
    cluster: {preset: dgx-h100, num_nodes: 8}
    global_batch_size: 128
    seq_len: 4096                      # optional (the model's default)
    precision: bf16                    # optional; also overlap, moe_routing, num_steps
    fixed: {tp: 8, recompute: full}    # optional: knob -> value
    bounds: {pp: [1, 8]}               # optional: knob -> [min, max] (numeric knobs)
    simulate: 10                       # optional: simulate the best k by estimate ("all": every one)
    placement:                         # optional: the placement rules, here with their defaults
      tp_within_nvlink_domain: true    #   a TP group stays inside one NVLink domain
      tp_cp_within_nvlink_domain: true #   with cp > 1, a TP x CP group stays inside one NVLink domain
      cp_across_nvlink_domains: true   #   without that rule, a CP group may span domains (only with
                                       #   cp_comm_type p2p / a2a+p2p)
    hbm_headroom: 0.0                  # optional: fraction of HBM kept free (also flop_convention,
                                       # memory_accounting: the scenario keys)

Knobs and the values tried (each restrictable with ``fixed`` / ``bounds``; any other
``ParallelConfig`` field may be fixed):

=====================  ==============================================================
``tp``                 powers of two up to 16 (or the NVLink domain, if larger) dividing the
                       attention heads; with ``tp_within_nvlink_domain`` (the default) a TP
                       group wider than the domain, or not dividing it, is rejected
``cp``                 1, and 2 / 4 / 8 when the sequence is at least 32k tokens
``pp``                 divisors of the layer count that divide the GPU count / (tp cp)
``dp``                 derived: GPUs / (tp cp pp)
``ep``                 MoE: divisors of the expert count; dense: 1
``etp``                MoE: ``tp`` or 1 (expert tensor parallelism), with ``etp * ep`` dividing
                       ``tp * cp * dp`` (MoE parallel folding: ``dp`` is the dense degree and
                       the expert data-parallel degree is ``tp * cp * dp / (etp * ep)``);
                       dense: ``tp``
``micro_batch_size``   1, 2, 4, 8 (dividing the batch per replica)
``schedule``           gpipe, 1f1b, interleaved_1f1b (``vpp`` 2 or 4), zb_h1, dualpipe, zb_v (``vpp`` 2)
``recompute``          none, selective, full
``zero_stage``         0, 1, 2, 3 (``distributed_optimizer`` for stages >= 1)
=====================  ==============================================================

``sequence_parallel`` follows ``tp > 1``; a dense layout without data parallelism tries
only the first ZeRO stage allowed (the stages do not differ there).

Placement rules (``placement``; each rejection names its rule): a group occupies the block
of ranks spanned by its axis and the axes inside it in ``mesh_order`` (TP innermost by
default), and stays in one NVLink domain when that block divides the domain.  TP
collectives are on the critical path of every layer, so by default TP must stay inside a
domain (``tp_within_nvlink_domain: false`` lifts the rule).  With ``cp > 1`` the TP x CP
group (the ``tp * cp`` ranks that share the other coordinates) must by default fit one
domain too (``tp_cp_within_nvlink_domain``), the usual 5D rule of thumb: TP x CP at most the
GPUs of one NVLink domain, so that both sets of per-layer collectives stay on NVLink.  Setting
it false lets CP cross domains, as ring attention (``p2p``) and the hierarchical
``a2a+p2p`` hide its transfers behind attention, but not with ``all_gather`` or ``a2a``,
whose exposed collectives would cross the scale-out network; ``cp_across_nvlink_domains:
false`` then still keeps every CP group inside a domain.  How the three interact: the TP
rule is checked first; the TP x CP rule, while on, contains both the TP rule (a TP group
crossing a domain is refused under it even with ``tp_within_nvlink_domain: false`` when
``cp > 1``) and the CP rule (``cp_across_nvlink_domains`` matters only once
``tp_cp_within_nvlink_domain`` is false); with ``cp = 1`` the TP x CP group is the TP group
and only ``tp_within_nvlink_domain`` applies.

A candidate is ``invalid`` when the configuration or placement rules reject it (the reason
recorded), ``oom`` when a stage exceeds the usable HBM (``(1 - hbm_headroom) x HBM``) under
the memory model (the biggest terms recorded), else ``ok`` with its estimate
(:mod:`simulator.explore.estimate`).  The ``simulate`` best are run with the engine through the
sweep machinery (:mod:`simulator.explore.sweep`: local processes or Dask, SQLite, resumable).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import pandas as pd

from topologies import ConfigError, build_cluster
from workloads import ParallelConfig, load_model
from workloads.parallel import RECOMPUTE_KINDS
from workloads.schedules import SCHEDULE_NAMES

from .estimate import Estimator
from ..scenario import load_scenario

__all__ = ["SearchSpec", "candidates", "screen", "search", "rank", "plot_search", "KNOBS", "pareto_mask", "placement_violation",
           "PLACEMENT_DEFAULTS"]

KNOBS = ("tp", "cp", "pp", "dp", "ep", "etp", "micro_batch_size", "schedule", "vpp", "recompute", "zero_stage")
_SCENARIO_KEYS = ("precision", "overlap", "moe_routing", "num_steps", "grad_reduce_dtype", "seed", "host",
                  "precision_options", "flop_convention", "memory_accounting", "hbm_headroom")
_SPEC_KEYS = {"model", "cluster", "global_batch_size", "seq_len", "fixed", "bounds", "simulate", "name",
              "description", "placement", *_SCENARIO_KEYS}
#: Placement rules and their defaults (see the module docstring).
PLACEMENT_DEFAULTS = {"tp_within_nvlink_domain": True, "tp_cp_within_nvlink_domain": True,
                      "cp_across_nvlink_domains": True}
#: CP communication types whose transfers overlap attention, so a CP group may span domains.
_CP_SPANNING = ("p2p", "a2a+p2p")


@dataclass
class SearchSpec:
    model: object
    cluster: object
    global_batch_size: int
    seq_len: int | None = None
    fixed: dict = field(default_factory=dict)
    bounds: dict = field(default_factory=dict)
    simulate: int | None = 10               # None: every ok candidate
    scenario: dict = field(default_factory=dict)   # precision, overlap, moe_routing, num_steps, ...
    placement: dict = field(default_factory=lambda: dict(PLACEMENT_DEFAULTS))

    @classmethod
    def from_dict(cls, d: dict) -> "SearchSpec":
        if not isinstance(d, dict):
            raise ConfigError("search", d, "expected a mapping")
        for k in d:
            if k not in _SPEC_KEYS:
                raise ConfigError(f"search.{k}", d[k], f"unknown key; valid keys: {', '.join(sorted(_SPEC_KEYS))}")
        for k in ("model", "cluster", "global_batch_size"):
            if k not in d:
                raise ConfigError(f"search.{k}", None, "required")
        gbs = d["global_batch_size"]
        if isinstance(gbs, bool) or not isinstance(gbs, int) or gbs < 1:
            raise ConfigError("search.global_batch_size", gbs, "must be a positive integer")
        fixed = d.get("fixed") or {}
        bounds = d.get("bounds") or {}
        if not isinstance(fixed, dict):
            raise ConfigError("search.fixed", fixed, "must map knobs to values")
        if not isinstance(bounds, dict):
            raise ConfigError("search.bounds", bounds, "must map knobs to [min, max]")
        par_fields = {f.name for f in dataclasses.fields(ParallelConfig)}
        for k in fixed:
            if k not in par_fields:
                raise ConfigError(f"search.fixed.{k}", fixed[k], f"not a parallel knob; knobs: {', '.join(KNOBS)}")
        for k, v in bounds.items():
            if k not in ("tp", "cp", "pp", "dp", "ep", "etp", "micro_batch_size", "vpp", "zero_stage"):
                raise ConfigError(f"search.bounds.{k}", v, "bounds apply to numeric knobs: tp, cp, pp, dp, ep, etp, "
                                                          "micro_batch_size, vpp, zero_stage")
            if (not isinstance(v, (list, tuple)) or len(v) != 2 or not all(isinstance(x, int) for x in v)
                    or v[0] > v[1]):
                raise ConfigError(f"search.bounds.{k}", v, "must be [min, max] integers with min <= max")
        sim = d.get("simulate", 10)
        if sim == "all":
            sim = None
        elif isinstance(sim, bool) or not isinstance(sim, int) or sim < 0:
            raise ConfigError("search.simulate", sim, "must be a non-negative integer or 'all'")
        placement = d.get("placement") or {}
        if not isinstance(placement, dict):
            raise ConfigError("search.placement", placement, f"expected a mapping of {', '.join(PLACEMENT_DEFAULTS)}")
        for k, v in placement.items():
            if k not in PLACEMENT_DEFAULTS:
                raise ConfigError(f"search.placement.{k}", v, f"unknown rule; rules: {', '.join(PLACEMENT_DEFAULTS)}")
            if not isinstance(v, bool):
                raise ConfigError(f"search.placement.{k}", v, "must be true or false")
        return cls(d["model"], d["cluster"], gbs, d.get("seq_len"), dict(fixed), dict(bounds), sim,
                   {k: d[k] for k in _SCENARIO_KEYS if k in d}, {**PLACEMENT_DEFAULTS, **placement})

    def scenario_for(self, parallel: dict) -> dict:
        """The scenario mapping of one candidate."""
        par = {**parallel, "global_batch_size": self.global_batch_size}
        if self.seq_len:
            par["seq_len"] = self.seq_len
        return {"model": self.model, "cluster": self.cluster, "parallel": par, **self.scenario}


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _build_cluster(spec: SearchSpec):
    return build_cluster(spec.cluster if isinstance(spec.cluster, dict) else {"preset": spec.cluster})


def candidates(spec: SearchSpec, cluster=None, model=None) -> list[dict]:
    """Every combination of the knobs' values (see the module docstring) that passes the
    arithmetic rules (degrees multiply to the GPU count, the batch divides); the
    configuration rules proper are checked by :func:`screen`."""
    cluster = cluster or _build_cluster(spec)
    model = model or load_model(spec.model)
    n = cluster.num_gpus
    seq = spec.seq_len or model.seq_len
    fixed, bounds = spec.fixed, spec.bounds

    def allowed(knob, values):
        if knob in fixed:
            return [fixed[knob]]
        lo, hi = bounds.get(knob, (-math.inf, math.inf))
        return [v for v in values if lo <= v <= hi]

    heads = model.num_attention_heads
    tps = allowed("tp", [t for t in _pow2_upto(max(cluster.nvlink_domain_size, 16)) if heads % t == 0 and t <= n])
    cps = allowed("cp", [1, 2, 4, 8] if seq >= 32768 else [1])
    pps = allowed("pp", _divisors(model.num_layers))
    eps = allowed("ep", _divisors(model.moe.num_experts) if model.moe is not None else [1])
    mbss = allowed("micro_batch_size", [1, 2, 4, 8])
    scheds = [fixed["schedule"]] if "schedule" in fixed else list(SCHEDULE_NAMES)
    recs = [fixed["recompute"]] if "recompute" in fixed else list(RECOMPUTE_KINDS)
    zeros = allowed("zero_stage", [0, 1, 2, 3])
    vpps = allowed("vpp", [2, 4])
    extra = {k: v for k, v in fixed.items() if k not in KNOBS}
    out = []
    for tp in tps:
        for cp in cps:
            for pp in pps:
                if n % (tp * cp * pp):
                    continue
                dp = n // (tp * cp * pp)
                if dp not in allowed("dp", [dp]):
                    continue
                # MoE parallel folding (Megatron-Core): the expert layers run their own mesh
                # etp x ep x edp over the same tp x cp x dp ranks; etp is tp (Megatron's default)
                # or 1, and dp here is the dense degree, which includes ep
                for ep, etp in [(e, t) for e in eps for t in (allowed("etp", sorted({1, tp})) if model.moe is not None
                                                              else [tp])
                                if (tp * cp * dp) % (t * e) == 0]:
                    for mbs in mbss:
                        if spec.global_batch_size % (mbs * dp):
                            continue
                        for sched in (scheds if pp > 1 else ["1f1b"]):
                            for vpp in {"interleaved_1f1b": vpps, "zb_v": [2]}.get(sched, [1]):
                                for rec in recs:
                                    # without data parallelism the ZeRO stages are one layout
                                    single = dp * cp == 1 and model.moe is None
                                    for z in (zeros[:1] if single else zeros):
                                        out.append({"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, "etp": etp,
                                                    "micro_batch_size": mbs, "schedule": sched, "vpp": vpp,
                                                    "recompute": rec, "zero_stage": z,
                                                    "distributed_optimizer": z >= 1,
                                                    "sequence_parallel": tp > 1, **extra})
    return out


def screen(spec: SearchSpec, cands: list[dict], estimator: Estimator | None = None, *,
           progress: bool = False, cluster=None, model=None) -> pd.DataFrame:
    """Validate, prune by memory and estimate every candidate: one row each, with
    ``status`` (ok | oom | invalid), ``reason``, peak memory and the estimate.

    ``cluster`` / ``model``: the spec's cluster and :class:`~workloads.ModelSpec`, already
    built (else the first candidate builds the cluster, each one loads the model)."""
    rows = []
    it = cands
    if progress:
        from ..report.progress import progress_iter
        it = progress_iter(cands, "screen", "cand")
    for par in it:
        row = {**{k: par[k] for k in KNOBS if k != "etp"}, "etp": par.get("etp", par["tp"]), "status": "ok", "reason": "", "memory_gb": math.nan,
               "est_step_s": math.nan, "est_mfu": math.nan}
        try:
            cfg = spec.scenario_for(par)
            if model is not None:
                cfg["model"] = model
            sc = load_scenario(cfg, cluster=cluster)
            cluster = sc.cluster
            broken = placement_violation(sc.parallel, cluster.nvlink_domain_size, spec.placement)
            if broken:
                row["status"], row["reason"] = "invalid", broken
                rows.append(row)
                continue
            mem = sc.memory_estimates()
            worst = max(mem, key=lambda e: e.total_bytes)
            row["memory_gb"] = worst.total_bytes / 1e9
            if not all(e.fits() for e in mem):
                row["status"] = "oom"
                row["reason"] = worst.verdict()
                rows.append(row)
                continue
            if estimator is None:
                estimator = Estimator(sc.cluster)
            e = estimator.estimate(sc, mem)
            row["est_step_s"] = e["step_time_s"]
            row["est_mfu"] = e["mfu"]
        except ConfigError as err:
            row["status"] = "invalid"
            row["reason"] = str(err)
        rows.append(row)
    return pd.DataFrame(rows)


def _block(par: ParallelConfig, *axes: str) -> int:
    """Consecutive ranks one group of ``axes`` spans: the product of the degrees of the
    outermost of ``axes`` in ``mesh_order`` and of every axis inside it (dense groups: ep
    counts 1, it is carved out of dp)."""
    sizes = {"tp": par.tp, "cp": par.cp, "ep": 1, "dp": par.dp, "pp": par.pp}
    order = par.mesh_order.split("-")
    return math.prod(sizes[a] for a in order[:max(order.index(a) for a in axes) + 1])


def placement_violation(par: ParallelConfig, domain: int, rules: dict | None = None) -> str | None:
    """The placement rule ``par`` breaks on NVLink domains of ``domain`` GPUs, as a sentence
    naming the rule, or None (see the module docstring)."""
    rules = {**PLACEMENT_DEFAULTS, **(rules or {})}

    def inside(*axes: str) -> bool:
        b = _block(par, *axes)
        return b <= domain and domain % b == 0

    if par.tp > 1 and rules["tp_within_nvlink_domain"] and not inside("tp"):
        return (f"placement: the TP group of {par.tp} spans {_block(par, 'tp')} consecutive ranks, which do not fit "
                f"one NVLink domain of {domain} GPUs (rule search.placement.tp_within_nvlink_domain)")
    if par.cp > 1 and rules["tp_cp_within_nvlink_domain"] and not inside("tp", "cp"):
        return (f"placement: the TP x CP group (tp {par.tp} x cp {par.cp}) spans {_block(par, 'tp', 'cp')} "
                f"consecutive ranks, which do not fit one NVLink domain of {domain} GPUs (rule "
                f"search.placement.tp_cp_within_nvlink_domain; set it false to let CP cross domains)")
    if par.cp > 1 and not inside("cp"):
        cp_type = getattr(par, "cp_comm_type", "p2p")
        if not rules["cp_across_nvlink_domains"]:
            return (f"placement: the CP group (cp = {par.cp}) spans {_block(par, 'cp')} ranks across NVLink domains of "
                    f"{domain} GPUs (rule search.placement.cp_across_nvlink_domains is false)")
        if cp_type not in _CP_SPANNING:
            return (f"placement: the CP group (cp = {par.cp}) spans NVLink domains of {domain} GPUs, and cp_comm_type "
                    f"'{cp_type}' would put its exposed collectives on the scale-out network; only "
                    f"{' or '.join(_CP_SPANNING)} may span domains (rule search.placement.cp_across_nvlink_domains)")
    return None


def pareto_mask(df: pd.DataFrame, x: str, y: str) -> pd.Series:
    """Rows not dominated in (x, y), both minimised."""
    order = df.sort_values([x, y]).index
    best = math.inf
    keep = pd.Series(False, index=df.index)
    for i in order:
        if df.at[i, y] < best:
            keep[i] = True
            best = df.at[i, y]
    return keep


def search(spec: SearchSpec, *, executor=None, store=None, progress: bool = True,
           timeout_s: float | None = None) -> dict:
    """The whole search: candidates, screening, simulation of the best ``spec.simulate``.

    ``timeout_s``: the per-candidate limit on its simulation; a candidate past it keeps its
    estimate and gets ``sim_status`` ``timeout`` (the search goes on with the others).

    Returns ``{"table": DataFrame (every candidate in the order of :func:`rank`, with its
    ``rank``, ``source``, ``step_s`` and ``mfu``), "counts": {...}, "timing": {...},
    "cluster": the spec's Cluster, "best": the scenario mapping of rank 1 (None without a
    feasible candidate)}``: running ``best`` gives the step the search reports for it.
    """
    from .sweep import LocalExecutor, Store, config_hash, run_points
    if timeout_s is not None and not timeout_s > 0:         # refused before any work
        raise ConfigError("--point-timeout", timeout_s, "must be a number of seconds > 0")
    t0 = time.perf_counter()
    cluster = _build_cluster(spec)
    model = load_model(spec.model)
    cands = candidates(spec, cluster, model)
    t1 = time.perf_counter()
    table = screen(spec, cands, progress=progress, cluster=cluster, model=model)
    t2 = time.perf_counter()
    ok = table[table["status"] == "ok"].sort_values("est_step_s", kind="stable")
    k = len(ok) if spec.simulate is None else min(spec.simulate, len(ok))
    chosen = ok.head(k)
    configs = [spec.scenario_for(cands[i]) for i in chosen.index]
    table["sim_step_s"] = math.nan
    table["sim_mfu"] = math.nan
    table["exposed_comm_s"] = None
    table["sim_status"] = ""
    if configs:
        own_store = store is None
        if own_store:
            import tempfile
            store = Store(tempfile.mkdtemp(prefix="clustersim-search-") + "/search.sqlite")
        ex = executor or LocalExecutor()
        try:
            run_points(configs, store, ex, progress=progress, desc="simulate", timeout_s=timeout_s)
        finally:
            if executor is None:
                ex.close()
        by_hash = {r["hash"]: r for r in store.rows()}
        for i, cfg in zip(chosen.index, configs):
            r = by_hash.get(config_hash(cfg))
            if r is None:
                continue
            table.at[i, "sim_status"] = r["status"]
            if r["status"] == "ok":
                table.at[i, "sim_step_s"] = r["metrics"]["step_time_s"]
                table.at[i, "sim_mfu"] = r["metrics"]["mfu"]
                table.at[i, "exposed_comm_s"] = r["metrics"].get("exposed_comm_s")
            else:
                table.at[i, "reason"] = r["error"]
    t3 = time.perf_counter()
    table = rank(table.assign(_cand=table.index))
    best = None
    if len(table) and table.at[0, "rank"] == 1:
        best = spec.scenario_for(cands[int(table.at[0, "_cand"])])
    table = table.drop(columns=["_cand"])
    counts = {"candidates": len(table), "ok": int((table["status"] == "ok").sum()),
              "oom": int((table["status"] == "oom").sum()), "invalid": int((table["status"] == "invalid").sum()),
              "simulated": int(len(configs))}
    return {"table": table, "counts": counts, "cluster": cluster, "best": best,
            "timing": {"enumerate_s": t1 - t0, "screen_s": t2 - t1, "simulate_s": t3 - t2,
                       "screened_per_s": len(cands) / (t2 - t1) if t2 > t1 else math.inf}}


def rank(table: pd.DataFrame) -> pd.DataFrame:
    """The search's one ranking, as columns ``rank``, ``source``, ``step_s`` and ``mfu``.

    Feasible candidates whose simulation finished come first, by simulated step time
    (``source`` ``sim``); then every other feasible one (not simulated, or its simulation
    failed or timed out), by its closed-form estimate (``source`` ``est``).  ``step_s`` and
    ``mfu`` are the numbers the rank uses, from that source.  The simulated candidates are
    the estimate's best, so no estimate-only candidate has a better estimate than a
    simulated one; an estimate is never set among simulated times, as the two differ by
    a few percent.  Infeasible candidates follow, unranked (``rank`` 0, ``source`` empty).
    Returns the table in that order, with a fresh index."""
    ok = table["status"] == "ok"
    sim = ok & table["sim_step_s"].notna()
    key = pd.DataFrame({"tier": [0 if s else (1 if o else 2) for s, o in zip(sim, ok)],
                        "step": table["sim_step_s"].where(sim, table["est_step_s"]).fillna(math.inf)},
                       index=table.index)
    order = key.sort_values(["tier", "step"], kind="stable").index
    out = table.loc[order].reset_index(drop=True)
    sim, ok = sim.loc[order].to_numpy(), ok.loc[order].to_numpy()
    out["source"] = ["sim" if s else ("est" if o else "") for s, o in zip(sim, ok)]
    out["step_s"] = out["sim_step_s"].where(sim, out["est_step_s"].where(ok))
    out["mfu"] = out["sim_mfu"].where(sim, out["est_mfu"].where(ok))
    out["rank"] = [i + 1 if o else 0 for i, o in enumerate(ok)]
    return out


def plot_search(table: pd.DataFrame, path, title: str = "", hbm_gb: float | None = None) -> dict:
    """Step time vs peak memory of every feasible candidate, coloured by tp x pp (one legend
    entry each), simulated ones as diamonds at their simulated step time, estimate-only ones
    as dots at their estimate; the Pareto set (less memory or less time) of the simulated
    candidates ringed (of the estimates when none was simulated); "#1" is the table's first
    row (:func:`rank`).  ``table``: :func:`search`'s table (ranked here when it is not).
    Returns what it drew: ``legend`` (the labels) and ``best`` (the row marked #1, or None)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    if "rank" not in table.columns:
        table = rank(table)
    ok = table[table["rank"] > 0].copy()
    ok["tppp"] = ok["tp"] * ok["pp"]
    fig, ax = plt.subplots(figsize=(9, 6))
    handles, best = [], None
    if ok.empty:
        ax.text(0.5, 0.5, "no feasible candidate", ha="center", va="center", transform=ax.transAxes)
    else:
        levels = sorted(ok["tppp"].unique())
        cmap = plt.get_cmap("viridis", max(len(levels), 2))
        for j, lv in enumerate(levels):
            sub = ok[ok["tppp"] == lv]
            est, sim = sub[sub["source"] == "est"], sub[sub["source"] == "sim"]
            ax.scatter(est["memory_gb"], est["step_s"], s=24, color=cmap(j), alpha=0.6, marker="o", linewidths=0)
            ax.scatter(sim["memory_gb"], sim["step_s"], s=52, color=cmap(j), marker="D", edgecolors="black",
                       linewidths=0.6, zorder=3)
            handles.append(Line2D([], [], ls="", marker="s", markersize=8, color=cmap(j), label=f"tp·pp = {lv}"))
        simulated = ok[ok["source"] == "sim"]
        pool, which = (simulated, "simulated") if len(simulated) else (ok, "estimates")
        front = pool[pareto_mask(pool, "memory_gb", "step_s")].sort_values("memory_gb")
        ax.plot(front["memory_gb"], front["step_s"], color="crimson", lw=1.0, ls="--", zorder=1)
        ax.scatter(front["memory_gb"], front["step_s"], s=150, facecolors="none", edgecolors="crimson",
                   linewidths=1.3, zorder=4)
        best = ok.iloc[0]
        ax.scatter([best.memory_gb], [best.step_s], s=260, marker="*", color="gold", edgecolors="black",
                   linewidths=0.8, zorder=5)
        how = "simulated" if best.source == "sim" else "estimate only"
        ax.annotate(f"#1 ({how}): tp{best.tp} cp{best.cp} pp{best.pp} dp{best.dp} ep{best.ep}\n"
                    f"mbs {best.micro_batch_size}, {best.schedule}"
                    f"{' vpp' + str(best.vpp) if best.vpp > 1 else ''}, {best.recompute}, ZeRO-{best.zero_stage}\n"
                    f"{best.step_s:.3g} s, {best.memory_gb:.1f} GB",
                    (best.memory_gb, best.step_s), xytext=(18, 28), textcoords="offset points", fontsize=8,
                    bbox={"boxstyle": "round", "fc": "white", "ec": "grey", "alpha": 0.9},
                    arrowprops={"arrowstyle": "->", "lw": 0.8})
        handles += [Line2D([], [], ls="", marker="D", markersize=7, color="lightgrey", markeredgecolor="black",
                           label="simulated step time"),
                    Line2D([], [], ls="", marker="o", markersize=5, color="grey", alpha=0.6,
                           label="estimate only (not simulated)"),
                    Line2D([], [], ls="--", marker="o", markersize=10, color="crimson", markerfacecolor="none",
                           label=f"Pareto set of the {which}"),
                    Line2D([], [], ls="", marker="*", markersize=14, color="gold", markeredgecolor="black",
                           label="#1 of the table")]
        if hbm_gb:
            top = ok["memory_gb"].max()
            if top >= 0.4 * hbm_gb:
                # the HBM line only when it is near the points: far off it would squeeze them
                ax.axvline(hbm_gb, color="grey", ls=":", lw=1)
                ax.text(hbm_gb, ax.get_ylim()[0], " usable HBM ", va="bottom", ha="right", fontsize=8, color="grey")
            else:
                handles.append(Line2D([], [], ls="", label=f"usable HBM {hbm_gb:.0f} GB (off the chart)"))
        ax.legend(handles=handles, fontsize=8, loc="upper right")
    ax.set_xlabel("peak memory per GPU (GB, memory model)")
    ax.set_ylabel("step time (s): simulated, or the estimate")
    ax.set_title(title or "configuration search: step time vs memory")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return {"legend": [h.get_label() for h in handles], "best": None if best is None else best.to_dict()}
