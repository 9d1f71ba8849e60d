"""Helpers shared by the what-if studies: arguments, configs, scenarios, CSV and plots.

Every study is ``experiments/whatif/<study>/run.py`` + ``config.yaml``: the YAML holds the
base scenario and the sweep (and a ``smoke:`` section of smaller values that ``--smoke``
merges in, for the test suite); the script builds scenarios from it, runs them, and writes
``results.csv``, plots and a baseline-vs-what-if Gantt pair into
``results/whatif/<study>/`` (or ``--out DIR``).  Nothing changes directory; the output
directory is an argument.
"""

from __future__ import annotations

import argparse
import copy
import csv
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:           # run as a script from anywhere: import this checkout
    sys.path.insert(0, str(ROOT))


def parse_args(study: str, argv=None, doc: str = "") -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else study)
    ap.add_argument("--out", default=str(ROOT / "results" / "whatif" / study), help="output directory")
    ap.add_argument("--config", default=str(Path(__file__).with_name(study) / "config.yaml"))
    ap.add_argument("--smoke", action="store_true", help="small sizes (seconds; the test suite runs this)")
    return ap.parse_args(argv)


def merge(base: dict, over: dict) -> dict:
    """``base`` with ``over`` merged in, recursively (neither is modified)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def load_config(args) -> dict:
    with open(args.config) as f:
        cfg = yaml.safe_load(f)
    smoke = cfg.pop("smoke", {}) or {}
    return merge(cfg, smoke) if args.smoke else cfg


def out_dir(args) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_csv(rows: list[dict], path: Path) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def gantt_pair(base, other, out: Path, *, label: str, ranks=None, by: str = "rank", stage_of=None) -> list[Path]:
    """``gantt_baseline.png`` and ``gantt_whatif.png``: the last step of both runs, the same
    rows, titled with step times so the difference can be read off."""
    from simulator.report import gantt
    paths = []
    for name, res, what in (("baseline", base, "baseline"), ("whatif", other, label)):
        p = out / f"gantt_{name}.png"
        gantt(res.rank_timeline(ranks), p, by=by, stage_of=stage_of, step=-1,
              title=f"{what}: step {res.metrics['step_time_s'] * 1e3:.1f} ms (last of {len(res.step_bounds)} steps)")
        paths.append(p)
    return paths


def new_axes(title: str, xlabel: str, ylabel: str, figsize=(8, 5)):
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize, dpi=110)
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def step_time_bars(ax, rows: list[dict], labels: list[str], colors: list[str], *, fontsize=9) -> None:
    """Bars of ``rows``' step times in ms, each labelled "<ms> ms (<ratio>x)" (``ratio`` key),
    x tick ``labels`` at ``fontsize``, a "step time (ms)" axis and head-room for the labels."""
    ax.bar(range(len(rows)), [r["step_time_s"] * 1e3 for r in rows], color=colors)
    for j, r in enumerate(rows):
        ax.text(j, r["step_time_s"] * 1e3, f"{r['step_time_s'] * 1e3:.0f} ms\n({r['ratio']:.2f}x)",
                ha="center", va="bottom", fontsize=9)
    ax.set_xticks(range(len(rows)), labels, fontsize=fontsize)
    ax.set_ylabel("step time (ms)")
    ax.margins(y=0.2)


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    return path
