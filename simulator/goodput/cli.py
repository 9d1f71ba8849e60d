"""``clustersim goodput``: time to train a scenario's layout for a number of tokens, with
failures, checkpoints and restarts (:mod:`simulator.goodput.model`)."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

from topologies import ConfigError

from .model import FailureCause, RunModel, monte_carlo, young_interval_s
from .rates import LLAMA3_CAUSES

__all__ = ["add_parser", "goodput_command", "CHECKPOINT_BYTES_PER_PARAM", "STORAGE_BYTES_PER_S",
           "STORAGE_NODE_BYTES_PER_S", "RESTART_S", "RESTART_COMM_S",
           "RESTART_FIXED_S", "RESTART_ALPHA", "restart_s",
           "REPAIR_H", "SWEEP_KEYS", "sweep_points"]

CHECKPOINT_BYTES_PER_PARAM = 14
"""BF16 weights (2 B), FP32 master weights (4 B) and Adam's two moments (8 B) per parameter:
what a mixed-precision Adam run saves to resume (gradients are not saved).  The command takes
the bytes from the scenario's memory model (:mod:`.checkpoint`); this is the quick estimate."""
STORAGE_BYTES_PER_S = 2e12
"""Aggregate checkpoint write bandwidth: the 2 TB/s sustained of Meta's Llama 3 training
storage (arXiv:2407.21783, §3.3.1, Tectonic; peak 7 TB/s).  Set yours with --storage-gbps."""
STORAGE_NODE_BYTES_PER_S = 25e9
"""Checkpoint write bandwidth of one node to storage: an assumption (25 GB/s, the line rate
of one 200 Gb/s storage port); set yours with --storage-node-gbps."""
RESTART_S = 600.0
"""From a failure to steps running again: detection, rescheduling, process start,
communicator set-up, checkpoint load and warm-up.  An assumption (10 minutes): no published
breakdown at scale; set yours with --restart-s."""
RESTART_COMM_S = 150.0
"""Of :data:`RESTART_S`, the communicator set-up at :data:`RESTART_REF_NODES`: about 2.5
minutes of NCCL initialisation that PyTorch's maintainers report at "above certain K GPUs"
(github.com/NVIDIA/nccl/issues/1156, 2024-01-23), taken at Llama 3's size; the rest
(:data:`RESTART_FIXED_S`) does not grow with the job.  Both an assumption beyond that one
report."""
RESTART_FIXED_S = RESTART_S - RESTART_COMM_S
RESTART_REF_NODES = 2048
"""The job size at which the restart is :data:`RESTART_S`: Llama 3's 16,384 GPUs."""
RESTART_ALPHA = 1.0
"""Growth of the communicator set-up with the node count, ``(nodes / 2048) ** alpha``: linear,
as NCCL's bootstrap all-gathers run over a ring of all ranks (an assumption; set yours with
--restart-alpha)."""
REPAIR_H = 48.0
"""From a node's failure until it is back in the spare pool: diagnosis, a part swapped or the
node replaced, burn-in.  An assumption (two days): set yours with --repair-h."""
SLOW_FACTOR = 1.5
"""Step time while a slow GPU is undetected, over the normal one: an assumption."""
DETECT_H = 1.0
"""Hours from a GPU turning slow to its detection (the detection policy): an assumption."""
SWEEP_KEYS = {"checkpoint_interval": str, "checkpoint_s": float, "storage_gbps": float, "storage_node_gbps": float,
              "restart_s": float,
              "failure_scale": float, "spares": str, "repair_h": float, "replicas": int, "slow_rate": float,
              "slow_factor": float, "detect_h": float}
"""What ``--sweep`` varies: the flags of the same names (dashes as underscores)."""


def add_parser(sub):
    """The ``goodput`` subparser (the caller adds the scenario overrides ``run`` takes)."""
    p = sub.add_parser("goodput", help="time to train for N tokens with failures, checkpoints and restarts "
                                       "(Monte Carlo on simpy)")
    p.add_argument("scenario", help="scenario YAML (its step is simulated unless --step-time is given)")
    p.add_argument("--tokens", type=float, required=True, help="tokens to train, e.g. 15e12")
    p.add_argument("--step-time", type=float, metavar="S", help="step time in seconds instead of simulating the step")
    p.add_argument("--checkpoint-interval", default="auto", metavar="S|auto",
                   help="productive seconds between checkpoints; auto: Daly's optimum for the job's MTBF (default)")
    p.add_argument("--checkpoint-s", type=float, metavar="S",
                   help="blocking time of one checkpoint write (default: the memory model's unique state over "
                        "--storage-gbps or its busiest node's share over --storage-node-gbps, the longer)")
    p.add_argument("--storage-gbps", type=float, default=STORAGE_BYTES_PER_S / 1e9,
                   help="aggregate checkpoint write bandwidth in GB/s (default 2000, Llama 3's storage)")
    p.add_argument("--storage-node-gbps", type=float, default=STORAGE_NODE_BYTES_PER_S / 1e9,
                   help=f"one node's checkpoint write bandwidth in GB/s (default {STORAGE_NODE_BYTES_PER_S / 1e9:g}, "
                        "an assumption)")
    p.add_argument("--async-checkpoint", action="store_true",
                   help="block only for the device-to-host copy; the write to storage (the time above) runs in "
                        "the background, and a failure before it completes rolls back to the previous checkpoint")
    p.add_argument("--host-copy-gbps", type=float, metavar="GBPS",
                   help="device-to-host copy bandwidth per GPU in GB/s for --async-checkpoint (default: the GPU's "
                        "PCIe x16 link x 0.8, an assumption)")
    p.add_argument("--restart-s", type=float, metavar="S",
                   help="seconds from a failure to steps running again, whatever the job's size (default: "
                        "--restart-fixed-s + --restart-comm-s x (nodes / 2048) ** --restart-alpha, 600 s at 2,048 "
                        "nodes)")
    p.add_argument("--restart-fixed-s", type=float, default=RESTART_FIXED_S,
                   help=f"part of a restart that does not grow with the job (default {RESTART_FIXED_S:g}, an assumption)")
    p.add_argument("--restart-comm-s", type=float, default=RESTART_COMM_S,
                   help=f"communicator set-up at 2,048 nodes (default {RESTART_COMM_S:g}, NCCL issue 1156)")
    p.add_argument("--restart-alpha", type=float, default=RESTART_ALPHA,
                   help=f"growth of the communicator set-up with nodes (default {RESTART_ALPHA:g}: linear)")
    p.add_argument("--failures", metavar="CSV", help="failure causes: columns name, kind, per (gpu, node or job), "
                                                     "rate_per_hour (default: Llama 3's Table 5 as rates)")
    p.add_argument("--failure-scale", type=float, default=1.0, help="multiply every failure rate (default 1)")
    p.add_argument("--spares", default="unlimited", metavar="N|unlimited",
                   help="hot spare nodes; a hardware failure waits for a repaired node when none is ready "
                        "(default unlimited)")
    p.add_argument("--repair-h", type=float, default=REPAIR_H,
                   help=f"hours from a node's failure to its return as a spare (default {REPAIR_H:g}, an assumption; "
                        "only with --spares N)")
    p.add_argument("--replicas", type=int, default=1,
                   help="data-parallel replicas that fail and rejoin on their own while the others train on "
                        "(default 1: any failure stops the job)")
    p.add_argument("--slow-rate", type=float, default=0.0, metavar="PER_GPU_HOUR",
                   help="GPUs turning slow (not failing) per GPU-hour; the job runs --slow-factor slower until "
                        "one is detected (default 0)")
    p.add_argument("--slow-factor", type=float, default=SLOW_FACTOR,
                   help=f"step time while a slow GPU is undetected, over the normal one (default {SLOW_FACTOR:g}, "
                        "an assumption)")
    p.add_argument("--detect-h", type=float, default=DETECT_H,
                   help=f"hours from a GPU turning slow to its detection, then handled as a failure (default "
                        f"{DETECT_H:g}, an assumption)")
    p.add_argument("--sweep", action="append", metavar="KEY=V1,V2,...",
                   help="run the model at every combination of these values (repeatable); KEY is one of "
                        + ", ".join(SWEEP_KEYS) + "; the step is simulated once")
    p.add_argument("--report", metavar="HTML", help="write a self-contained HTML page of the result (and sweep)")
    p.add_argument("--runs", type=int, default=200, help="Monte Carlo runs (default 200)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0): same seed, same answer")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--out", metavar="DIR", help="write samples.csv (one row per run) and goodput.png")
    return p


def _causes(args) -> tuple[FailureCause, ...]:
    if args.failure_scale < 0 or not math.isfinite(args.failure_scale):
        raise ConfigError("--failure-scale", args.failure_scale, "must be a finite number >= 0")
    causes = LLAMA3_CAUSES
    if args.failures:
        with open(args.failures, newline="") as f:
            rows = list(csv.DictReader(f))
        need = {"name", "kind", "per", "rate_per_hour"}
        if not rows or set(rows[0]) != need:
            raise ConfigError("--failures", args.failures, f"needs exactly the columns {', '.join(sorted(need))}")
        try:
            causes = tuple(FailureCause(r["name"], r["kind"], r["per"], float(r["rate_per_hour"])) for r in rows)
        except ValueError as e:
            raise ConfigError("--failures", args.failures, f"rate_per_hour must be a number ({e})") from None
    return tuple(FailureCause(c.name, c.kind, c.per, c.rate_per_hour * args.failure_scale) for c in causes)


def _positive(name: str, v) -> None:
    if v is not None and not (v > 0 and math.isfinite(v)):
        raise ConfigError(name, v, "must be a finite number > 0")


def _likely(args, sc, step_s: float) -> str:
    """``likely 8.3-9.6 s; 41 comparable measured runs`` for a simulated step, from ``args.likely(sc,
    step_s)`` (``clustersim goodput`` sets it: the validation residuals); a given step has none."""
    if args.step_time is not None:
        return "given by --step-time: no interval"
    fn = getattr(args, "likely", None)
    return fn(sc, step_s) if fn is not None else "no interval computed"


def _step(args, sc) -> dict:
    """The scenario's step (simulated or given), the steps for the tokens and the parameters."""
    for name in ("--tokens", "--step-time"):
        _positive(name, getattr(args, name[2:].replace("-", "_")))
    step_s = args.step_time
    if step_s is None:
        from ..engine import run
        step_s = float(run(sc, fold=True, progress=False).metrics["step_time_s"])
    tokens_per_step = sc.parallel.global_batch_size * sc.parallel.seq_len
    info = {"step_s": step_s, "steps": math.ceil(args.tokens / tokens_per_step), "tokens_per_step": tokens_per_step,
            "params": sc.model.num_params(include_mtp=True), "step_likely": _likely(args, sc, step_s)}
    if args.checkpoint_s is None or args.async_checkpoint:
        from .checkpoint import checkpoint_bytes, host_copy_bytes_per_s
        info["host_copy_bytes_per_s"] = host_copy_bytes_per_s(sc)
        info.update(checkpoint_bytes(sc))
    return info


def restart_s(nodes: int, fixed_s: float = RESTART_FIXED_S, comm_s: float = RESTART_COMM_S,
              alpha: float = RESTART_ALPHA) -> float:
    """A restart of a job on ``nodes`` nodes: ``fixed_s + comm_s (nodes / 2048) ** alpha``."""
    return fixed_s + comm_s * (nodes / RESTART_REF_NODES) ** alpha


def _restart(args, nodes: int) -> float:
    if args.restart_s is not None:
        return args.restart_s
    for name in ("restart_fixed_s", "restart_comm_s", "restart_alpha"):
        v = getattr(args, name)
        if not (v >= 0 and math.isfinite(v)):
            raise ConfigError("--" + name.replace("_", "-"), v, "must be a finite number >= 0")
    return restart_s(nodes, args.restart_fixed_s, args.restart_comm_s, args.restart_alpha)


def _spares(text) -> int | None:
    if str(text) in ("unlimited", "inf", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError("--spares", text, "must be a whole number of nodes >= 0 or unlimited") from None


def _build(args, sc, info: dict) -> RunModel:
    """The run model for ``args`` on the step ``info``: the checkpoint write time from the
    parameter count, the failure causes, spares and replicas."""
    from .checkpoint import checkpoint_write_s
    _positive("--storage-gbps", args.storage_gbps)
    _positive("--storage-node-gbps", args.storage_node_gbps)
    interval = None if args.checkpoint_interval == "auto" else _interval(args.checkpoint_interval)
    ckpt = args.checkpoint_s if args.checkpoint_s is not None else \
        checkpoint_write_s(info, args.storage_gbps * 1e9, args.storage_node_gbps * 1e9)
    copy_s, write_s = _async(args, info, ckpt)
    if not (args.repair_h >= 0 and math.isfinite(args.repair_h)):
        raise ConfigError("--repair-h", args.repair_h, "must be a finite number of hours >= 0")
    return RunModel(work_s=info["steps"] * info["step_s"], num_gpus=sc.cluster.num_gpus,
                    gpus_per_node=sc.cluster.gpus_per_host, causes=_causes(args), checkpoint_s=copy_s,
                    restart_s=_restart(args, -(-sc.cluster.num_gpus // sc.cluster.gpus_per_host)), interval_s=interval, spares=_spares(args.spares),
                    repair_s=args.repair_h * 3600.0, replicas=args.replicas, async_write_s=write_s,
                    **_slow(args))


def _slow(args) -> dict:
    """The slow-GPU fields of the run model from --slow-rate, --slow-factor and --detect-h."""
    for flag, v, low in (("--slow-rate", args.slow_rate, 0.0), ("--slow-factor", args.slow_factor, 1.0),
                         ("--detect-h", args.detect_h, 0.0)):
        if not (v >= low and math.isfinite(v)):
            raise ConfigError(flag, v, f"must be a finite number >= {low:g}")
    if args.slow_rate > 0 and (args.replicas > 1 or args.async_checkpoint):
        raise ConfigError("--slow-rate", args.slow_rate, "is modelled with --replicas 1 and synchronous checkpoints only")
    return {"slow_rate_per_hour": args.slow_rate, "slow_factor": args.slow_factor, "detect_s": args.detect_h * 3600.0}


def _async(args, info: dict, ckpt: float) -> tuple[float, float | None]:
    """(blocking checkpoint time, background write time or None): with --async-checkpoint
    the busiest rank's bytes over the host copy bandwidth block and ``ckpt`` runs behind."""
    if not args.async_checkpoint:
        if args.host_copy_gbps is not None:
            raise ConfigError("--host-copy-gbps", args.host_copy_gbps, "needs --async-checkpoint")
        return ckpt, None
    if args.replicas > 1:
        raise ConfigError("--async-checkpoint", True, "is modelled with --replicas 1 only")
    _positive("--host-copy-gbps", args.host_copy_gbps)
    bw = info["host_copy_bytes_per_s"] if args.host_copy_gbps is None else args.host_copy_gbps * 1e9
    return info["checkpoint_rank_bytes"] / bw, ckpt


def _run_model(args, sc) -> tuple[RunModel, dict]:
    """The run for the scenario: its step and the run model around it."""
    info = _step(args, sc)
    return _build(args, sc, info), info


def sweep_points(texts) -> list[dict]:
    """``--sweep KEY=V1,V2`` flags as the grid of their values (every combination, the first
    key slowest), each value converted as its flag converts it."""
    import itertools
    axes = []
    for text in texts or ():
        key, eq, values = str(text).partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in SWEEP_KEYS or not values.strip():
            raise ConfigError("--sweep", text, "must be KEY=V1,V2,... with KEY one of " + ", ".join(SWEEP_KEYS))
        try:
            axes.append([(key, SWEEP_KEYS[key](v.strip())) for v in values.split(",")])
        except ValueError:
            raise ConfigError("--sweep", text, f"values of {key} must be {SWEEP_KEYS[key].__name__}s") from None
    if len({ax[0][0] for ax in axes}) != len(axes):
        raise ConfigError("--sweep", texts, "names a key twice")
    return [dict(combo) for combo in itertools.product(*axes)] if axes else []


def _interval(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ConfigError("--checkpoint-interval", text, "must be seconds (a number > 0) or auto") from None
    _positive("--checkpoint-interval", v)
    return v


def _print_summary(sc, model: RunModel, s: dict, info: dict, args) -> None:
    day, hour = 86400.0, 3600.0
    print(f"{sc.name}: {sc.model.name} on {model.num_gpus:,} x {sc.cluster.gpu.name}, {sc.parallel.describe()}")
    print(f"  {info['steps']:,} steps of {info['step_s']:.3g} s ({info['step_likely']}; "
          f"{info['tokens_per_step']:,} tokens each): "
          f"{model.work_s / day:.2f} days of steps without failures")
    print(f"  time to train: {s['wall_mean_s'] / day:.2f} days mean (+-{s['wall_sem_s'] / day:.2f}), "
          f"p50 {s['wall_p50_s'] / day:.2f}, p90 {s['wall_p90_s'] / day:.2f}; goodput {s['goodput']:.1%} "
          f"({s['runs']} runs, seed {s['seed']})")
    print(f"  job MTBF {model.mtbf_s / hour:.2f} h; checkpoint {model.checkpoint_s:.3g} s every "
          f"{model.interval / 60:.1f} min ({'given' if model.interval_s else 'auto: Daly'}; Young "
          f"{young_interval_s(model.checkpoint_s, model.rollback_mtbf_s) / 60:.1f} min); restart {model.restart_s:.0f} s"
          + ("" if args.restart_s is not None else f" (grows with the {model.units('node'):,} nodes)"))
    if "checkpoint_unique_bytes" in info:
        print(f"  checkpoint size: {info['checkpoint_unique_bytes'] / 1e12:.3g} TB unique "
              f"({info['checkpoint_bytes_per_param']:g} B per parameter), busiest node "
              f"{info['checkpoint_node_bytes'] / 1e9:.3g} GB")
    if model.async_write_s is not None:
        print(f"  asynchronous checkpoints: {model.checkpoint_s:.3g} s blocking copy of "
              f"{info['checkpoint_rank_bytes'] / 1e9:.3g} GB per GPU, {model.async_write_s:.3g} s write in the "
              "background (a checkpoint due while one is written is skipped)")
    if model.slow_rate_per_hour > 0:
        print(f"  slow GPUs: {model.slow_rate_per_hour:.3g} per GPU-hour, steps x{model.slow_factor:g} until "
              f"detected after {model.detect_s / hour:.3g} h, then handled as a failure")
    spares = "unlimited spares" if model.spares is None else \
        f"{model.spares} spare nodes, repair {model.repair_s / hour:.3g} h"
    print(f"  {spares}; {model.replicas} replica{'s' if model.replicas > 1 else ''} as the unit of fault tolerance")
    total = sum(s["interruptions"].values())
    top = sorted(s["interruptions"].items(), key=lambda kv: -kv[1])[:5]
    print(f"  interruptions: {total:.1f} per run; " + ", ".join(f"{k} {v:.1f}" for k, v in top))
    lost = {k: v for k, v in s["time_s"].items() if k != "productive"}
    print("  time by kind: " + ", ".join(f"{k} {v / hour:,.1f} h ({v / s['wall_mean_s']:.1%})" for k, v in lost.items()))


def _write_out(out: Path, result) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"run": i, "wall_s": o.wall_s, "goodput": o.goodput, **{f"{k}_s": v for k, v in o.time_s.items()},
             "interruptions": sum(o.interruptions.values())} for i, o in enumerate(result.outcomes)]
    with open(out / "samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    from .charts import goodput_figure
    return [out / "samples.csv", goodput_figure(result, out / "goodput.png")]


def _sweep_row(point: dict, model: RunModel, s: dict) -> dict:
    day, hour = 86400.0, 3600.0
    return {**point, "mtbf_h": model.mtbf_s / hour, "interval_min": model.interval / 60.0,
            "checkpoint_s": model.checkpoint_s, "time_to_train_days": s["wall_mean_s"] / day,
            "sem_days": s["wall_sem_s"] / day, "p50_days": s["wall_p50_s"] / day, "p90_days": s["wall_p90_s"] / day,
            "goodput": s["goodput"], **{f"{k}_h": v / hour for k, v in s["time_s"].items() if k != "productive"}}


def _run_sweep(args, sc, points: list[dict]) -> tuple[list[dict], dict]:
    """Every point of the grid through the model, on one simulated step and one seed (common
    random numbers: the points differ by their keys, not by their luck)."""
    import argparse
    info = _step(args, sc)
    rows = []
    for point in points:
        model = _build(argparse.Namespace(**{**vars(args), **point}), sc, info)
        rows.append(_sweep_row(point, model, monte_carlo(model, runs=args.runs, seed=args.seed).summary()))
    return rows, info


def _print_sweep(sc, rows: list[dict], keys: list[str], info: dict, args) -> None:
    print(f"{sc.name}: {sc.model.name} on {sc.cluster.num_gpus:,} x {sc.cluster.gpu.name}; {info['steps']:,} steps "
          f"of {info['step_s']:.3g} s ({info['step_likely']}); {args.runs} runs per point, seed {args.seed}")
    cols = keys + ["mtbf_h", "interval_min", "time_to_train_days", "p90_days", "goodput"]
    print("  " + "  ".join(f"{c:>18}" for c in cols))
    for r in rows:
        cells = [f"{r[c]:>18.4g}" if isinstance(r[c], float) else f"{str(r[c]):>18}" for c in cols]
        print("  " + "  ".join(cells))


def _sweep_command(args, sc, points: list[dict]) -> int:
    keys = list(points[0])
    rows, info = _run_sweep(args, sc, points)
    if args.json:
        print(json.dumps({"points": rows, **info}, indent=1, default=float))
    else:
        _print_sweep(sc, rows, keys, info, args)
    written = []
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "sweep.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        from .charts import sweep_figure
        written += [out / "sweep.csv", sweep_figure(rows, keys, out / "sweep.png")]
    if args.report:
        written.append(_report_sweep(sc, rows, keys, args.report))
    for p in written:
        print(f"wrote {p}", file=sys.stderr)
    return 0


def _summary_rows(model: RunModel, s: dict, info: dict) -> list[list]:
    day, hour = 86400.0, 3600.0
    spares = "unlimited" if model.spares is None else f"{model.spares} nodes, repair {model.repair_s / hour:.3g} h"
    return [["steps", f"{info['steps']:,} of {info['step_s']:.4g} s ({info['step_likely']}; "
                      f"{info['tokens_per_step']:,} tokens each)"],
            ["without failures", f"{model.work_s / day:.2f} days"],
            ["time to train", f"{s['wall_mean_s'] / day:.2f} days mean (+-{s['wall_sem_s'] / day:.2f}), "
                              f"p50 {s['wall_p50_s'] / day:.2f}, p90 {s['wall_p90_s'] / day:.2f}"],
            ["goodput", f"{s['goodput']:.1%}"], ["job MTBF", f"{model.mtbf_s / hour:.2f} h"],
            ["checkpoint", f"{model.checkpoint_s:.3g} s every {model.interval / 60:.1f} min"],
            ["restart", f"{model.restart_s:.0f} s"], ["hot spares", spares],
            ["replicas", f"{model.replicas} (unit of fault tolerance)"],
            ["asynchronous checkpoints", "no" if model.async_write_s is None else
             f"{model.checkpoint_s:.3g} s copy blocks, {model.async_write_s:.3g} s write in the background"],
            ["slow GPUs", "none" if model.slow_rate_per_hour == 0 else
             f"{model.slow_rate_per_hour:.3g} per GPU-hour, x{model.slow_factor:g} until detected after "
             f"{model.detect_s / hour:.3g} h"],
            ["Monte Carlo", f"{s['runs']} runs, seed {s['seed']}"]]


def _report_run(sc, result, info: dict, path) -> Path:
    """The HTML page of one result (:func:`simulator.report.html.goodput_report`)."""
    import tempfile

    from ..report.html import goodput_report
    from .charts import goodput_figure
    s = result.summary()
    run = {"summary": _summary_rows(result.model, s, info),
           "lost": [[k, f"{v / 3600:,.1f} h", f"{v / s['wall_mean_s']:.1%}"] for k, v in s["time_s"].items()],
           "causes": [[k, f"{v:.2f}"] for k, v in sorted(s["interruptions"].items(), key=lambda kv: -kv[1]) if v > 0]}
    with tempfile.TemporaryDirectory() as tmp:
        run["image"] = goodput_figure(result, Path(tmp) / "goodput.png")
        return goodput_report(sc, path, run=run)


def _report_sweep(sc, rows: list[dict], keys: list[str], path) -> Path:
    import tempfile

    from ..report.html import goodput_report
    from .charts import sweep_figure
    cols = keys + ["mtbf_h", "interval_min", "time_to_train_days", "p50_days", "p90_days", "goodput"]
    table = [[f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    with tempfile.TemporaryDirectory() as tmp:
        sweep = {"image": sweep_figure(rows, keys, Path(tmp) / "sweep.png"), "header": cols, "rows": table,
                 "keys": len(keys)}
        return goodput_report(sc, path, sweep=sweep)


def goodput_command(args, spec) -> int:
    """The command on the scenario ``spec`` (a path or a mapping, as ``run`` loads it)."""
    from ..scenario import load_scenario
    points = sweep_points(args.sweep)
    sc = load_scenario(spec)
    if points:
        return _sweep_command(args, sc, points)
    model, info = _run_model(args, sc)
    result = monte_carlo(model, runs=args.runs, seed=args.seed)
    s = result.summary()
    if args.json:
        print(json.dumps({**s, **info}, indent=1, default=float))
    else:
        _print_summary(sc, model, s, info, args)
    written = _write_out(Path(args.out), result) if args.out else []
    if args.report:
        written.append(_report_run(sc, result, info, args.report))
    for p in written:
        print(f"wrote {p}", file=sys.stderr)
    return 0
