"""Reporting validation results: coverage and error statistics (:func:`summary`) and the
``clustersim validate`` command line (:func:`main`)."""

from __future__ import annotations

import argparse
import math

from .evaluate import NOTE_SEP, validate
from .mapping import _NOT_MODELLED

__all__ = ["main", "summary"]


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of a non-empty list."""
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _stats(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["status"] == "ok" and r["error_pct"] != ""]
    errs = [abs(float(r["error_pct"])) for r in ok]
    signed = [float(r["error_pct"]) for r in ok]
    out = {"rows": len(rows), "ok": len(ok)}
    if errs:
        out.update(median=_percentile(errs, 50), p90=_percentile(errs, 90), max=max(errs),
                   mean=sum(errs) / len(errs), bias=_percentile(signed, 50))
    return out


def summary(results: list[dict]) -> str:
    """Coverage and absolute step-time error (median, p90, max, mean) per source and overall,
    the median signed error (bias), counts of the reasons rows were not simulated, and the
    number of simulated rows each not-modelled source feature touches."""
    sources: dict[str, list[dict]] = {}
    for r in results:
        sources.setdefault(r["source"], []).append(r)
    groups = list(sources.items()) + ([("all", results)] if len(sources) > 1 else [])
    lines = [(f"{'source':<20} {'rows':>5} {'ok':>4} {'coverage':>9} {'median|err|':>12} {'p90|err|':>9} "
              f"{'max|err|':>9} {'mean|err|':>10} {'median err':>11}")]
    for name, rows in groups:
        s = _stats(rows)
        cov = f"{s['ok'] / s['rows'] * 100:.0f}%" if s["rows"] else "-"
        if "median" in s:
            lines.append(f"{name:<20} {s['rows']:>5} {s['ok']:>4} {cov:>9} {s['median']:>11.1f}% {s['p90']:>8.1f}% "
                         f"{s['max']:>8.1f}% {s['mean']:>9.1f}% {s['bias']:>+10.1f}%")
        else:
            lines.append(f"{name:<20} {s['rows']:>5} {s['ok']:>4} {cov:>9} {'-':>12} {'-':>9} {'-':>9} {'-':>10} "
                         f"{'-':>11}")
    reasons: dict[str, int] = {}
    for r in results:
        if r["status"] != "ok":
            reasons[r["status"]] = reasons.get(r["status"], 0) + 1
    if reasons:
        lines.append("not simulated (rows):")
        for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {count:>4}  {reason}")
    features: dict[str, int] = {}
    for r in results:
        for note in str(r.get("notes", "")).split(NOTE_SEP):
            if note.startswith(_NOT_MODELLED):
                feat = note[len(_NOT_MODELLED):]
                features[feat] = features.get(feat, 0) + 1
    if features:
        lines.append("source features not modelled (rows touched, simulated or not):")
        for feat, count in sorted(features.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {count:>4}  {feat}")
    return "\n".join(lines)


def _row_line(r: dict) -> str:
    def num(v, spec):
        return format(v, spec) if isinstance(v, float) else (str(v) if v != "" else "-")
    err = f"{r['error_pct']:+.1f}%" if isinstance(r["error_pct"], float) else "-"
    return (f"{r['id']:<22} {str(r['model'])[:32]:<32} {r['num_gpus']:>5} {str(r['precision'])[:6]:<6} "
            f"{num(r['measured_step_s'], '.3f'):>8} {num(r['predicted_step_s'], '.3f'):>9} {err:>8}  {r['status']}")


def main(argv=None) -> int:
    """``clustersim validate RUNS.csv [--out predictions.csv] [--max-gpus N] [--plot PNG] [--workers N]``:
    per-row lines, then the summary."""
    p = argparse.ArgumentParser(prog="clustersim validate",
                                description="Simulate every measured run of a table and report the step-time error.")
    p.add_argument("runs", help="CSV in the published-runs format or vTrain's ground-truth format")
    p.add_argument("--out", help="write one row per input row (predictions, errors, status) to this CSV")
    p.add_argument("--max-gpus", type=int, default=None,
                   help="report rows on more GPUs as 'unsupported: over --max-gpus' instead of simulating them")
    p.add_argument("--plot", help="write a log-log scatter of predicted vs measured step time to this PNG")
    p.add_argument("--workers", type=int, default=1,
                   help="rows simulated at once, one process each (the results do not depend on it)")
    args = p.parse_args(argv)
    print(f"{'id':<22} {'model':<32} {'gpus':>5} {'prec':<6} {'measured':>8} {'predicted':>9} {'error':>8}  status")

    def progress(_i, _n, r):
        print(_row_line(r), flush=True)

    results = validate(args.runs, args.out, max_gpus=args.max_gpus, progress=progress, workers=args.workers)
    print()
    print(summary(results))
    if args.plot:
        from ..report import validation_scatter
        validation_scatter(results, args.plot)
        print(f"scatter plot: {args.plot}")
    return 0
