"""Reading run tables: the two input formats, their columns, the cell parsers and the row errors.

Input formats (:func:`load_runs` recognises them by their header)
-----------------------------------------------------------------
``published``  The columns of ``reference/published_runs_h100.csv`` (one run per row:
               ``row_id, source_id, framework, system, gpu_type, num_gpus, gpus_per_node,
               inter_node_network, model, num_layers, hidden_size, ffn_hidden_size,
               num_heads, num_kv_heads, vocab_size, seq_len, num_experts, moe_top_k, tp, pp,
               vpp, dp, cp, ep, sp, zero_fsdp, micro_batch_size, global_batch_size,
               grad_accum, activation_recompute, precision, tflops_per_gpu,
               tflops_definition, mfu_pct, step_time_s, tokens_per_s_total,
               tokens_per_s_per_gpu, notes`` ...).  Any file with at least ``model``,
               ``gpu_type`` (or ``system``), ``num_gpus`` and one measurement column is
               read in this format; missing columns count as empty cells, and an empty
               cell means "the source did not say".
``vtrain``     vTrain's ``ground_truth_multi.csv`` / ``ground_truth_single.csv``
               (``# GPUs, global batch, micro batch, hidden size, attention heads,
               # layers, sequence length, tensor parallelism, data parallelism,
               pipeline parallelism, iteration time (ms)``).
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from topologies import ConfigError

__all__ = ["FORMATS", "PUBLISHED_COLUMNS", "REFERENCE_DIR", "REFERENCE_SETS", "VTRAIN_COLUMNS", "InvalidRow",
           "Unsupported", "detect_format", "load_runs", "reference_set"]

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "experiments" / "reference"
"""The measured runs shipped with the repository (``experiments/reference/``)."""

REFERENCE_SETS = {
    "h100": REFERENCE_DIR / "published_runs_h100.csv",
    "blackwell": REFERENCE_DIR / "published_runs_blackwell.csv",
    "vtrain": REFERENCE_DIR / "vtrain" / "ground_truth_multi.csv",
    "vtrain_single": REFERENCE_DIR / "vtrain" / "ground_truth_single.csv",
    "llmfoundry": REFERENCE_DIR / "published_runs_llmfoundry.csv",
}
"""The reference sets of measured runs by name: ``clustersim validate --set NAME`` and
``experiments/validate_all.py --set NAME`` run them."""


def reference_set(name: str) -> Path:
    """The CSV of the shipped reference set ``name``; ConfigError naming the valid names for
    another name, or when the file is missing (an install without the repository's
    ``experiments/`` folder)."""
    if name not in REFERENCE_SETS:
        raise ConfigError("--set", name, f"not a shipped reference set; valid sets: {', '.join(REFERENCE_SETS)}")
    path = REFERENCE_SETS[name]
    if not path.is_file():
        raise ConfigError("--set", name, f"its table {path} is missing: the reference sets come with a source "
                                         f"checkout of clustersim (experiments/reference/); pass a CSV instead")
    return path

FORMATS = ("published", "vtrain")

#: vTrain's ground-truth columns (data/ground_truth_multi.csv; the single-node file lacks the first).
VTRAIN_COLUMNS = ("Parameters (billion)", "# GPUs", "global batch", "micro batch", "hidden size", "attention heads",
                  "# layers", "sequence length", "tensor parallelism", "data parallelism", "pipeline parallelism",
                  "iteration time (ms)")
_VTRAIN_REQUIRED = VTRAIN_COLUMNS[1:]

#: Columns of reference/published_runs_h100.csv (the published-runs format).
PUBLISHED_COLUMNS = (
    "row_id", "source_id", "source_location", "framework", "system", "gpu_type", "num_gpus", "gpus_per_node",
    "intra_node_link", "inter_node_network", "model", "params_b", "num_layers", "hidden_size", "ffn_hidden_size",
    "num_heads", "num_kv_heads", "vocab_size", "seq_len", "num_experts", "moe_top_k", "moe_layer_pattern", "tp", "pp",
    "vpp", "dp", "cp", "ep", "sp", "zero_fsdp", "micro_batch_size", "global_batch_size", "grad_accum",
    "activation_recompute", "precision", "tflops_per_gpu", "tflops_definition", "mfu_pct", "hfu_pct",
    "pct_of_peak_reported", "step_time_s", "tokens_per_s_total", "tokens_per_s_per_gpu", "other_metrics",
    "derived_fields", "reliability", "notes")
_MEASUREMENT_COLUMNS = ("step_time_s", "tokens_per_s_total", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu_pct")


class Unsupported(Exception):
    """A row clustersim cannot simulate yet; ``reason`` names the missing feature."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class InvalidRow(ValueError):
    """A row that contradicts itself (degrees vs GPUs, missing batch, unreadable number)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# -- small parsers ---------------------------------------------------------------------------------
def _cell(row: dict, key: str) -> str:
    """The stripped text of a cell; "" for a missing column."""
    v = row.get(key)
    return "" if v is None else str(v).strip()


def _num(row: dict, key: str) -> float | None:
    """A cell as a finite number (thousands commas allowed); None when empty, :class:`InvalidRow` otherwise."""
    s = _cell(row, key).replace(",", "")
    if not s:
        return None
    try:
        v = float(s)
    except ValueError:
        raise InvalidRow(f"{key} {s!r} is not a number") from None
    if not math.isfinite(v):
        raise InvalidRow(f"{key} {s!r} is not a finite number")
    return v


def _int(row: dict, key: str, minimum: int = 1) -> int | None:
    """A cell as a whole number >= ``minimum``; None when empty, :class:`InvalidRow` otherwise."""
    v = _num(row, key)
    if v is None:
        return None
    if v != int(v) or v < minimum:
        raise InvalidRow(f"{key} {_cell(row, key)!r} must be an integer >= {minimum}")
    return int(v)


def _bool(row: dict, key: str) -> bool | None:
    """A yes/no cell; None when empty, :class:`InvalidRow` otherwise.  An annotation after the
    word is allowed and ignored: ``yes (TP/SP)`` is True, ``no (pre-SP)`` False."""
    s = _cell(row, key).lower()
    if not s or s in _UNSTATED:
        return None
    s = re.sub(r"^[a-z_ -]+=\s*", "", s)              # "sp=true", "sequence_parallel = on"
    s = re.split(r"[\s(;,:]", s, maxsplit=1)[0] or s
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise InvalidRow(f"{key} {_cell(row, key)!r} is not a boolean (yes / no, true / false, on / off, \u2713 / \u2717, "
                     "optionally followed by a note)")


#: Words (the first of a cell) read as yes / no; the check marks tables use included.
_TRUE = ("true", "yes", "y", "1", "on", "enabled", "enable", "\u2713", "\u2714", "\u2705", "\u2611")
_FALSE = ("false", "no", "n", "0", "off", "disabled", "disable", "none", "\u2717", "\u2718", "\u274c")
#: Whole cells that say the source did not state it (as an empty cell does).
_UNSTATED = ("-", "\u2013", "\u2014", "n/a", "na", "?", "unknown", "not stated")


def _key(s: str) -> str:
    """``s`` lower-cased without punctuation or spaces, for case- and punctuation-blind matching."""
    return re.sub(r"[^a-z0-9]", "", s.lower())


# -- loading ---------------------------------------------------------------------------------------
def detect_format(columns) -> str:
    """``'vtrain'`` or ``'published'`` from a header; ConfigError naming the expected columns."""
    cols = {c.strip() for c in columns if c is not None}
    if all(c in cols for c in _VTRAIN_REQUIRED):
        return "vtrain"
    if "model" in cols and "num_gpus" in cols and ("gpu_type" in cols or "system" in cols) \
            and any(c in cols for c in _MEASUREMENT_COLUMNS):
        return "published"
    raise ConfigError("runs", ", ".join(sorted(cols))[:200],
                      "unrecognised columns: expected the published-runs format (model, gpu_type, num_gpus and one "
                      f"of {', '.join(_MEASUREMENT_COLUMNS)}) or vTrain's ({', '.join(_VTRAIN_REQUIRED)})")


def load_runs(path) -> list[dict]:
    """Rows of a runs table, each a dict of its cells plus ``_format`` and ``_line``.

    ``_format`` is ``'published'`` or ``'vtrain'`` (see the module docstring); ``_line``
    the row's line number in the file.  ConfigError for a missing file or an unknown header.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError("runs", str(path), "file not found")
    with p.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            raise ConfigError("runs", str(path), "empty file: expected a CSV header")
        reader.fieldnames = [c.strip() for c in reader.fieldnames]
        fmt = detect_format(reader.fieldnames)
        rows = []
        for row in reader:
            d = {k: (v.strip() if isinstance(v, str) else "") for k, v in row.items() if k is not None}
            if not any(d.values()):
                continue
            d["_format"] = fmt
            d["_line"] = reader.line_num
            d["_file"] = p.name
            rows.append(d)
    return rows
