"""The ``clustersim`` command: one subcommand per question (``clustersim --help`` lists them).

``run`` simulates a scenario; ``compare`` runs several side by side; ``memory`` gives its memory per stage; ``search`` and ``sweep``
explore layouts; ``validate`` predicts measured runs; ``topo``, ``collectives`` and
``schedule`` look at a cluster, its collectives and a pipeline schedule on their own;
``presets`` lists what can be named; ``demo`` shows a cluster's collectives and contention.

Exit status: 0 done, 2 bad input (one line on stderr naming the field, the value and the
rule; no traceback), 1 a simulation that could not finish or a job stopped by a what-if
failure (a failed NIC without failover; one line on stderr), 3 with ``--strict`` (``run``,
``memory``) when the layout does not fit the GPU's memory, 130 interrupted.  Input files and
output paths (:data:`OUTPUTS`) are checked before any work.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
from pathlib import Path

from topologies import CLUSTER_PRESETS, ConfigError, build_cluster
from topologies.units import fmt_bytes, parse_size

from .collectives import CollectiveError
from .engine import JobStopped, SimulationError

__all__ = ["main", "collective_table"]


def _load_cluster(arg: str, overrides: list[str]):
    """A preset name or a YAML file (a mapping, or a scenario with a ``cluster:`` key), plus key=value overrides."""
    from .scenario.yaml_input import load_yaml_file, parse_yaml

    path = Path(arg)
    if path.suffix in (".yaml", ".yml"):
        data = load_yaml_file(path, "cluster", "a YAML cluster mapping or scenario")
        if isinstance(data, dict) and "cluster" in data:
            data = data["cluster"]
        cfg = data if isinstance(data, dict) else {"preset": data}
    else:
        cfg = {"preset": arg}
    for item in overrides:
        if "=" not in item:
            raise ConfigError("--set", item, "expected key=value")
        key, value = item.split("=", 1)
        cfg[key] = parse_yaml(value, "--set", item)
    return build_cluster(cfg)


def _int_list(spec: str, field: str, limit: int) -> list[int]:
    """``"0-7,64,70-71"`` -> the integers, each in ``[0, limit)``."""
    out = []
    for part in spec.split(","):
        part = part.strip()
        try:
            lo, _, hi = part.partition("-")
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ConfigError(field, spec, "expected numbers and ranges, e.g. 0-7,64") from None
        if not 0 <= a <= b < limit:
            raise ConfigError(field, spec, f"'{part}' is outside 0-{limit - 1}")
        out.extend(range(a, b + 1))
    return out


def _chosen_ranks(grid, ranks: str | None, stages: str | None) -> list[int] | None:
    """The ranks ``--ranks`` and ``--stages`` select (their union) on ``grid`` (a
    :class:`workloads.mesh.RankGrid`), or None for all."""
    if ranks is None and stages is None:
        return None
    chosen = set(_int_list(ranks, "--ranks", grid.world_size)) if ranks else set()
    if stages:
        want = set(_int_list(stages, "--stages", grid.cfg.pp))
        chosen |= {r for r in range(grid.world_size) if grid.stage_of(r) in want}
    return sorted(chosen)


def _apply_sets(scenario: dict, items: list[str]) -> None:
    """``--set parallel.pp=8 --set cluster.oversubscription=4``: dotted scenario keys (the
    sweep's), values read as YAML."""
    from .explore.sweep import set_dotted
    from .scenario.yaml_input import parse_yaml

    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError("--set", item, "expected dotted.key=value, e.g. parallel.pp=8")
        set_dotted(scenario, key.strip(), parse_yaml(value, "--set", item))


_MODEL_SOURCES = ("preset", "hf_config", "megatron_args")
_MODEL_CONFIG_KINDS = "a Hugging Face config.json (or its folder), a YAML model mapping or a text file of " \
                      "Megatron-LM --arguments"


def _scenario_spec(args, force: bool = False):
    """The scenario as ``run`` and ``memory`` load it: its path, or (with ``--model-config``,
    ``--set``, or ``force``) the mapping read from it with those applied."""
    if not (force or args.set or args.model_config):
        return args.scenario
    from .scenario import read_yaml

    scenario = read_yaml(args.scenario, "scenario", "a mapping of sections")
    scenario.setdefault("name", Path(args.scenario).stem)
    if args.model_config:
        # the model from a config file; the scenario's model keys other than its source stay
        # as overrides (a seq_len, a capacity factor)
        own = scenario.get("model") if isinstance(scenario.get("model"), dict) else {}
        keep = {k: v for k, v in own.items() if k not in _MODEL_SOURCES}
        scenario["model"] = {**keep, **_model_config(args.model_config), **keep}     # keep's keys first, as before
    _apply_sets(scenario, args.set)
    return scenario


def _model_config(path: str) -> dict:
    """The model mapping ``--model-config FILE`` stands for, told apart by extension, then by
    content: ``.json`` or a folder is a Hugging Face config, ``.yaml``/``.yml`` a mapping of
    model fields (or a scenario's ``model:``), other text a JSON object or Megatron-LM
    ``--flags``; anything else (a binary file, prose) is refused."""
    from .scenario.yaml_input import read_text, read_yaml

    p = Path(path)
    if p.is_dir():
        read_text(p / "config.json", "--model-config", "the folder's config.json")
        return {"hf_config": path}
    if p.suffix.lower() in (".yaml", ".yml"):
        data = read_yaml(path, "--model-config", "a mapping of model fields")
        model = data.get("model", data)
        model = {"preset": model} if isinstance(model, str) else model
        if not isinstance(model, dict):
            raise ConfigError("--model-config", path, "its 'model' entry is neither a preset name nor a mapping")
        if not any(k in model for k in (*_MODEL_SOURCES, "name")):
            model = {"name": p.stem, **model}       # a full mapping of fields: named after its file
        return model
    text = read_text(path, "--model-config", _MODEL_CONFIG_KINDS)
    if p.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        return {"hf_config": path}
    if any(tok.startswith("--") for tok in text.split()):
        return {"megatron_args": text}
    raise ConfigError("--model-config", path, f"holds no JSON and no --flags; expected {_MODEL_CONFIG_KINDS}")


def collective_table(cluster, sizes, calibration=None) -> list[dict]:
    """Predicted-and-simulated times of typical groups' collectives on an idle cluster."""
    import simpy

    from .collectives import CollectiveEngine

    gph = cluster.gpus_per_host
    groups = {f"TP {min(gph, cluster.num_gpus)} (one host)": list(range(min(gph, cluster.num_gpus)))}
    if cluster.num_hosts > 1:
        groups[f"DP {cluster.num_hosts} (one GPU per host)"] = [h * gph for h in range(cluster.num_hosts)]
        groups[f"all {cluster.num_gpus} GPUs"] = list(range(cluster.num_gpus))
    rows = []
    for label, members in groups.items():
        n = len(members)
        for kind in ("all_reduce", "all_gather", "all_to_all"):
            for size in sizes:
                env = simpy.Environment()
                eng = CollectiveEngine(env, cluster, calibration)
                g = eng.register_group(members)
                eng.issue(g, 0, kind, size, count=n)
                env.run()
                r = eng.records[-1]
                t = r.end_s - r.arrive_s
                bus = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "all_to_all": (n - 1) / n}[kind]
                rows.append({"group": label, "kind": kind, "size_bytes": size, "algo": r.algo, "proto": r.proto,
                             "time_s": t, "busbw_GBps": size / t * bus / 1e9})
    return rows


def _print_table(rows) -> None:
    print(f"{'group':<28} {'collective':<11} {'size':>9} {'choice':<16} {'time':>10} {'bus bw':>11}")
    for r in rows:
        print(f"{r['group']:<28} {r['kind']:<11} {fmt_bytes(r['size_bytes']):>9} {r['algo'] + '/' + r['proto']:<16} "
              f"{r['time_s'] * 1e6:>8.1f}us {r['busbw_GBps']:>7.1f}GB/s")


def _contention_demo(cluster) -> None:
    """A data-parallel all-reduce alone, then sharing the fabric with an all-to-all."""
    import simpy

    from .collectives import CollectiveEngine

    gph = cluster.gpus_per_host
    dp = [h * gph for h in range(cluster.num_hosts)]
    size = 1 << 30
    times = {}
    for label in ("alone", "with all-to-all"):
        env = simpy.Environment()
        eng = CollectiveEngine(env, cluster)
        g = eng.register_group(dp)
        eng.issue(g, 0, "all_reduce", size, count=len(dp))
        if label != "alone":
            a2a = eng.register_group(range(cluster.num_gpus), group_id=99)
            eng.issue(a2a, 0, "all_to_all", size, count=cluster.num_gpus)
        env.run()
        rec = next(r for r in eng.records if r.kind == "all_reduce")
        times[label] = rec.end_s - rec.arrive_s
    print(f"\ncontention: 1 GiB all-reduce over {len(dp)} hosts (rail 0) takes {times['alone'] * 1e3:.2f} ms alone, "
          f"{times['with all-to-all'] * 1e3:.2f} ms while a 1 GiB all-to-all over all {cluster.num_gpus} GPUs "
          f"shares the NICs ({times['with all-to-all'] / times['alone']:.2f}x)")


def _memory_line(m: dict) -> str:
    """The fit verdict after the peak memory: fits with its margin, or short by how much."""
    if "memory_fits" not in m:
        return ""
    margin = m["memory_margin_bytes"] / 1e9
    kept = f", {m['hbm_headroom']:.0%} of HBM kept free" if m.get("hbm_headroom") else ""
    if m["memory_fits"]:
        return f"   fits ({margin:.1f} GB to spare on {m['memory_worst_stage']}{kept})"
    return f"   DOES NOT FIT: {m['memory_worst_stage']} is {-margin:.1f} GB over {'usable ' if kept else ''}HBM{kept}"


def shortfall(res) -> str | None:
    """``stage 3 (ranks 24-31) needs 92.1 GB of 80.0 GB``: the worst stage against its usable
    HBM when the memory model says the layout does not fit; None when it fits (or there is
    no memory estimate)."""
    if res.metrics.get("memory_fits") is not False or not res.memory:
        return None
    worst = max(res.memory, key=lambda e: e.total_bytes - e.hbm_bytes)
    return f"{worst.where} needs {worst.total_bytes / 1e9:.1f} GB of {worst.hbm_bytes / 1e9:.1f} GB"


def fit_fields(res) -> dict:
    """What ``run --json`` adds to the metrics: ``fits`` (None without a memory estimate)
    and, when it does not fit, ``hypothetical`` (the step figures are what the step would
    take if it fit) with ``shortfall`` (the worst stage against its usable HBM)."""
    fits = res.metrics.get("memory_fits")
    out = {"fits": fits}
    if fits is False:
        out.update(hypothetical=True, shortfall=shortfall(res))
    return out


def step_interval(res):
    """The run's :class:`~simulator.validation.intervals.Interval` (computed once per result)."""
    from .validation.intervals import result_interval
    return result_interval(res)


def _likely_title(res) -> str:
    """`` (likely 8.9-9.8 s)`` for a chart title; empty without comparable measurements."""
    text = step_interval(res).range_text(res.metrics["step_time_s"])
    return f" (likely {text})" if text else ""


def interval_lines(res) -> list[str]:
    """``likely measured  8.3-9.6 s  (80 % interval from 34 comparable measured runs: ...)``."""
    from .validation.intervals import SIGN_NOTE
    iv, step = step_interval(res), res.metrics["step_time_s"]
    if not iv.known:
        return [f"  likely measured  no comparable measurements ({iv.stratum}: {iv.basis}; docs/accuracy.md)"]
    return [f"  likely measured  {iv.range_text(step)}   ({iv.level_text()} from {iv.rows} comparable measured runs: {iv.stratum}; "
            f"{'sets' if len(iv.sets) > 1 else 'set'} {', '.join(iv.sets)}"
            + (f"; {iv.basis})" if iv.basis.startswith("pooled") else ")"),
            f"                   {SIGN_NOTE} (docs/accuracy.md)"]


def summary_table(res) -> str:
    """The stdout summary of a run.  A layout the memory model says does not fit says so on
    its first line, and its step figures are marked hypothetical."""
    m, sc = res.metrics, res.scenario
    short = shortfall(res)
    lines = []
    if short:
        lines.append(f"DOES NOT FIT: {short} (usable HBM); the step figures below are hypothetical, "
                     f"what the step would take if it fit")
    lines.append(f"{sc.name}: {sc.model.name} on {sc.cluster.num_gpus} x {sc.cluster.gpu.name}, "
                 f"{sc.parallel.describe()}, {sc.parallel.schedule}, {sc.precision}")
    tag = f"   (hypothetical: {short})" if short else ""
    hyp = "   (hypothetical)" if short else ""
    lines += [f"  what-if          {w}" for w in m.get("whatif", [])]
    lines += [f"  step time        {m['step_time_s']:.4f} s   (step {len(res.step_bounds)} of {len(res.step_bounds)})"
              + tag, *interval_lines(res),
             f"  MFU              {m['mfu']:.1%}   (bf16 peak {m['mfu_bf16_peak']:.1%}, HFU {m['hfu']:.1%}; "
             f"{m.get('flop_convention', 'megatron_core_2025')} FLOPs)" + hyp,
             f"  TFLOP/s per GPU  {m['tflops_per_gpu']:.1f}" + hyp,
             f"  tokens/s         {m['tokens_per_s']:,.0f}" + hyp,
             f"  measured kernels {m.get('measured_step_share', 0.0):.1%} of the step costed from measured kernel "
             f"tables ({m.get('measured_compute_share', 0.0):.1%} of the layers' kernel time; the rest modelled)",
             f"  peak memory      {m['peak_memory_bytes'] / 1e9:.1f} GB" + _memory_line(m),
             f"  breakdown (the cell that finishes last: {m.get('last_ranks', m['last_cell'])}):"]
    if "moe_dropped_fraction" in m:
        lines.insert(-1, f"  dropped tokens   {m['moe_dropped_tokens']:,} of {m['moe_routed_tokens']:,} token-expert "
                         f"assignments ({m['moe_dropped_fraction']:.2%}; capacity {sc.model.moe.capacity_factor})")
        if "model_flops_per_step_dropless" in m and m['step_time_s'] > 0:
            tf = m["model_flops_per_step_dropless"] / m["step_time_s"] / m["num_gpus"] / 1e12
            lines.insert(-1, f"                   MFU and TFLOP/s count only the kept assignments; counting every "
                             f"routed one (Megatron-LM's log): {tf:.1f} TFLOP/s per GPU")
    for k, v in sorted(m["breakdown_s"].items(), key=lambda kv: -kv[1]):
        lines.append(f"    {k:<14} {v:9.4f} s  {v / m['step_time_s']:6.1%}")
    util = ", ".join(f"{k} {v:.1%}" for k, v in m["link_utilization"].items())
    lines.append(f"  link utilisation {util}")
    if sc.approximations:
        lines.append(f"  approximations   {', '.join(sc.approximations)} (not the exact model: docs/performance.md)")
    lines.append(f"  simulated in {m['wall_time_s']:.2f} s ({m['num_events']} events, {m['num_flows']} flows, "
                 f"{m['num_solves']} solves)")
    return "\n".join(lines)


def _ranks_asked(args, scenario):
    """The scenario (loaded when ``--ranks`` / ``--stages`` are given, to check them against
    the layout before simulating anything) and the ranks they choose (None: all); a streamed
    timeline keeps the rows of these ranks."""
    if not (args.ranks or args.stages):
        return scenario, None
    from workloads.mesh import RankGrid

    from .scenario import load_scenario
    scenario = load_scenario(scenario)
    return scenario, _chosen_ranks(RankGrid(scenario.parallel), args.ranks, args.stages)


def _note_streamed(res, chosen, quiet: bool, nothing_kept: bool = False) -> None:
    """Say on stderr that the run streamed its timeline and which rows it kept."""
    if nothing_kept:
        print("warning: no Gantt chart, trace or report: the streamed timeline kept no rows (--ranks / --stages "
              "choose ranks to keep)", file=sys.stderr)
    elif res.stream is not None and not quiet:
        print(f"note: timeline streamed ({res.stream.n_rows:,} rows): full rows kept for "
              + (f"{len(chosen):,} ranks (--ranks / --stages)" if chosen else "no rank (--ranks / --stages choose)")
              + "; per-rank summaries of all (--out: rank_summary.csv)", file=sys.stderr)


def _run(args) -> int:
    from pathlib import Path

    from .engine import run

    if args.per_kernel and not args.out:
        raise ConfigError("--per-kernel", True, "writes kernels.csv into the --out folder: give --out DIR")
    scenario = _scenario_spec(args, force=bool(args.approx))
    if args.approx:
        given = scenario.get("approximations", [])
        scenario["approximations"] = (given if isinstance(given, list) else [given]) + args.approx
    scenario, chosen = _ranks_asked(args, scenario)
    res = run(scenario, fold=not args.no_fold, progress=not args.quiet, timeline=args.timeline,
              timeline_ranks=chosen)
    _note_streamed(res, chosen, args.quiet)
    from .engine.untouched import untouched_settings
    for line in untouched_settings(res):
        print(f"warning: {line}", file=sys.stderr)
    out = Path(args.out) if args.out else None
    # a folded run's timeline has one row per rank cell; --per-rank expands it to every rank
    # (or to the --ranks / --stages chosen, which imply it)
    per_rank = args.per_rank or chosen is not None
    # (built only for what is written or drawn: a run that prints its metrics needs no timeline)
    tl = functools.cache(lambda: res.rank_timeline(chosen) if per_rank else res.timeline)
    if out:
        res.save(out)
        if per_rank:
            tl().to_csv(out / "timeline_ranks.csv", index=False)
    if args.per_kernel:
        import pandas as pd
        pd.DataFrame(res.program.kernel_table()).to_csv(out / "kernels.csv", index=False)
    gantt_path = args.gantt or (str(out / "gantt.png") if out else None)
    trace_path = args.trace or (str(out / "trace.json") if out else None)
    if res.stream is not None and (gantt_path or trace_path or args.report) and tl().empty:
        _note_streamed(res, chosen, False, nothing_kept=True)
        gantt_path = trace_path = args.report = None
    if gantt_path:
        from .report import gantt
        last = tl()[tl()["step"] == tl()["step"].max()]
        whatif = "; ".join(res.metrics.get("whatif", []))
        short = shortfall(res)
        gantt(last, gantt_path, title=f"{res.scenario.name}: {res.metrics.get('layout', '')}, step {len(res.step_bounds)}, "
                                      f"{res.metrics['step_time_s']:.3f} s{_likely_title(res)}, MFU {res.metrics['mfu']:.1%}"
                                      + (f"\nhypothetical: DOES NOT FIT ({short})" if short else "")
                                      + (f"\nwhat-if: {whatif}" if whatif else ""))
    if trace_path:
        from .report import to_chrome_trace
        _warn_large_trace(tl(), trace_path)
        to_chrome_trace(tl(), trace_path, metadata={"scenario": res.scenario.name})
    if args.report:
        from .report.html import run_report
        print(f"wrote {run_report(res, args.report, interval=step_interval(res))}", file=sys.stderr)
    if args.json:
        print(json.dumps({**res.metrics, **fit_fields(res),
                          "step_interval": step_interval(res).as_dict(res.metrics["step_time_s"])}, default=float))
    else:
        print(summary_table(res))
        kernels_path = str(out / "kernels.csv") if args.per_kernel else None
        for label, path in (("gantt", gantt_path), ("trace", trace_path), ("kernels", kernels_path)):
            if path:
                print(f"  {label}: {path}")
    if args.profile:
        print(profile_table(res.profile, res.wall_time_s), file=sys.stderr)
    if res.metrics.get("memory_fits") is False:
        print(f"warning: the memory model says this layout does not fit: {res.metrics['memory_worst_stage']} needs "
              f"{-res.metrics['memory_margin_bytes'] / 1e9:.1f} GB more than the GPU's HBM "
              f"(`clustersim memory` for the terms)" + ("; --strict: exit 3" if args.strict else ""), file=sys.stderr)
        if args.strict:
            return 3
    return 0


def _warn_large_trace(timeline, path: str) -> None:
    """Say on stderr how large a plain-JSON trace will be when it passes LARGE_TRACE_BYTES,
    and that a ``.json.gz`` name writes it compressed (Perfetto opens both)."""
    from .report.trace import LARGE_TRACE_BYTES, estimate_trace_bytes

    if path.endswith(".gz"):
        return
    size = estimate_trace_bytes(timeline)
    if size > LARGE_TRACE_BYTES:
        print(f"clustersim: the trace {path} will be about {fmt_bytes(size)} of JSON ({len(timeline):,} events); "
              f"a name ending in .gz (--trace {Path(path).stem}.json.gz) writes it gzip-compressed, "
              f"about 20x smaller, and Perfetto and chrome://tracing open it as it is", file=sys.stderr)


def profile_table(profile: dict, total_s: float) -> str:
    """Where a run's wall time went (``clustersim run --profile``, on stderr)."""
    lines = [f"wall time {total_s:.2f} s:"]
    for key, label in (("load", "scenario and cluster graph"), ("program", "step program"),
                       ("fold", "folding"), ("event_loop", "event loop"), ("solver", "  of which max-min solves"),
                       ("timeline_metrics", "timeline and metrics")):
        v = profile.get(key, 0.0)
        line = f"  {label:<28} {v:8.3f} s  {v / total_s if total_s > 0 else 0.0:6.1%}"
        if key == "solver" and profile.get("solves"):
            line += f"  ({profile['solves']:,} solves, {profile['solve_cache_hits'] / profile['solves']:.0%} from the cache)"
        lines.append(line)
    return "\n".join(lines)


def _print_memory(args) -> int:
    """``clustersim memory``: the verdict first, then each stage's terms (or JSON); with
    ``--strict``, exit 3 when a stage does not fit, as ``run --strict`` does."""
    from .scenario import load_scenario

    sc = load_scenario(_scenario_spec(args))
    ests = sc.memory_estimates()
    hbm = sc.usable_hbm_bytes
    fits = all(e.fits(hbm) for e in ests)
    if args.json:
        print(json.dumps([e.to_dict() for e in ests], indent=1, default=str))
    else:
        print(memory_headline(ests, hbm) + "\n")
        head = "" if not sc.hbm_headroom else f", {sc.hbm_headroom:.0%} kept free: {hbm / 2**30:.0f} GiB usable"
        print(f"{sc.name}: {sc.model.name} on {sc.cluster.num_gpus} x {sc.cluster.gpu.name} "
              f"({sc.cluster.gpu.hbm_bytes / 2**30:.0f} GiB{head}), {sc.parallel.describe()}, {sc.parallel.schedule}, "
              f"{sc.precision}, {sc.memory_accounting} accounting\n")
        for e in ests:
            print(e.format_table())
            print("  -> " + e.verdict(hbm) + "\n")
    if not fits and args.strict:
        print("clustersim: --strict: the memory model says this layout does not fit; exit 3", file=sys.stderr)
        return 3
    return 0


def memory_headline(ests, hbm: float) -> str:
    """One line before the terms: every stage fits (with the tightest one's margin), or how
    many do not and the worst one's shortfall, in GB (10^9 bytes, as the terms)."""
    worst = max(ests, key=lambda e: e.total_bytes)
    over = [e for e in ests if not e.fits(hbm)]
    n = len(ests)
    if not over:
        which = "the pipeline stage fits" if n == 1 else f"all {n} pipeline stages fit"
        return (f"FITS: {which} in {hbm / 1e9:.1f} GB of HBM; tightest: {worst.where}, "
                f"{(hbm - worst.total_bytes) / 1e9:.1f} GB to spare")
    which = "the pipeline stage exceeds" if n == 1 else f"{len(over)} of {n} pipeline stages exceed"
    return (f"DOES NOT FIT: {which} {hbm / 1e9:.1f} GB of HBM; worst: {worst.where} needs "
            f"{worst.total_bytes / 1e9:.1f} GB, {(worst.total_bytes - hbm) / 1e9:.1f} GB over")


def _print_schedule(args) -> None:
    from workloads.schedules import (ActionCosts, default_vpp, format_action, format_legend, format_table, get_schedule, peak_in_flight,
                                     schedule_timing, validate, validate_schedule_config)

    try:
        f, b, w = (float(x) for x in args.costs.split(","))
    except ValueError:
        raise ConfigError("--costs", args.costs, "expected three numbers F,B,W") from None
    # a V schedule (zb_v) holds two chunks per stage by definition: without --vpp it gets them;
    # DualPipe's two chunks are its own placement (vpp 1), as for every other schedule
    vpp = args.vpp if args.vpp is not None else default_vpp(args.schedule)
    validate_schedule_config(args.schedule, args.pp, args.microbatches, vpp, where="schedule")
    sched = get_schedule(args.schedule)(args.pp, args.microbatches, vpp)
    validate(sched)
    print(f"{args.schedule}: pp={args.pp}, micro-batches={args.microbatches}, vpp={vpp}")
    if args.list:
        for s, row in enumerate(sched.actions):
            print(f"stage {s}: " + " ".join(format_action(a, sched.num_chunks > 1) for a in row if a is not None))
    else:
        print(format_table(sched))
    print(format_legend(sched, timed=not args.list), end="")
    t = schedule_timing(sched, ActionCosts(f=f, b=b, w=w))
    print(f"\nstep {t.step_time:g} (F={f:g}, B={b:g}, W={w:g} per chunk, free communication), "
          f"bubble {t.bubble_fraction:.1%} of the step on the worst stage")
    print("activations held at peak (micro-batch chunks) per stage: " + " ".join(map(str, peak_in_flight(sched))))


def _executor_args(p) -> None:
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: the CPU count)")
    p.add_argument("--dask", metavar="ADDRESS", help="run on a Dask cluster: a scheduler address, or 'local' "
                                                     "for a LocalCluster of --workers processes")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _sweep(args) -> int:
    import pandas as pd

    from .explore.sweep import Store, config_hash, load_sweep, make_executor, run_points
    configs = load_sweep(args.sweep)
    db = Path(args.db) if args.db else Path("results") / "sweeps" / (Path(args.sweep).stem + ".sqlite")
    store = Store(db)
    with make_executor(args.dask, args.workers) as ex:
        counts = run_points(configs, store, ex, progress=not args.no_progress, retry_failed=args.retry_failed,
                            timeout_s=args.point_timeout)
    rows = store.rows({config_hash(c) for c in configs})
    print(f"{counts['total']} points: {counts['skipped']} already finished, {counts['ok']} ok, "
          f"{counts['failed']} failed now; database {db}")
    flat = []
    for r in rows:
        row = {"hash": r["hash"], "status": r["status"], "wall_s": r["wall_s"]}
        row.update(pd.json_normalize(r["config"], sep=".").iloc[0].to_dict())
        for k, v in (r["metrics"] or {}).items():
            if isinstance(v, dict):
                row.update({f"{k}.{a}": b for a, b in v.items()})
            else:
                row[k] = v
        row["error"] = r["error"]
        flat.append(row)
    df = pd.DataFrame(flat)
    notes = _add_sweep_intervals(df, rows)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(args.out, index=False)
        print(f"wrote {args.out}")
    varying = [c for c in df.columns if c not in ("hash", "status", "wall_s", "error") and "." in c
               and not c.startswith(("exposed_comm_s", "metrics")) and df[c].astype(str).nunique() > 1]
    show = [c for c in varying if not c.startswith(("step_time", "mfu"))] + \
        [c for c in ("status", "step_time_s", "likely_s", "mfu") if c in df.columns]
    if not df.empty:
        print(df[show].to_string(index=False))
        print("\n".join(notes))
    # why each failed point failed, and the same exit status on a first run and on a resume:
    # what decides it is the points' recorded status, not what ran this time
    bad = df[df["status"] != "ok"] if not df.empty else df
    if len(bad):
        print(f"\n{len(bad)} of {len(df)} points did not run:", file=sys.stderr)
        for _, r in bad.iterrows():
            where = ", ".join(f"{c}={r[c]}" for c in varying if not c.startswith(("step_time", "mfu")))
            print(f"  [{r['status']}] {where or r['hash'][:10]}: {r['error']}", file=sys.stderr)
        if counts["skipped"] and not args.retry_failed:
            print("  (recorded by an earlier run; --retry-failed runs them again)", file=sys.stderr)
    return 0 if len(bad) == 0 else 1


def _add_sweep_intervals(df, rows) -> list[str]:
    """``likely_low_s`` / ``likely_high_s`` / ``comparable_runs`` per sweep point (from its
    stack, GPU, GPU count and model), ``likely_s`` as text for the table; the note lines."""
    import math

    from .validation.intervals import SIGN_NOTE, mapping_interval
    if df.empty:
        return []
    ivs = [mapping_interval(r["config"]) for r in rows]
    step = df["step_time_s"] if "step_time_s" in df.columns else [math.nan] * len(df)
    b = [iv.bounds(s) if isinstance(s, float) and not math.isnan(s) else None for iv, s in zip(ivs, step)]
    df["likely_low_s"] = [x[0] if x else math.nan for x in b]
    df["likely_high_s"] = [x[1] if x else math.nan for x in b]
    df["comparable_runs"] = [iv.rows for iv in ivs]
    df["likely_s"] = [_likely_cell({"likely_low_s": x[0], "likely_high_s": x[1]}) if x else "none" for x in b]
    distinct = list({(iv.stratum, iv.basis): iv for iv in ivs}.values())
    return [interval_note("likely_s" if len(distinct) == 1 else f"likely_s ({iv.stratum})", iv, sign=False)
            for iv in distinct] + [f"{SIGN_NOTE} (docs/accuracy.md)"]


def _search(args) -> int:
    from .scenario import read_yaml
    from .explore.search import SearchSpec, plot_search, search
    from .explore.sweep import Store, make_executor
    path = Path(args.search)
    raw = read_yaml(path, "search")
    if args.simulate is not None:
        raw = {**raw, "simulate": args.simulate if args.simulate == "all" else _int_arg(args.simulate)}
    spec = SearchSpec.from_dict(raw)
    store = Store(args.db) if args.db else None
    with make_executor(args.dask, args.workers) as ex:
        out = search(spec, executor=ex, store=store, progress=not args.no_progress and not args.json,
                     timeout_s=args.point_timeout)
    table, counts, timing = out["table"], out["counts"], out["timing"]
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        head = spec.scenario.get("hbm_headroom", 0.0)
        head = head if isinstance(head, (int, float)) and 0 <= head < 1 else 0.0    # a bad one: every candidate invalid
        plot_search(table, args.plot, title=f"{path.stem}: step time vs memory",
                    hbm_gb=out["cluster"].gpu.hbm_bytes * (1 - head) / 1e9)
    if args.emit:
        _emit_best(out, args.emit, path)
    iv = _add_search_interval(table, spec)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, index=False)
    ok = table[table["rank"] > 0].head(args.top)
    if args.json:
        print(json.dumps([_search_row(r) for _, r in ok.iterrows()], indent=1))
        return 0
    print(f"{counts['candidates']} candidates: {counts['invalid']} invalid, {counts['oom']} out of memory, "
          f"{counts['ok']} feasible ({timing['screened_per_s']:.0f} screened/s); "
          f"{counts['simulated']} simulated in {timing['simulate_s']:.1f} s")
    print(SEARCH_KEY)
    print(interval_note("'likely s'", iv))
    print(f"{'#':>3} {'tp':>3} {'cp':>3} {'pp':>3} {'dp':>4} {'ep':>3} {'etp':>3} {'mbs':>3} {'schedule':<21} "
          f"{'recompute':<9} {'zero':>4} {'mem GB':>7} {'step s':>8} {'likely s':>13} {'MFU':>6} {'from':<4} "
          f"{'est s':>8}  exposed comm (sim)")
    for _, r in ok.iterrows():
        sched = r["schedule"] + (f" vpp{r['vpp']}" if r["vpp"] > 1 else "")
        exp = r["exposed_comm_s"] if isinstance(r["exposed_comm_s"], dict) else {}
        note = " ".join(f"{k} {v:.2f}s" for k, v in sorted(exp.items()) if v > 0.005)
        if r["sim_status"] in ("timeout", "error"):
            note = f"simulation {r['sim_status']}: ranked by its estimate"
        print(f"{r['rank']:>3} {r['tp']:>3} {r['cp']:>3} {r['pp']:>3} {r['dp']:>4} {r['ep']:>3} {r['etp']:>3} "
              f"{r['micro_batch_size']:>3} {sched:<21} {r['recompute']:<9} {r['zero_stage']:>4} "
              f"{r['memory_gb']:>7.1f} {r['step_s']:>8.3f} {_likely_cell(r):>13} {r['mfu']:>6.1%} {r['source']:<4} "
              f"{r['est_step_s']:>8.3f}  {note}".rstrip())
    if args.plot:
        print(f"wrote {args.plot}")
    if args.emit:
        print(f"wrote {args.emit}: #1 as a scenario (clustersim run {args.emit})")
    return 0


def _add_search_interval(table, spec):
    """``likely_low_s`` / ``likely_high_s`` / ``comparable_runs`` on every candidate of a search
    (one interval: the candidates share the model, the cluster and the kernel stack)."""
    from .validation.intervals import mapping_interval
    iv = mapping_interval({"model": spec.model, "cluster": spec.cluster, **spec.scenario})
    table["likely_low_s"] = table["step_s"] * iv.low if iv.known else float("nan")
    table["likely_high_s"] = table["step_s"] * iv.high if iv.known else float("nan")
    table["comparable_runs"] = iv.rows
    return iv


def interval_note(what: str, iv, sign: bool = True) -> str:
    """The line that says what an interval column is, its basis and (``sign``) the error's sign."""
    from .validation.intervals import SIGN_NOTE
    if not iv.known:
        text = f"{what}: none, no comparable measurements ({iv.stratum}: {iv.basis})"
    else:
        text = (f"{what}: the {iv.level_text()} of the measured step from {iv.rows} comparable measured runs "
                f"({iv.stratum}; {iv.basis})")
    return text + (f"; {SIGN_NOTE} (docs/accuracy.md)" if sign else "")


def _likely_cell(r) -> str:
    """``8.3-9.6`` (seconds) or ``none``."""
    import math
    lo, hi = r.get("likely_low_s"), r.get("likely_high_s")
    if lo is None or (isinstance(lo, float) and math.isnan(lo)):
        return "none"
    from .validation.intervals import _sec
    return f"{_sec(lo)}-{_sec(hi)}"


#: The line above ``clustersim search``'s table: how its numbers were obtained.
SEARCH_KEY = ("ranked: the simulated layouts by simulated step time, then the others by the closed-form estimate\n"
              "'step s' and 'MFU' come from 'from' (sim: simulated, est: estimate only); 'est s': every row's "
              "estimate; 'mem GB': the memory model")


def _search_row(r) -> dict:
    """One ranked candidate of ``search --json``: the numbers it is ranked by with their
    ``source``, and the estimate and simulation apart (None where there is none)."""
    import math

    from .explore.search import KNOBS

    def num(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    return {"rank": int(r["rank"]),
            "parallel": {k: (int(r[k]) if k not in ("schedule", "recompute") else r[k]) for k in KNOBS},
            "memory_gb": num(r["memory_gb"]), "source": r["source"],
            "step_time_s": num(r["step_s"]), "mfu": num(r["mfu"]),
            "likely_low_s": num(r.get("likely_low_s")), "likely_high_s": num(r.get("likely_high_s")),
            "comparable_runs": int(r.get("comparable_runs", 0)),
            "est_step_time_s": num(r["est_step_s"]), "est_mfu": num(r["est_mfu"]),
            "sim_step_time_s": num(r["sim_step_s"]), "sim_mfu": num(r["sim_mfu"]),
            "sim_status": r["sim_status"] or None,
            "exposed_comm_s": r["exposed_comm_s"] if isinstance(r["exposed_comm_s"], dict) else None}


def _emit_best(out: dict, dest: str, search_path: Path) -> None:
    """``search --emit FILE``: rank 1 as a scenario ``clustersim run`` takes (the search's
    model, cluster and scenario keys with the winning layout)."""
    import yaml

    if out["best"] is None:
        raise ConfigError("--emit", dest, "the search found no feasible layout to write")
    r = out["table"].iloc[0]
    how = (f"simulated step {r['sim_step_s']:.6g} s" if r["source"] == "sim" else
           f"estimate only ({r['est_step_s']:.6g} s; not simulated, so `clustersim run` may differ)")
    head = (f"# Rank 1 of `clustersim search {search_path}`: {how}.\n"
            f"# Run it with: clustersim run {dest}\n")
    scenario = {"name": f"{search_path.stem}-best", **out["best"]}
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    Path(dest).write_text(head + yaml.safe_dump(scenario, sort_keys=False))


def _int_arg(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise ConfigError("--simulate", v, "must be an integer or 'all'") from None


def _validate(args) -> int:
    from .validation import main as validate_main
    argv = ([args.runs] if args.runs else []) + (["--set", args.set_name] if args.set_name else []) + \
        (["--limit", str(args.limit)] if args.limit is not None else []) + \
        (["--out", args.out] if args.out else []) + \
        (["--max-gpus", str(args.max_gpus)] if args.max_gpus is not None else []) + \
        (["--plot", args.plot] if args.plot else []) + ["--workers", str(args.workers)] + \
        (["--quiet"] if args.quiet else [])
    return validate_main(argv)


def _scaleup_label(gpu) -> str:
    if gpu.scaleup_topology == "mesh":
        return f"mesh of {gpu.nvlink_domain_size}, {gpu.nvlink_bandwidth_bytes_per_s / 1e9:g} GB/s per link"
    return f"switch of {gpu.nvlink_domain_size}, {gpu.nvlink_bandwidth_bytes_per_s / 1e9:g} GB/s per GPU"


def _count(x: float) -> str:
    """A parameter count: 671 B, 1.03 T, 4.46 M."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:,.0f}"


def _hbm(x: float) -> str:
    t = x / 2**40
    return (f"{t:.3g} TiB" if t < 1000 else f"{t:,.0f} TiB") if x >= 2**40 else fmt_bytes(x)


def preset_rows() -> dict[str, list[list[str]]]:
    """What ``presets`` prints: per cluster preset its GPUs, model and HBM; per GPU its HBM,
    peaks and scale-up; per model its parameters (total and active)."""
    from topologies.cluster import checked_spec
    from topologies.specs import GPU_SPECS
    from workloads import MODEL_PRESETS, load_model

    clusters = [["cluster", "GPUs", "GPU", "HBM per GPU", "HBM in all"]]
    for name in CLUSTER_PRESETS:
        spec = checked_spec(name)
        clusters.append([name, f"{spec.num_gpus:,}", spec.gpu.name, fmt_bytes(spec.gpu.hbm_bytes),
                         _hbm(spec.gpu.hbm_bytes * spec.num_gpus)])
    gpus = [["GPU", "HBM", "HBM TB/s", "BF16 TFLOP/s", "FP8 TFLOP/s", "scale-up", "power"]]
    for g in GPU_SPECS.values():
        fp8 = g.peak_flops.get("fp8")
        gpus.append([g.name, fmt_bytes(g.hbm_bytes), f"{g.hbm_bandwidth_bytes_per_s / 1e12:g}",
                     f"{g.peak_flops['bf16'] / 1e12:g}", "-" if fp8 is None else f"{fp8 / 1e12:g}",
                     _scaleup_label(g), f"{g.power_w:g} W" if g.power_w else "-"])
    models = [["model", "parameters", "active"]]
    for name in MODEL_PRESETS:
        m = load_model(name)
        total, active = m.num_params(), m.num_active_params()
        models.append([name, _count(total), _count(active) if active != total else "-"])
    return {"clusters": clusters, "gpus": gpus, "models": models}


def _presets(args) -> int:
    rows = preset_rows()
    if getattr(args, "json", False):
        print(json.dumps({k: [dict(zip(v[0], r)) for r in v[1:]] for k, v in rows.items()}, indent=1))
        return 0
    for i, (title, table) in enumerate(rows.items()):
        widths = [max(len(r[j]) for r in table) for j in range(len(table[0]))]
        print(("\n" if i else "") + f"{title}:")
        for r in table:
            print("  " + "  ".join(c.ljust(w) if j == 0 or j == 2 and title != "gpus" else c.rjust(w)
                                   for j, (c, w) in enumerate(zip(r, widths))).rstrip())
    return 0


def _topo(args) -> int:
    c = _load_cluster(args.cluster, args.set)
    print(c.summary())
    if args.route:
        r = c.route(*args.route)
        for link, coef in zip(r.links, r.coefs):
            u, v = c.link_nodes[link]
            print(f"  {u} -> {v}  {c.link_capacity[link] / 1e9:g} GB/s" + (f" x{coef:.3g}" if coef != 1 else ""))
    return 0


def _collectives(args) -> int:
    c = _load_cluster(args.cluster, args.set)
    sizes = [parse_size(s.strip(), "--sizes") for s in args.sizes.split(",")]
    rows = collective_table(c, sizes)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(c.summary() + "\n")
        _print_table(rows)
    return 0


def _demo(_args) -> int:
    c = build_cluster("dgx-h100", num_nodes=4)
    print(c.summary() + "\n")
    _print_table(collective_table(c, [2**20, 64 * 2**20, 2**30]))
    _contention_demo(c)
    return 0


def _schedule(args) -> int:
    _print_schedule(args)
    return 0


def _compare(args) -> int:
    """``clustersim compare A.yaml [B.yaml ...] [--set k=v ...] [--out DIR]``: every scenario,
    plus the first with the ``--set`` overrides when there are any, run and compared."""
    import copy

    import pandas as pd

    from .engine import run
    from .report.compare import (aligned_gantts, breakdown_comparison, comparison_table, critical_path_table,
                                 shown_table)
    from .scenario import read_yaml

    specs, names = [], []
    for path in args.scenarios:
        sc = read_yaml(path, "scenario", "a mapping of sections")
        sc.setdefault("name", Path(path).stem)
        specs.append(sc)
        names.append(str(sc["name"]))
    if args.set:
        variant = copy.deepcopy(specs[0])
        _apply_sets(variant, args.set)
        variant["name"] = f"{names[0]} + {', '.join(args.set)}"
        specs.append(variant)
        names.append(variant["name"])
    if len(specs) < 2:
        raise ConfigError("compare", args.scenarios, "needs two scenarios, or one with --set overrides")
    if len(set(names)) < len(names):
        names = [f"{i + 1}: {n}" for i, n in enumerate(names)]
    results = []
    for spec, name in zip(specs, names):
        if not args.quiet:
            print(f"running {name} ...", file=sys.stderr)
        results.append(run(spec, progress=not args.quiet))
    from .validation.intervals import result_interval
    table = comparison_table(results, names, [result_interval(r) for r in results])
    crit = critical_path_table(results, names)
    if args.json:
        print(json.dumps({"runs": table.to_dict(orient="records"),
                          "critical_path_s": {k: v for k, v in crit.to_dict(orient="index").items()}}, indent=1,
                         default=float))
    else:
        for i, (n, r) in enumerate(zip(names, results)):
            print(f"[{i + 1}] {n}: {r.scenario.model.name} on {r.metrics['num_gpus']} x {r.scenario.cluster.gpu.name}, "
                  f"{_layout(r)}")
        cols = [f"[{i + 1}]" for i in range(len(names))]
        shown = shown_table(table.drop(columns=["scenario", "layout"]).T, cols)
        crit_shown = shown_table(crit.drop(columns=[c for c in crit.columns if c.startswith("delta_")]), cols)
        with pd.option_context("display.width", 200, "display.max_columns", 30):
            print("\n" + shown.to_string())
            print(compare_interval_note(results))
            print("\nthe critical path (the compute stream of the cell that finishes last), seconds per op "
                  "and per idle reason, largest change first:")
            print(crit_shown.to_string())
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "compare.csv", index=False)
        crit.to_csv(out / "critical_path.csv")
        breakdown_comparison(results, names, out / "breakdown.png")
        aligned_gantts(results, names, out / "gantt.png")
        for i, r in enumerate(results):
            (out / f"metrics_{i + 1}.json").write_text(json.dumps(r.metrics, indent=1, default=float))
        print(f"\nwrote {out}/compare.csv, critical_path.csv, breakdown.png, gantt.png, metrics_*.json", file=sys.stderr)
    if args.report:
        from .report.html import compare_report
        print(f"wrote {compare_report(results, names, args.report, [result_interval(r) for r in results])}", file=sys.stderr)
    return 0


def compare_interval_note(results) -> str:
    """What ``likely_low_s`` / ``likely_high_s`` are, once, and each run's stratum."""
    from .validation.intervals import SIGN_NOTE, result_interval
    lines = ["\nlikely_low_s - likely_high_s: the 80 % interval of the measured step, from the validation residuals "
             f"of comparable measured runs (docs/accuracy.md); {SIGN_NOTE}"]
    for i, r in enumerate(results):
        iv = result_interval(r)
        lines.append(f"  [{i + 1}] {iv.short(r.metrics['step_time_s'])} ({iv.stratum}; {iv.basis})")
    return "\n".join(lines)


def _layout(res) -> str:
    from .report.compare import layout_label
    return layout_label(res)


def _goodput(args) -> int:
    from .goodput.cli import goodput_command
    from .validation.intervals import scenario_interval
    args.likely = lambda sc, step_s: scenario_interval(sc).short(step_s)     # the simulated step's interval
    return goodput_command(args, _scenario_spec(args))


COMMANDS = {"run": _run, "compare": _compare, "validate": _validate, "presets": _presets, "topo": _topo, "collectives": _collectives,
            "memory": _print_memory, "schedule": _schedule, "sweep": _sweep, "search": _search, "demo": _demo,
            "goodput": _goodput}
"""Subcommand -> its handler (returns the exit status)."""


def _scenario_args(p) -> None:
    """``--set`` and ``--model-config``: what ``run`` and ``memory`` change in a scenario file."""
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field by its dotted key (parallel.pp=8, cluster.num_nodes=4); repeatable")
    p.add_argument("--model-config", metavar="FILE",
                   help="the model from a Hugging Face config.json (or its folder), a YAML model mapping, or a "
                        "text file of Megatron-LM arguments; the scenario's other model keys apply on top")


def _add_simulate(sub) -> None:
    """The commands that simulate: a scenario, several side by side, or a table of measured runs."""
    c = sub.add_parser("compare", help="run several scenarios (or one and its --set variant) and compare them")
    c.add_argument("scenarios", nargs="+", help="scenario YAMLs; the first is the reference")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="add a variant of the first scenario with these dotted-key overrides; repeatable")
    c.add_argument("--out", metavar="DIR", help="write compare.csv, critical_path.csv, breakdown.png, gantt.png")
    c.add_argument("--json", action="store_true", help="print the table and the critical path as JSON")
    c.add_argument("--report", metavar="HTML", help="write one self-contained HTML page with the comparison")
    c.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p = sub.add_parser("run", help="simulate a scenario and print its summary")
    p.add_argument("scenario", help="scenario YAML")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    _scenario_args(p)
    p.add_argument("--gantt", metavar="PNG", help="write a Gantt chart of the reported step")
    p.add_argument("--report", metavar="HTML", help="write one self-contained HTML page to share the run")
    p.add_argument("--trace", metavar="JSON",
                   help="write a Chrome/Perfetto trace; a name ending in .gz (trace.json.gz) writes it gzip-compressed, "
                        "which Perfetto and chrome://tracing open directly")
    p.add_argument("--out", metavar="DIR", help="write metrics.json, timeline.csv, gantt.png, trace.json here")
    p.add_argument("--no-fold", action="store_true",
                   help="simulate every rank and flow on its own (the exact unfolded reference; slow at scale)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr during long runs")
    p.add_argument("--approx", action="append", default=[], metavar="NAME",
                   help="turn on an opt-in approximation (repeatable): coupled_all_to_all")
    p.add_argument("--profile", action="store_true",
                   help="print where the wall time went (graph, program, folding, event loop, solver) on stderr")
    p.add_argument("--strict", action="store_true",
                   help="exit 3 when the memory model says the layout does not fit the GPU's HBM (the run still "
                        "reports its step time; a warning goes to stderr either way)")
    p.add_argument("--per-rank", action="store_true",
                   help="expand the timeline to every rank (a folded run keeps one row per rank cell): the "
                        "Gantt chart and trace then show every rank, --out adds timeline_ranks.csv; large at scale "
                        "(--ranks / --stages keep it small enough for Perfetto)")
    p.add_argument("--per-kernel", action="store_true",
                   help="with --out: also write kernels.csv, the kernels each compute op of the timeline stands "
                        "for (per kind of layer: segment, kernel, shape, FLOPs, bytes, modelled time)")
    p.add_argument("--ranks", metavar="LIST", help="with --per-rank: only these ranks, e.g. 0-7,64 (implies --per-rank)")
    p.add_argument("--stages", metavar="LIST",
                   help="with --per-rank: only the ranks of these pipeline stages, e.g. 0,15 (implies --per-rank)")
    p.add_argument("--timeline", choices=("auto", "full", "stream"), default="auto",
                   help="full: a timeline row per op of every rank cell; stream: per-rank summaries (--out: "
                        "rank_summary.csv) and full rows only for --ranks / --stages, same metrics; auto (default): "
                        "stream only when the full timeline would not fit in memory")
    p = sub.add_parser("validate", help="predict measured runs (published-runs or vTrain CSV, or a shipped set) "
                                        "and report errors")
    p.add_argument("runs", nargs="?", help="CSV of measured runs (or --set NAME)")
    p.add_argument("--set", dest="set_name", metavar="NAME",
                   help="a shipped reference set of measured runs instead of a CSV: h100, blackwell, vtrain, "
                        "vtrain_single (from a source checkout)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N rows")
    p.add_argument("--out", metavar="CSV", help="write one prediction row per input row")
    p.add_argument("--max-gpus", type=int, default=None, help="report larger runs as unsupported instead of simulating")
    p.add_argument("--plot", metavar="PNG", help="write a log-log scatter of predicted vs measured step time")
    p.add_argument("--workers", type=int, default=1, help="rows simulated at once, one process each")
    p.add_argument("--quiet", action="store_true", help="no per-row lines and no progress bar: the summary only")


def _add_inspect(sub) -> None:
    """The commands that look at one part: presets, a cluster, its collectives, a schedule, memory."""
    pp = sub.add_parser("presets", help="list cluster, GPU and model presets with their sizes")
    pp.add_argument("--json", action="store_true", help="print the tables as JSON")
    p = sub.add_parser("topo", help="summarise a cluster (preset name or YAML)")
    p.add_argument("cluster", help=f"preset ({', '.join(CLUSTER_PRESETS)}) or YAML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a cluster field")
    p.add_argument("--route", nargs=2, type=int, metavar=("SRC", "DST"), help="print the route between two GPUs")
    p = sub.add_parser("collectives", help="time typical collectives on an idle cluster")
    p.add_argument("cluster", nargs="?", default="dgx-h100")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--sizes", default="1MiB,64MiB,1GiB", help="comma-separated message sizes")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p = sub.add_parser("schedule", help="print a pipeline schedule's action table and bubble")
    p.add_argument("--schedule", default="1f1b", help="gpipe | 1f1b | interleaved_1f1b | zb_h1 | dualpipe | zb_v")
    p.add_argument("--pp", type=int, default=4, help="pipeline stages")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per step")
    p.add_argument("--vpp", type=int, default=None,
                   help="model chunks per stage: >= 2 for interleaved_1f1b; default 1, and 2 for zb_v (its V)")
    p.add_argument("--costs", default="1,1,1", metavar="F,B,W",
                   help="per-chunk forward, input-gradient and weight-gradient costs for the bubble")
    p.add_argument("--list", action="store_true", help="one line of actions per stage instead of the timed table")
    p = sub.add_parser("memory", help="per-stage memory breakdown of a scenario and the OOM verdict")
    p.add_argument("scenario", help="scenario YAML (model, cluster, parallel, precision, ...)")
    p.add_argument("--json", action="store_true", help="print the per-stage terms as JSON")
    _scenario_args(p)
    p.add_argument("--strict", action="store_true", help="exit 3 when a stage does not fit the GPU's HBM")
    sub.add_parser("demo", help="the default demo: a 32-GPU H100 cluster, its collectives and contention")
    from .goodput.cli import add_parser as _add_goodput
    _scenario_args(_add_goodput(sub))


def _add_explore(sub) -> None:
    """The commands that explore many layouts: sweeps and search."""
    p = sub.add_parser("sweep", help="run a grid or list of scenarios (resumable; local processes or Dask)")
    p.add_argument("sweep", help="sweep YAML: base scenario + grid or points")
    _executor_args(p)
    p.add_argument("--db", metavar="SQLITE", help="results database (default results/sweeps/<name>.sqlite)")
    p.add_argument("--out", metavar="CSV", help="export this sweep's rows")
    p.add_argument("--retry-failed", action="store_true", help="run failed points again (finished ones are skipped)")
    p.add_argument("--point-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop a point that runs longer and record it as 'timeout' (run again with --retry-failed)")
    p = sub.add_parser("search", help="search parallel layouts: prune by memory, estimate, simulate the best")
    p.add_argument("search", help="search YAML: model, cluster, global_batch_size, fixed, bounds, simulate")
    _executor_args(p)
    p.add_argument("--simulate", metavar="K", help="simulate the best K by estimate ('all': every feasible one)")
    p.add_argument("--top", type=int, default=10, metavar="K", help="rows to print (default 10)")
    p.add_argument("--json", action="store_true", help="print the ranked candidates as a JSON list")
    p.add_argument("--db", metavar="SQLITE", help="database of simulated candidates (resumable)")
    p.add_argument("--out", metavar="CSV", help="write every candidate (status, reason, memory, estimate, simulation)")
    p.add_argument("--plot", metavar="PNG", help="step time vs memory, coloured by tp x pp, Pareto set marked")
    p.add_argument("--emit", metavar="YAML", help="write the #1 layout as a scenario for `clustersim run`")
    p.add_argument("--point-timeout", type=float, default=None, metavar="SECONDS",
                   help="stop a candidate's simulation that runs longer; it keeps its estimate, marked 'timeout'")


def parser() -> argparse.ArgumentParser:
    """The ``clustersim`` argument parser (every subcommand of :data:`COMMANDS`)."""
    ap = argparse.ArgumentParser(prog="clustersim", description="Discrete-event simulator of LLM training clusters.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    _add_simulate(sub)
    _add_inspect(sub)
    _add_explore(sub)
    return ap


#: What each subcommand writes, by option: a folder it creates (with its parents), a file in
#: a folder that must exist, or a file whose folders it creates.  Checked before any work.
_FOLDER, _FILE, _FILE_MKDIR = "folder", "file", "file, folders made"
OUTPUTS = {"run": {"out": _FOLDER, "gantt": _FILE, "trace": _FILE, "report": _FILE},
           "compare": {"out": _FOLDER, "report": _FILE},
           "sweep": {"db": _FILE_MKDIR, "out": _FILE_MKDIR},
           "search": {"db": _FILE_MKDIR, "out": _FILE_MKDIR, "plot": _FILE_MKDIR, "emit": _FILE_MKDIR},
           "validate": {"out": _FILE_MKDIR, "plot": _FILE_MKDIR},
           "goodput": {"out": _FOLDER, "report": _FILE}}


def check_outputs(args) -> None:
    """ConfigError for the first output path of ``args`` (see :data:`OUTPUTS`) that cannot
    be written, so a long run does not end in a traceback."""
    for name, kind in OUTPUTS.get(args.cmd, {}).items():
        value = getattr(args, name, None)
        if value:
            _check_output(str(value), "--" + name, kind)


def _check_output(value: str, flag: str, kind: str) -> None:
    p = Path(value)
    if kind == _FOLDER and p.exists() and not p.is_dir():
        raise ConfigError(flag, value, "exists and is not a folder")
    if kind != _FOLDER and p.is_dir():
        raise ConfigError(flag, value, "is a folder; give a file name")
    if kind != _FOLDER and p.exists() and not os.access(p, os.W_OK):
        raise ConfigError(flag, value, "the file is not writable")
    folder = p if kind == _FOLDER else p.parent
    near = folder
    while not near.exists() and near != near.parent:
        near = near.parent
    if not near.is_dir():
        raise ConfigError(flag, value, f"'{near}' is not a folder")
    if near != folder and kind == _FILE:
        raise ConfigError(flag, value, f"folder '{folder}' does not exist")
    if not os.access(near, os.W_OK | os.X_OK):
        raise ConfigError(flag, value, f"folder '{near}' is not writable")
    try:                    # permissions can say yes where a write fails (root on /proc, a read-only mount)
        with tempfile.TemporaryFile(dir=near):
            pass
    except OSError as e:
        raise ConfigError(flag, value, f"cannot write in '{near}' ({e.strerror})") from None


def main(argv: list[str] | None = None) -> int:
    """Run ``clustersim`` with ``argv``; returns the exit status (see the module docstring)."""
    args = parser().parse_args(argv)
    try:
        check_outputs(args)
        return COMMANDS[args.cmd](args)
    except ConfigError as e:
        print(f"clustersim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("clustersim: interrupted; finished points are saved, run the same command again to resume",
              file=sys.stderr)
        return 130
    except (SimulationError, CollectiveError) as e:
        # CollectiveError: the program's collectives do not match up (an internal
        # inconsistency the engine caught); one line, as for any run that cannot finish
        print(f"clustersim: simulation failed: {e}", file=sys.stderr)
        return 1
    except JobStopped as e:
        # a what-if failure the job does not survive: the result is the stop itself
        done = e.progress()
        print(f"clustersim: {e}" + (f" ({done})" if done else ""), file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (`clustersim ... --json | head`): end quietly, as Unix tools
        # do; stdout is pointed at devnull so the interpreter's final flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141                          # 128 + SIGPIPE, what a shell reports for a killed writer


if __name__ == "__main__":
    sys.exit(main())
