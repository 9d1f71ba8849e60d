"""Reporting validation results: coverage and error statistics (:func:`summary`) and the
``clustersim validate`` command line (:func:`main`)."""

from __future__ import annotations

import argparse
import math
import re
import statistics

from topologies import ConfigError

from .evaluate import NOTE_SEP, validate
from .intervals import SIGN_NOTE
from .ingest import REFERENCE_SETS, reference_set
from .mapping import _NOT_MODELLED

__all__ = ["PAIR_KINDS", "ProgressBar", "config_key", "family", "generation", "layout_rank_correlation", "main",
           "paired_ratios", "pairs_summary", "per_config", "summary"]


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


#: GPU name fragments (punctuation-blind, checked in order) -> generation.
_GENERATIONS = (("gb300", "Blackwell Ultra"), ("b300", "Blackwell Ultra"), ("gb200", "Blackwell"),
                ("b200", "Blackwell"), ("h100", "Hopper"), ("h200", "Hopper"), ("h800", "Hopper"),
                ("gh200", "Hopper"), ("a100", "Ampere"), ("v100", "Volta"))

#: Model name fragments (punctuation-blind, checked in order) -> family.
_FAMILIES = (("gptoss", "gpt-oss"), ("deepseek", "DeepSeek"), ("qwen", "Qwen"), ("nemotron", "Nemotron"),
             ("mixtral", "Mixtral"), ("llama", "Llama"), ("kimi", "Kimi"), ("gpt", "GPT"), ("mamba", "Mamba"),
             ("mpt", "MPT"))


def generation(gpu: str) -> str:
    """The GPU generation of a GPU name (``GB200 NVL72`` -> Blackwell); "other" when unknown.

    >>> generation("H100-SXM-80GB"), generation("GB300 NVL72"), generation("A100")
    ('Hopper', 'Blackwell Ultra', 'Ampere')
    """
    k = re.sub(r"[^a-z0-9]", "", str(gpu).lower())
    return next((g for frag, g in _GENERATIONS if frag in k), "other")


def family(model: str) -> str:
    """The model family of a model name (``LLAMA3.1_405B`` -> Llama); "other" when unknown.

    >>> family("LLAMA3.1_405B"), family("GPT OSS 120B"), family("GPT3-175B")
    ('Llama', 'gpt-oss', 'GPT')
    """
    k = re.sub(r"[^a-z0-9]", "", str(model).lower())
    return next((f for frag, f in _FAMILIES if frag in k), "other")


def config_key(r: dict) -> tuple:
    """What makes a row's configuration distinct: the model as named (with its variant), the
    GPU, the GPU count, the precision and the parallel layout with its batch.  Rows of one
    configuration measured by several releases share the key."""
    return (r["source"], str(r["model"]), str(r["gpu"]), str(r["num_gpus"]), str(r["precision"]).upper(),
            str(r["parallel"]))


def per_config(results: list[dict]) -> list[dict]:
    """One pseudo-row per distinct configuration (:func:`config_key`) with at least one
    simulated row: its ``error_pct`` is the median of its rows' signed errors (the releases
    of one configuration differ by up to 1.6x, so no one release stands for it)."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault(config_key(r), []).append(r)
    out = []
    for key, rows in groups.items():
        ok = [float(r["error_pct"]) for r in rows if r["status"] == "ok" and r["error_pct"] != ""]
        out.append({"source": key[0], "model": key[1], "gpu": key[2], "num_gpus": key[3], "rows": len(rows),
                    "status": "ok" if ok else rows[0]["status"], "error_pct": _percentile(ok, 50) if ok else ""})
    return out


#: Kinds of paired comparison (:func:`paired_ratios`): what differs between the two rows.
PAIR_KINDS = ("precision", "gpu", "layout")


def _gpu_kind(gpu: str) -> str:
    k = re.sub(r"[^a-z0-9]", "", str(gpu).lower())
    return next((frag for frag in ("gb300", "b300", "gb200", "b200", "h200", "h100", "h800", "a100") if frag in k), k)


def paired_ratios(results: list[dict]) -> list[dict]:
    """Ratios between two simulated rows of one source and release that differ in exactly one
    thing, measured against predicted: no single correction factor can fix a ratio, so these
    test what the model says about a change, not its overall level.

    * ``precision``: same model, GPU, GPU count and layout, another precision (NVFP4 vs MXFP8);
    * ``gpu``: same model, precision and GPU count on another GPU (B200 vs GB200; the layouts
      may differ, as each system's recipe chooses);
    * ``layout``: same model, GPU, GPU count and precision, another parallel layout.

    Each pair once (``b`` the later row); ``ratio_error_pct`` is predicted over measured
    ``b/a`` step-time ratio, minus one."""
    ok = [r for r in results if r["status"] == "ok" and r["error_pct"] != "" and r["measured_step_s"] != ""]
    pairs = []
    for i, a in enumerate(ok):
        for b in ok[i + 1:]:
            if (a["source"], a.get("framework", ""), str(a["model"])) != (b["source"], b.get("framework", ""),
                                                                          str(b["model"])):
                continue
            same_prec = str(a["precision"]).upper() == str(b["precision"]).upper()
            same_gpu = _gpu_kind(a["gpu"]) == _gpu_kind(b["gpu"])
            same_n, same_par = str(a["num_gpus"]) == str(b["num_gpus"]), a["parallel"] == b["parallel"]
            kind = None
            if same_gpu and same_n and same_par and not same_prec:
                kind = "precision"
            elif same_prec and same_n and not same_gpu:
                kind = "gpu"
            elif same_gpu and same_n and same_prec and not same_par:
                kind = "layout"
            if kind is None:
                continue
            measured = float(b["measured_step_s"]) / float(a["measured_step_s"])
            predicted = float(b["predicted_step_s"]) / float(a["predicted_step_s"])
            what = {"precision": (a["precision"], b["precision"]), "gpu": (_gpu_kind(a["gpu"]), _gpu_kind(b["gpu"])),
                    "layout": (a["parallel"], b["parallel"])}[kind]
            pairs.append({"kind": kind, "source": a["source"], "framework": a.get("framework", ""),
                          "model": a["model"], "a": a["id"], "b": b["id"], "a_is": what[0], "b_is": what[1],
                          "measured_ratio": measured, "predicted_ratio": predicted,
                          "ratio_error_pct": (predicted / measured - 1) * 100})
    return pairs


def _spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None under three points."""
    if len(x) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx and vy else None


def layout_rank_correlation(results: list[dict]) -> list[dict]:
    """Per group of simulated rows that share source, release, model, GPU, GPU count and
    precision but not one layout (three layouts or more): Spearman's rank correlation of
    predicted against measured step time -- does the simulator order the layouts right?"""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        if r["status"] == "ok" and r["error_pct"] != "":
            key = (r["source"], r.get("framework", ""), str(r["model"]), _gpu_kind(r["gpu"]), str(r["num_gpus"]),
                   str(r["precision"]).upper())
            groups.setdefault(key, []).append(r)
    out = []
    for key, rows in groups.items():
        if len({r["parallel"] for r in rows}) < 3:
            continue
        rho = _spearman([float(r["measured_step_s"]) for r in rows], [float(r["predicted_step_s"]) for r in rows])
        out.append({"source": key[0], "framework": key[1], "model": key[2], "gpu": key[3], "num_gpus": key[4],
                    "precision": key[5], "layouts": len(rows), "spearman": rho})
    return out


def pairs_summary(results: list[dict]) -> str:
    """Per pair kind: pairs, median and max |ratio error|, pairs within 5 %; then the layout
    rank correlations."""
    pairs = paired_ratios(results)
    lines = [f"{'paired ratios':<20} {'pairs':>5} {'median|err|':>12} {'max|err|':>9} {'within 5%':>10}"]
    for kind in PAIR_KINDS:
        errs = [abs(p["ratio_error_pct"]) for p in pairs if p["kind"] == kind]
        if errs:
            within = sum(e <= 5 for e in errs)
            lines.append(f"{kind:<20} {len(errs):>5} {_percentile(errs, 50):>11.1f}% {max(errs):>8.1f}% "
                         f"{within:>5}/{len(errs):<4}")
        else:
            lines.append(f"{kind:<20} {0:>5} {'-':>12} {'-':>9} {'-':>10}")
    for g in layout_rank_correlation(results):
        rho = "-" if g["spearman"] is None else f"{g['spearman']:+.2f}"
        lines.append(f"  layout ranking {g['model']} on {g['num_gpus']} {g['gpu']} {g['precision']} "
                     f"({g['framework'] or g['source']}): {g['layouts']} layouts, Spearman {rho}")
    return "\n".join(lines)


def _table(title: str, groups: list[tuple[str, list[dict]]]) -> list[str]:
    lines = [(f"{title:<20} {'rows':>5} {'ok':>4} {'coverage':>9} {'median|err|':>12} {'p90|err|':>9} "
              f"{'max|err|':>9} {'mean|err|':>10} {'median err':>11}")]
    for name, rows in groups:
        s = _stats(rows)
        cov = f"{s['ok'] / s['rows'] * 100:.0f}%" if s["rows"] else "-"
        if "median" in s:
            lines.append(f"{name[:20]:<20} {s['rows']:>5} {s['ok']:>4} {cov:>9} {s['median']:>11.1f}% "
                         f"{s['p90']:>8.1f}% {s['max']:>8.1f}% {s['mean']:>9.1f}% {s['bias']:>+10.1f}%")
        else:
            lines.append(f"{name[:20]:<20} {s['rows']:>5} {s['ok']:>4} {cov:>9} {'-':>12} {'-':>9} {'-':>9} "
                         f"{'-':>10} {'-':>11}")
    return lines


def _grouped(results: list[dict], key) -> list[tuple[str, list[dict]]]:
    groups: dict[str, list[dict]] = {}
    for r in results:
        groups.setdefault(key(r), []).append(r)
    return sorted(groups.items())


def measured_share_lines(results: list[dict]) -> list[str]:
    """One line: the share of the predicted step time costed from measured kernel tables
    (``measured_share_pct``) over the simulated rows -- median, mean and rows with any."""
    shares = [float(r["measured_share_pct"]) for r in results
              if r.get("status") == "ok" and isinstance(r.get("measured_share_pct"), (int, float))]
    if not shares:
        return []
    return [f"step time costed from measured kernel tables: median {statistics.median(shares):.1f} %, "
            f"mean {statistics.fmean(shares):.1f} %, {sum(1 for v in shares if v > 0)}/{len(shares)} rows with any"]


def summary(results: list[dict], *, breakdowns: bool = True) -> str:
    """Coverage and absolute step-time error (median, p90, max, mean) per source and overall,
    the median signed error (bias); with ``breakdowns``, the same per GPU generation, per
    model family and per distinct configuration (:func:`per_config`: each configuration's
    median over its releases, one vote each); then counts of the reasons rows were not
    simulated, and the number of rows each not-modelled source feature touches."""
    sources = _grouped(results, lambda r: r["source"])
    everything = [("all", results)] if len(sources) > 1 else []
    lines = _table("source", sources + everything)
    if breakdowns and results:
        lines += [""] + _table("GPU generation", _grouped(results, lambda r: generation(r["gpu"])))
        lines += [""] + _table("model family", _grouped(results, lambda r: family(r["model"])))
        configs = per_config(results)
        lines += [""] + _table("per configuration", _grouped(configs, lambda r: r["source"])
                               + ([("all", configs)] if len(sources) > 1 else []))
        if paired_ratios(results):
            lines += [""] + pairs_summary(results).split("\n")
    lines += measured_share_lines(results)
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
    likely = "-"
    if isinstance(r.get("likely_low_s"), float):
        likely = f"{r['likely_low_s']:.3f}-{r['likely_high_s']:.3f} ({r['comparable_runs']})"
    elif r.get("comparable_runs") == 0:
        likely = "no comparable"
    return (f"{r['id']:<22} {str(r['model'])[:32]:<32} {r['num_gpus']:>5} {str(r['precision'])[:6]:<6} "
            f"{num(r['measured_step_s'], '.3f'):>8} {num(r['predicted_step_s'], '.3f'):>9} {err:>8} {likely:>20}  "
            f"{r['status']}")


class ProgressBar:
    """Rows finished out of all, on stderr: redrawn in place on a terminal, otherwise one line
    per tenth of the rows (logs stay short).  ``ProgressBar(stream)(finished, total)``."""

    WIDTH = 30

    def __init__(self, stream=None):
        import sys
        import time
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self._clock = time.perf_counter
        self._shown = -1

    def __call__(self, finished: int, total: int) -> None:
        if total <= 0:
            return
        tenth = finished * 10 // total
        if not self.tty and tenth == self._shown and finished < total:
            return
        self._shown = tenth
        elapsed = self._clock() - self.t0
        left = elapsed / finished * (total - finished) if finished else 0.0
        fill = finished * self.WIDTH // total
        text = (f"[{'#' * fill}{'.' * (self.WIDTH - fill)}] {finished}/{total} rows, {_clock(elapsed)} elapsed"
                + (f", ~{_clock(left)} left" if finished < total else ""))
        end = "\n" if not self.tty or finished == total else ""
        self.stream.write(("\r" if self.tty else "") + text + end)
        self.stream.flush()


def _clock(seconds: float) -> str:
    """``75.2`` -> ``1m15s``."""
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def _runs_table(runs: str | None, set_name: str | None, limit: int | None):
    """The CSV to validate: the one given, or the shipped set named by ``--set`` (exactly one
    of them); ConfigError otherwise, or for a ``--limit`` below 1."""
    if limit is not None and limit < 1:
        raise ConfigError("--limit", limit, "must be a positive number of rows")
    if runs is None and set_name is None:
        raise ConfigError("runs", None, "give a CSV of measured runs, or --set NAME for a shipped reference set "
                                        f"({', '.join(REFERENCE_SETS)})")
    if runs is not None and set_name is not None:
        raise ConfigError("--set", set_name, f"names a table of runs, and {runs} is one too: give one of them")
    return reference_set(set_name) if set_name is not None else runs


def main(argv=None) -> int:
    """``clustersim validate (RUNS.csv | --set NAME) [--limit N] [--out predictions.csv] [--max-gpus N]
    [--plot PNG] [--workers N] [--quiet]``: per-row lines (stdout) and a progress bar (stderr), then the summary."""
    p = argparse.ArgumentParser(prog="clustersim validate",
                                description="Simulate every measured run of a table and report the step-time error.")
    p.add_argument("runs", nargs="?", help="CSV in the published-runs format or vTrain's ground-truth format")
    p.add_argument("--set", dest="set_name", metavar="NAME",
                   help=f"a shipped reference set instead of a CSV: {', '.join(REFERENCE_SETS)}")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N rows")
    p.add_argument("--out", help="write one row per input row (predictions, errors, status) to this CSV")
    p.add_argument("--max-gpus", type=int, default=None,
                   help="report rows on more GPUs as 'unsupported: over --max-gpus' instead of simulating them")
    p.add_argument("--plot", help="write a log-log scatter of predicted vs measured step time to this PNG")
    p.add_argument("--workers", type=int, default=1,
                   help="rows simulated at once, one process each (the results do not depend on it)")
    p.add_argument("--quiet", action="store_true", help="no per-row lines and no progress bar: the summary only")
    args = p.parse_args(argv)
    runs = _runs_table(args.runs, args.set_name, args.limit)
    if not args.quiet:
        print(f"{'id':<22} {'model':<32} {'gpus':>5} {'prec':<6} {'measured':>8} {'predicted':>9} {'error':>8} "
              f"{'likely (runs)':>20}  status")

    def progress(_i, _n, r):
        if not args.quiet:
            print(_row_line(r), flush=True)

    results = validate(runs, args.out, max_gpus=args.max_gpus, progress=progress, workers=args.workers,
                       limit=args.limit, on_done=None if args.quiet else ProgressBar())
    print()
    print(summary(results))
    print(f"\n'likely': the 80 % interval of the measured step from the validation residuals of comparable measured "
          f"runs (same kernel stack, GPU generation, model family and scope), built without the row's own "
          f"configuration; (runs) how many it rests on (docs/accuracy.md). {SIGN_NOTE}.")
    if args.plot:
        from ..report import validation_scatter
        validation_scatter(results, args.plot)
        print(f"scatter plot: {args.plot}")
    return 0
