"""Step-time accuracy on the reference sets: predictions, the scoring tables, a scatter plot.

Runs ``simulator.validation.validate`` on

* ``h100``:   ``experiments/reference/published_runs_h100.csv`` (NVIDIA DGX Cloud benchmark
  runs, 32-2,304 H100, BF16 and FP8; 34 rows);
* ``blackwell``: ``experiments/reference/published_runs_blackwell.csv`` (Megatron-Bridge
  performance runs of NeMo releases 25.09-26.08 on 8-256 B200 and GB200; 117 rows; each row
  runs with its release's recipe, ``simulator/validation/releases.py``);
* ``vtrain``: ``experiments/reference/vtrain/ground_truth_multi.csv`` (vTrain's Megatron runs
  on 64-512 A100; 109 rows),
* ``vtrain_single``: ``experiments/reference/vtrain/ground_truth_single.csv`` (the same
  source's runs on one 8-GPU A100 host, GPT models of hidden size 1,024-2,048; 1,440 rows;
  not one of the issue's targets: small layers whose time is set by the host's kernel
  launches, which clustersim does not model, so it shows that limit),

writes ``predictions_<set>.csv`` (one row per input row: measured and predicted step time,
signed error, status, notes) to the output directory, prints the tables (per source, per GPU
generation, per model family and per distinct configuration: rows, simulated, coverage,
median / p90 / max / mean absolute error and the median signed error; then the paired-ratio
and layout-ranking tests) into ``summary.txt``, the pairs into ``paired_ratios.csv``, and
writes ``scatter.png`` (predicted vs measured step time, log-log, +-10 % band,
one colour per source).

Run: ``python experiments/validate_all.py [--set all|h100|vtrain] [--limit N] [--max-gpus N]
[--out-dir results/validation] [--workers N]``.  Every set with ``--workers 2`` takes about 21
CPU-minutes, about 13 minutes on an idle 2-core machine (the Llama 3.1 405B rows on GB200
and on 2,304 H100 most of it): all sets share one pool of
``--workers`` processes, each distinct scenario is simulated once, costliest first.
``--subset ci`` runs the deterministic subset the ``validation`` regression test uses
(:data:`CI_SUBSET`).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:                    # run as a script from any directory
    sys.path.insert(0, str(ROOT))

from simulator.validation import summary  # noqa: E402
from simulator.validation.evaluate import validate_tables  # noqa: E402
from simulator.validation.report import paired_ratios  # noqa: E402

from simulator.validation.ingest import REFERENCE_SETS as SETS  # noqa: E402

# SETS: the reference sets of measured runs by name (experiments/reference/), shared with
# `clustersim validate --set NAME`

CI_MAX_GPUS = {"h100": 512, "blackwell": 64, "vtrain": None, "vtrain_single": None, "llmfoundry": 64}
"""The deterministic CI subset: every vTrain row, the Blackwell rows on at most 64 GPUs (70 of
117), and the H100 rows on at most 512 GPUs (20
of 34: GPT-3 175B on 128-512 and Llama 3.1 70B on 64-512 GPUs, the Llama 3.1 405B proxies
on 32-192 GPUs, BF16 and FP8; about 5 minutes).  The 1,024-2,304-GPU rows take most of the H100 set's time and differ
from the kept ones only in data-parallel degree (weak scaling: same per-GPU work)."""


def ci_select(name: str):
    """Row predicate of the CI subset of set ``name`` (None: every row)."""
    cap = CI_MAX_GPUS.get(name)
    if cap is None:
        return None
    return lambda row: int(float(row.get("num_gpus") or 0)) <= cap


def _select(name: str, subset: str | None, match: str | None):
    """Row predicate of set ``name``: the CI subset and/or ``match`` (None: every row)."""
    select = ci_select(name) if subset == "ci" else None
    if match is not None:
        pattern, inner = re.compile(match, re.IGNORECASE), select
        select = lambda row: (bool(pattern.search(str(row.get("row_id", "")))   # noqa: E731
                                   or pattern.search(str(row.get("model", ""))))
                              and (inner is None or inner(row)))
    return select


def run_sets(names: list[str], out_dir: Path | None, *, limit: int | None = None, max_gpus: int | None = None,
             subset: str | None = None, quiet: bool = False, workers: int = 1,
             match: str | None = None) -> dict[str, list[dict]]:
    """Validate the sets ``names`` together (:func:`simulator.validation.evaluate.validate_tables`:
    every distinct scenario of all of them simulated once, by one pool of ``workers``
    processes, the costliest first); write ``predictions_<name>.csv`` under ``out_dir``
    (None: not written).  ``match``: a regular expression; only rows whose ``row_id`` or
    ``model`` it finds are run.  The rows of each set, by name."""
    t0 = time.perf_counter()

    def progress_of(name):
        def progress(i, n, r):
            if not quiet:
                err = f"{r['error_pct']:+.1f}%" if isinstance(r["error_pct"], float) else "-"
                print(f"  [{name} {i + 1}/{n}] {r['id']:<22} {str(r['model'])[:30]:<30} {r['num_gpus']:>5} "
                      f"{err:>8}  {r['status']}", flush=True)
            if not quiet and i + 1 == n:
                print(f"  {name}: {n} rows, all in by {time.perf_counter() - t0:.0f} s", flush=True)
        return progress

    tables = [{"name": name, "path": SETS[name], "max_gpus": max_gpus, "limit": limit,
               "select": _select(name, subset, match), "progress": progress_of(name),
               "out_csv": out_dir / f"predictions_{name}.csv" if out_dir is not None else None} for name in names]
    results = validate_tables(tables, workers=workers)
    if not quiet:
        print(f"  {', '.join(names)}: {sum(map(len, results))} rows in {time.perf_counter() - t0:.0f} s", flush=True)
    return dict(zip(names, results))


def run_set(name: str, out_dir: Path | None, **kw) -> list[dict]:
    """Validate one set (:func:`run_sets`)."""
    return run_sets([name], out_dir, **kw)[name]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=("all", *SETS), default="all", help="which reference set(s) to run")
    ap.add_argument("--limit", type=int, default=None, help="only the first N rows of each set")
    ap.add_argument("--max-gpus", type=int, default=None,
                    help="report rows on more GPUs as unsupported instead of simulating them")
    ap.add_argument("--match", default=None, metavar="REGEX",
                    help="only rows whose row_id or model matches (case-insensitive), e.g. 'nemotron|^31[0-9]$'")
    ap.add_argument("--subset", choices=("ci",), default=None, help="the CI regression test's deterministic subset")
    ap.add_argument("--out-dir", default=str(ROOT / "results" / "validation"), help="where CSVs and the plot go")
    ap.add_argument("--no-plot", action="store_true", help="skip scatter.png")
    ap.add_argument("--quiet", action="store_true", help="no per-row progress lines")
    ap.add_argument("--workers", type=int, default=1, help="scenarios simulated at once: one pool of this many processes for all sets (default 1)")
    args = ap.parse_args(argv)
    if args.match is not None:
        try:
            re.compile(args.match)
        except re.error as e:
            ap.error(f"--match {args.match!r}: not a regular expression ({e})")

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = list(SETS) if args.set == "all" else [args.set]
    by_set = run_sets(names, out_dir, limit=args.limit, max_gpus=args.max_gpus, subset=args.subset,
                      quiet=args.quiet, workers=args.workers, match=args.match)
    results = [r for name in names for r in by_set[name]]
    print()
    text = summary(results)
    print(text)
    (out_dir / "summary.txt").write_text(text + "\n")
    pairs = paired_ratios(results)
    if pairs:
        with open(out_dir / "paired_ratios.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(pairs[0]))
            w.writeheader()
            w.writerows(pairs)
    if not args.no_plot:
        from simulator.report import validation_scatter
        png = out_dir / "scatter.png"
        validation_scatter(results, png)
        print(f"\npredictions: {', '.join(str(out_dir / f'predictions_{n}.csv') for n in names)}\nscatter: {png}\n"
              f"tables: {out_dir / 'summary.txt'}" + (f", {out_dir / 'paired_ratios.csv'}" if pairs else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
