"""Timeline export: Chrome / Perfetto trace JSON, and CSV / Parquet tables.

The timeline is the engine's pandas DataFrame, one row per executed op, with the contract's
columns ``rank, node, stream, kind, name, layer, microbatch, chunk, phase, axis, start_s,
end_s, flops, size_bytes`` (and optionally ``step``).

Chrome trace layout (the "JSON Object Format" of the Trace Event Format, which
https://ui.perfetto.dev and chrome://tracing open):

* one *process* per host: ``pid = node``, named ``"host N"``, sorted by host;
* one *thread* per (rank, stream): ``tid = rank * stride + stream index`` with the fixed
  stream indices ``compute 0, tp 1, cp 2, ep 3, pp 4, dp 5`` (any other stream follows,
  alphabetically) and ``stride = 10`` while there are at most ten streams, so ``tid 31`` is
  rank 3's ``tp`` stream; named ``"rank R <stream>"`` and sorted by tid, hence in rank order;
* one complete event (``"ph": "X"``) per op, ``ts`` and ``dur`` in microseconds (rounded to
  the nanosecond), ``cat`` = the op kind, plus ``",<axis>"`` for communication, and ``args``
  carrying rank, layer, microbatch, chunk, phase, axis, flops, size_bytes (and step).

Everything written is plain Python ``int``/``float``/``str`` (no numpy scalars) and strict
JSON (NaN becomes ``null``).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["STREAM_ORDER", "TIMELINE_COLUMNS", "LARGE_TRACE_BYTES", "estimate_trace_bytes", "read_timeline",
           "stream_order", "to_chrome_trace", "write_chrome", "write_timeline"]

LARGE_TRACE_BYTES = 100e6
"""Above this estimated JSON size ``clustersim run`` says how large the trace will be and
suggests the gzip form (``--trace NAME.json.gz``)."""

TIMELINE_COLUMNS = ("rank", "node", "stream", "kind", "name", "layer", "microbatch", "chunk", "phase", "axis",
                    "start_s", "end_s", "flops", "size_bytes")
"""The timeline's columns (docs/design.md, "Metrics"); ``step`` is optional."""

STREAM_ORDER = ("compute", "tp", "cp", "ep", "pp", "dp")
"""Display order of a rank's streams (compute first, then communication axes)."""

_STRING_COLUMNS = ("stream", "kind", "name", "phase", "axis")
_FLOAT_COLUMNS = ("start_s", "end_s", "flops", "size_bytes")


def _require_columns(timeline: pd.DataFrame, columns) -> None:
    if not isinstance(timeline, pd.DataFrame):
        raise TypeError(f"timeline must be a pandas DataFrame, got {type(timeline).__name__}")
    missing = [c for c in columns if c not in timeline.columns]
    if missing:
        raise ValueError(f"timeline is missing column(s) {', '.join(missing)}; "
                         f"expected {', '.join(TIMELINE_COLUMNS)}")


def stream_order(streams) -> list[str]:
    """Known streams in ``STREAM_ORDER``, then unknown ones alphabetically."""
    present = {str(s) for s in streams}
    return [s for s in STREAM_ORDER if s in present] + sorted(present.difference(STREAM_ORDER))


def _ints(col: pd.Series, missing: int = -1) -> list[int]:
    a = np.asarray(col, dtype=float)
    a = np.where(np.isfinite(a), a, missing)
    return a.astype(np.int64).tolist()


def _floats(values: np.ndarray) -> list:
    out = values.tolist()
    if not np.isfinite(values).all():
        out = [v if math.isfinite(v) else None for v in out]
    return out


def _strings(col: pd.Series) -> list[str]:
    return col.fillna("").astype(str).tolist()


def _jsonable(obj: Any) -> Any:
    """Plain-JSON copy of ``obj``: numpy scalars/arrays, paths, tuples, sets and dataclasses converted."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj))
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return [_jsonable(v) for v in items]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def to_chrome_trace(timeline: pd.DataFrame, path: str | Path | None = None, *,
                    metadata: Mapping[str, Any] | None = None) -> dict:
    """Convert a timeline to a Chrome trace (Perfetto-compatible) and optionally write it.

    Parameters
    ----------
    timeline
        The engine's timeline DataFrame (contract columns; ``step`` optional).
    path
        Where to write the JSON; a name ending in ``.gz`` is gzip-compressed (Perfetto opens
        both). Nothing is written when ``None``.
    metadata
        Extra run information (scenario, metrics, ...) stored under ``"otherData"``; converted
        to plain JSON types.

    Returns
    -------
    dict
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``; metadata
        events (process/thread names and sort indices) come first, then one ``"X"`` event per
        timeline row, in timeline order.
    """
    _require_columns(timeline, TIMELINE_COLUMNS)
    df = timeline
    present = {str(v) for v in df["stream"].unique()}
    streams = [*STREAM_ORDER, *sorted(present.difference(STREAM_ORDER))]   # fixed indices for known streams
    stride = max(10, len(streams))
    stream_idx = {s: i for i, s in enumerate(streams)}

    rank = np.asarray(_ints(df["rank"]), dtype=np.int64)
    node = np.asarray(_ints(df["node"], missing=0), dtype=np.int64)
    stream = _strings(df["stream"])
    sidx = np.fromiter((stream_idx[s] for s in stream), dtype=np.int64, count=len(stream))
    tid = rank * stride + sidx

    events: list[dict] = []
    # process (host) metadata, in host order
    for n in sorted(set(node.tolist())):
        events.append({"name": "process_name", "ph": "M", "pid": n, "tid": 0, "args": {"name": f"host {n}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": n, "tid": 0, "args": {"sort_index": n}})
    # thread (rank·stream) metadata; sort_index = tid puts threads in rank, then stream order
    threads = sorted(set(zip(node.tolist(), tid.tolist())), key=lambda p: (p[1], p[0]))
    for n, t in threads:
        r, s = divmod(t, stride)
        events.append({"name": "thread_name", "ph": "M", "pid": n, "tid": t,
                       "args": {"name": f"rank {r} {streams[s]}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": n, "tid": t, "args": {"sort_index": t}})

    start = np.asarray(df["start_s"], dtype=float)
    end = np.asarray(df["end_s"], dtype=float)
    ts = _floats(np.round(start * 1e6, 3))
    dur = _floats(np.round(np.maximum(end - start, 0.0) * 1e6, 3))
    kind = _strings(df["kind"])
    axis = _strings(df["axis"])
    cat = [k if not a else f"{k},{a}" for k, a in zip(kind, axis)]
    names = _strings(df["name"])
    layer, mb, chunk = _ints(df["layer"]), _ints(df["microbatch"]), _ints(df["chunk"], missing=0)
    phase = _strings(df["phase"])
    flops = _floats(np.asarray(df["flops"], dtype=float))
    size = _floats(np.asarray(df["size_bytes"], dtype=float))
    step = _ints(df["step"]) if "step" in df.columns else None
    pid_l, tid_l, rank_l = node.tolist(), tid.tolist(), rank.tolist()

    for i in range(len(df)):
        args = {"rank": rank_l[i], "layer": layer[i], "microbatch": mb[i], "chunk": chunk[i], "phase": phase[i],
                "axis": axis[i], "flops": flops[i], "size_bytes": size[i]}
        if step is not None:
            args["step"] = step[i]
        events.append({"name": names[i], "cat": cat[i], "ph": "X", "ts": ts[i], "dur": dur[i],
                       "pid": pid_l[i], "tid": tid_l[i], "args": args})

    other = {"generator": "clustersim", "ts_unit": "us", "tid_formula": f"rank * {stride} + stream index",
             "streams": streams}
    if metadata:
        other.update(_jsonable(metadata))
    trace = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}
    if path is not None:
        _write_json(trace, Path(path))
    return trace


def _write_json(obj: dict, path: Path) -> None:
    if path.suffix == ".gz":
        # level 6: nearly level 9's size at a fraction of its time on a multi-GB trace
        f = gzip.open(path, "wt", encoding="utf-8", compresslevel=6)
    else:
        f = open(path, "w", encoding="utf-8")
    with f:
        json.dump(obj, f, allow_nan=False, separators=(",", ":"))


def estimate_trace_bytes(timeline: pd.DataFrame, sample: int = 256) -> int:
    """About how many bytes ``to_chrome_trace`` writes as plain JSON for ``timeline``.

    The per-thread metadata is counted exactly (one row per (rank, node, stream) converted);
    the op events are ``sample`` evenly spaced rows converted and scaled by the row count (one
    event per row; names and args vary little along a timeline), so it costs about the same
    for a thousand rows as for millions. Exact when the timeline has at most ``sample`` rows.
    """
    _require_columns(timeline, TIMELINE_COLUMNS)
    n = len(timeline)
    if n <= sample:
        return len(json.dumps(to_chrome_trace(timeline), allow_nan=False, separators=(",", ":")).encode())

    def sizes(df: pd.DataFrame) -> tuple[int, int]:
        """(bytes of the whole trace of df, bytes of its op events with their separators)"""
        t = to_chrome_trace(df)
        ops = sum(len(json.dumps(e, allow_nan=False, separators=(",", ":")).encode()) + 1
                  for e in t["traceEvents"] if e["ph"] == "X")
        return len(json.dumps(t, allow_nan=False, separators=(",", ":")).encode()), ops

    threads = timeline.drop_duplicates(["rank", "node", "stream"])
    whole, ops = sizes(threads)
    idx = np.unique(np.linspace(0, n - 1, sample).astype(np.int64))
    _, sampled = sizes(timeline.iloc[idx])
    return int(round(whole - ops + sampled * n / len(idx)))


def write_chrome(timeline: pd.DataFrame, path: str | Path, *, metadata: Mapping[str, Any] | None = None) -> Path:
    """Write the Chrome/Perfetto trace of ``timeline`` to ``path`` (see ``to_chrome_trace``); return the path."""
    to_chrome_trace(timeline, path, metadata=metadata)
    return Path(path)


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


_PARQUET_HELP = ("writing/reading a Parquet timeline needs the optional package 'pyarrow' "
                 "(pip install pyarrow); or use a .csv path instead")


def write_timeline(timeline: pd.DataFrame, path: str | Path) -> Path:
    """Write the timeline as Parquet (suffix ``.parquet``/``.pq``, needs pyarrow) or CSV (any other name).

    CSV keeps full float precision (pandas writes ``repr`` floats); compression follows the
    suffix (``.csv.gz``). Read it back with ``read_timeline`` to get ``''`` (not NaN) in the
    ``axis`` column of compute ops. Raises ``ImportError`` naming pyarrow when Parquet is asked
    for and pyarrow is missing. Returns the path.
    """
    _require_columns(timeline, TIMELINE_COLUMNS)
    path = Path(path)
    if _is_parquet(path):
        try:
            import pyarrow  # noqa: F401
        except ImportError as e:
            raise ImportError(f"cannot write {path}: {_PARQUET_HELP}") from e
        timeline.to_parquet(path, index=False, engine="pyarrow")
    else:
        timeline.to_csv(path, index=False)
    return path


def read_timeline(path: str | Path) -> pd.DataFrame:
    """Read a timeline written by ``write_timeline``; string columns come back with ``''`` for empty."""
    path = Path(path)
    if _is_parquet(path):
        try:
            import pyarrow  # noqa: F401
        except ImportError as e:
            raise ImportError(f"cannot read {path}: {_PARQUET_HELP}") from e
        return pd.read_parquet(path, engine="pyarrow")
    nan_tokens = ["", "nan", "NaN", "NA"]
    df = pd.read_csv(path, keep_default_na=False,
                     na_values={c: nan_tokens for c in (*_FLOAT_COLUMNS, "layer", "microbatch", "chunk")},
                     dtype={c: str for c in _STRING_COLUMNS})
    return df
