"""How much the development-set error moves when an assumed constant moves by +-10 %.

For every constant of the registry (:mod:`simulator.validation.constants`) whose provenance
is ``assumption`` -- or the constants named with ``--names`` -- simulate a fixed development
subset with the constant at x0.9 and x1.1 and report, against the unperturbed run:

* the median absolute error and the median signed error over the subset's ``ok`` rows, and
  their change in percentage points;
* the largest change of any one row's error (does the constant touch the subset at all?).

The subset (``DEV_SUBSET``), chosen to run in about a minute per pass on one core:

* ``published_runs_h100.csv``: rows 372 (Llama 3.1 70B, 64 GPUs, TP 4 PP 4 VPP 5 CP 2, BF16)
  and 384, 385, 390, 391 (the Llama 3.1 405B proxies on 32 and 96 GPUs, TP 8 CP 2, BF16 and
  FP8);
* ``vtrain/ground_truth_multi.csv``: every 4th data row (0, 4, 8, ...) of the 3.6B, 18.4B and
  39.1B models (22 rows, 64-512 A100) plus data row 96 (175B, TP 8 PP 8).

A perturbation is a scaled :class:`~topologies.constants.Constants` object installed by
:func:`~simulator.validation.constants.scaled`; ``validate`` hands it to its worker
processes, so ``--workers N`` splits each pass over N processes with the same results.

Run: python experiments/constants_sensitivity.py [--names NAME ...] [--factors 0.9 1.1]
[--workers 1] [--out results/constants_sensitivity.csv]
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:                    # run as a script from any directory
    sys.path.insert(0, str(ROOT))

from simulator.validation import validate  # noqa: E402
from simulator.validation.constants import assumptions, get, scaled  # noqa: E402

REFERENCE = ROOT / "experiments" / "reference"
H100_ROWS = frozenset({"372", "384", "385", "390", "391"})
VTRAIN_EXTRA_ROWS = frozenset({96})          # data-row index (0-based) of the one 175B row kept


def _h100(row: dict) -> bool:
    return row.get("row_id") in H100_ROWS


def _vtrain(row: dict) -> bool:
    i = int(row["_line"]) - 2                   # header is line 1
    return (i % 4 == 0 and float(row["Parameters (billion)"]) < 100) or i in VTRAIN_EXTRA_ROWS


DEV_SUBSET: tuple[tuple[Path, object], ...] = (
    (REFERENCE / "published_runs_h100.csv", _h100),
    (REFERENCE / "vtrain" / "ground_truth_multi.csv", _vtrain),
)
"""(runs table, row filter) of the development subset (module docstring)."""

COLUMNS = ("name", "provenance", "factor", "rows_ok", "median_abs_error_pct", "median_signed_error_pct",
           "delta_median_abs_pp", "delta_median_signed_pp", "max_row_shift_pp", "wall_s")


def run_subset(workers: int = 1) -> dict[str, float]:
    """``{row key: error_pct}`` of the subset's ``ok`` rows under the active constants."""
    out = {}
    for path, select in DEV_SUBSET:
        for r in validate(path, select=select, workers=workers):
            if r["status"] == "ok":
                out[f"{path.stem}:{r['id']}"] = float(r["error_pct"])
    return out


def _stats(errors: dict[str, float]) -> tuple[float, float]:
    vals = list(errors.values())
    return statistics.median(abs(v) for v in vals), statistics.median(vals)


def _row(name: str, provenance: str, factor: float, errors: dict, base: dict, wall: float) -> dict:
    mae, mse = _stats(errors)
    bmae, bmse = _stats(base)
    shift = max((abs(errors[k] - base[k]) for k in errors if k in base), default=float("nan"))
    return {"name": name, "provenance": provenance, "factor": factor, "rows_ok": len(errors),
            "median_abs_error_pct": round(mae, 3), "median_signed_error_pct": round(mse, 3),
            "delta_median_abs_pp": round(mae - bmae, 3), "delta_median_signed_pp": round(mse - bmse, 3),
            "max_row_shift_pp": round(shift, 3), "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--names", nargs="*", help="registry names to perturb (default: every assumption)")
    ap.add_argument("--factors", nargs="*", type=float, default=[0.9, 1.1])
    ap.add_argument("--workers", type=int, default=1, help="processes per pass (the constants travel with them)")
    ap.add_argument("--out", default=str(ROOT / "results" / "constants_sensitivity.csv"))
    args = ap.parse_args(argv)
    entries = [get(n) for n in args.names] if args.names else list(assumptions())

    t0 = time.perf_counter()
    base = run_subset(args.workers)
    rows = [_row("(unperturbed)", "", 1.0, base, base, time.perf_counter() - t0)]
    print(f"baseline: {len(base)} ok rows in {rows[0]['wall_s']} s", file=sys.stderr, flush=True)
    for c in entries:
        for f in args.factors:
            t0 = time.perf_counter()
            with scaled(c.name, f):
                errors = run_subset(args.workers)
            rows.append(_row(c.name, c.provenance, f, errors, base, time.perf_counter() - t0))
            r = rows[-1]
            print(f"{c.name} x{f}: |err| {r['delta_median_abs_pp']:+.3f} pp, signed "
                  f"{r['delta_median_signed_pp']:+.3f} pp, max row shift {r['max_row_shift_pp']:.3f} pp "
                  f"({r['wall_s']} s)", file=sys.stderr, flush=True)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(markdown(rows))
    print(f"written: {out}", file=sys.stderr)
    return 0


def markdown(rows: list[dict]) -> str:
    """The rows as a Markdown table (the form pasted into docs/accuracy.md)."""
    header = ("| constant | factor | median abs error % | change (pp) | median signed error % | change (pp) "
              "| largest row shift (pp) |")
    lines = [header, "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| `{r['name']}` | x{r['factor']:g} | {r['median_abs_error_pct']:.2f} | "
                     f"{r['delta_median_abs_pp']:+.2f} | {r['median_signed_error_pct']:.2f} | "
                     f"{r['delta_median_signed_pp']:+.2f} | {r['max_row_shift_pp']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
