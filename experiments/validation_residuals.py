"""Where the validation errors sit: signed error and predicted time split per group of rows,
and which parts of the prediction the residual follows.

Reads a ``predictions_<set>.csv`` written by ``experiments/validate_all.py`` (or
``clustersim validate --out``), whose ``*_s`` breakdown columns split each predicted step
into compute, bubble, host issue and exposed communication per axis, and prints

1. per group (``--by``, default model and TP degree): rows, median signed error, mean
   absolute error, and the mean share of the predicted step in each part;
2. an **attribution**: the factors ``k`` that make ``sum_c k_c x part_c`` fit the measured
   steps best (least squares of the relative error over the ``ok`` rows), with the mean
   absolute error before and after.  ``--split AXIS:COLUMN`` gives one part its own factor
   per value of a column (``dp_comm:tp``: the exposed data-parallel communication per TP degree);
   parts under 1 % of the rows' predicted time keep the factor 1.

The attribution is a diagnostic, never a calibration: a factor far from 1 says that part
is mis-modelled *or* stands in for something that varies with it across these rows.  The
parts are correlated -- within one group of rows a split factor cannot tell its part from
the others that group has (on the vTrain set, ``--split dp_comm:tp`` and ``--split
tp_comm:tp`` explain the TP 2-4 rows equally well) -- so it points at where to look for a
measurement; constants still come from hardware facts and microbenchmarks (README,
"Accuracy").  Compute and bubble share one factor (a bubble is idle compute time).

Run: python experiments/validation_residuals.py results/validation/predictions_vtrain.csv
[--by model,tp] [--split dp_comm:tp] [--max-error 30]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:                    # run as a script from any directory
    sys.path.insert(0, str(ROOT))

from simulator.validation import BREAKDOWN_COLUMNS  # noqa: E402

_DEGREE = re.compile(r"\b(tp|pp|dp|cp|ep|vpp|mbs|gbs)(\d+)\b")
PARTS = {"compute": ("compute_s", "recompute_s", "bubble_s"), "host": ("host_issue_s",),
         **{f"{ax}_comm": (f"exposed_{ax}_s",) for ax in ("tp", "cp", "ep", "pp", "dp")}}
"""The attributed parts and the breakdown columns each sums."""

MIN_SHARE = 0.01
"""Parts under this share of the rows' total predicted time keep the factor 1 (a least-squares
factor on a part that small only soaks up noise and the other parts' errors)."""


def load(path) -> pd.DataFrame:
    """The ``ok`` rows of a predictions file, with the parallel degrees as integer columns."""
    if not Path(path).is_file():
        raise SystemExit(f"{path}: no such file (write one with experiments/validate_all.py)")
    df = pd.read_csv(path)
    missing = [c for c in BREAKDOWN_COLUMNS if c not in df.columns]
    if missing:
        raise SystemExit(f"{path}: no breakdown columns {missing}; re-run experiments/validate_all.py")
    df = df[df["status"] == "ok"].copy()
    degrees = df["parallel"].fillna("").map(lambda s: dict((k, int(v)) for k, v in _DEGREE.findall(s)))
    for key in ("tp", "pp", "dp", "cp", "ep", "vpp", "mbs"):
        df[key] = degrees.map(lambda d, key=key: d.get(key, 1))
    for part, cols in PARTS.items():
        df[part] = df[list(cols)].sum(axis=1)
    return df


def group_table(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Rows, median signed and mean absolute error, and the mean share (%) of each part."""
    shares = df[list(PARTS)].div(df["predicted_step_s"], axis=0) * 100
    g = pd.concat([df[by + ["error_pct"]], shares], axis=1).groupby(by)
    out = g["error_pct"].agg(rows="size", median_err="median")
    out["mean_abs_err"] = g["error_pct"].apply(lambda e: e.abs().mean())
    out = out.join(g[list(PARTS)].mean())
    return out[["rows", "median_err", "mean_abs_err", *[p for p in PARTS if shares[p].any()]]].round(1)


def attribution(df: pd.DataFrame, split: tuple[str, str] | None = None) -> tuple[pd.Series, float, float]:
    """(factor per part, mean |error| % as predicted, mean |error| % with the factors)."""
    share = df[list(PARTS)].sum() / df["predicted_step_s"].sum()
    small = [p for p in PARTS if share[p] < MIN_SHARE]
    fixed = df[small].sum(axis=1).to_numpy()          # too small to attribute: factor 1
    cols = {}
    for part in PARTS:
        if part in small:
            continue
        if split and part == split[0]:
            for v in sorted(df[split[1]].unique()):
                if (df[part].where(df[split[1]] == v, 0.0) != 0).any():
                    cols[f"{part}[{split[1]}={v}]"] = df[part].where(df[split[1]] == v, 0.0)
        else:
            cols[part] = df[part]
    X = pd.DataFrame(cols)
    m = df["measured_step_s"].to_numpy()
    A = X.to_numpy() / m[:, None]
    k, *_ = np.linalg.lstsq(A, 1.0 - fixed / m, rcond=None)
    fitted = X.to_numpy() @ k + fixed
    before = float(np.mean(np.abs(df["predicted_step_s"].to_numpy() - m) / m)) * 100
    after = float(np.mean(np.abs(fitted - m) / m)) * 100
    return pd.Series(k, index=X.columns).round(3), before, after


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("predictions", help="a predictions CSV with the breakdown columns")
    ap.add_argument("--by", default="model,tp", help="comma-separated grouping columns (default model,tp)")
    ap.add_argument("--split", default=None, metavar="PART:COLUMN",
                    help=f"one factor per value of COLUMN for PART (one of {', '.join(PARTS)}), e.g. dp_comm:tp")
    ap.add_argument("--max-error", type=float, default=None, metavar="PCT",
                    help="leave rows with |error| above PCT out of the attribution (outliers)")
    args = ap.parse_args(argv)
    df = load(args.predictions)
    if df.empty:
        raise SystemExit(f"{args.predictions}: no rows with status ok")
    by = [c.strip() for c in args.by.split(",") if c.strip()]
    unknown = [c for c in by if c not in df.columns]
    if unknown:
        raise SystemExit(f"--by: unknown column(s) {unknown}; known: {', '.join(df.columns)}")
    split = None
    if args.split:
        part, _, col = args.split.partition(":")
        if part not in PARTS or col not in df.columns:
            raise SystemExit(f"--split {args.split!r}: must be PART:COLUMN with PART one of {', '.join(PARTS)} "
                             "and COLUMN a column such as tp")
        split = (part, col)
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(f"{args.predictions}: {len(df)} ok rows\n")
        print("signed error % and the predicted step's parts (% of it), per group:")
        print(group_table(df, by).to_string(), "\n")
        fit = df if args.max_error is None else df[df["error_pct"].abs() <= args.max_error]
        k, before, after = attribution(fit, split)
        left = f" ({len(df) - len(fit)} rows above {args.max_error:g} % left out)" if len(fit) < len(df) else ""
        print(f"attribution over {len(fit)} rows{left} -- a diagnostic, not a calibration:")
        print(k.to_string())
        print(f"mean |error| {before:.2f} % as predicted, {after:.2f} % with these factors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
