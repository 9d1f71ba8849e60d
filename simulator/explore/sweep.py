"""Sweeps: many scenarios through the full simulator, locally or on Dask, resumable.

A sweep file names a ``base`` scenario (a mapping, or the path of a scenario YAML) and
either a ``grid`` (dotted scenario fields -> lists of values; every combination is a
point) or a list of ``points`` (each a mapping of dotted fields -> values)::

    base: experiments/configs/llama3-70b-64xh100.yaml
    grid:
      parallel.global_batch_size: [64, 128, 256]
      parallel.schedule: [1f1b, interleaved_1f1b]
      cluster.oversubscription: [1, 2]

Every point becomes one row of an SQLite database (:class:`Store`), keyed by the hash of
its full scenario: config JSON, metrics, status (``ok`` | ``invalid`` | ``error`` |
``timeout``: the point outlived the sweep's per-point time limit), error
text, wall time, the clustersim and package versions (with a fingerprint of clustersim's
source).  Only the client process writes it, one committed row per finished point, so a
crash or Ctrl-C loses nothing that finished, and running the same sweep again skips every
point finished by the same code; rows from other code run again.

Execution goes through one interface, :class:`Executor` (``imap``: items in, results
out as they finish): :class:`LocalExecutor` (worker processes; the default, no server) or
:class:`DaskExecutor` (an existing ``distributed`` scheduler, or a ``LocalCluster``).
Workers return results; they never touch the database.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from importlib import metadata
from pathlib import Path

from topologies import ConfigError

from ..engine.limits import TimeLimitExceeded, time_limit
from ..scenario import read_yaml

__all__ = ["expand", "load_sweep", "config_hash", "Store", "Executor", "LocalExecutor", "DaskExecutor",
           "make_executor", "simulate_point", "run_points", "METRIC_KEYS", "PointTimeout"]

#: Metrics kept per point (the run contract's scalars and per-axis exposure).
METRIC_KEYS = ("step_time_s", "mfu", "mfu_bf16_peak", "hfu", "tflops_per_gpu", "tokens_per_s", "bubble_fraction",
               "exposed_comm_s", "peak_memory_bytes", "num_gpus")


# -- the sweep file ---------------------------------------------------------------------------
def set_dotted(d: dict, dotted: str, value) -> None:
    """Set ``d[a][b][c] = value`` for ``dotted = "a.b.c"``, creating mappings on the way; a
    ``model`` or ``cluster`` given as a preset name becomes ``{preset: name}`` first.  The
    sweep's grid keys and ``clustersim run --set`` both use it."""
    keys = dotted.split(".")
    cur = d
    for k in keys[:-1]:
        nxt = cur.get(k)
        if nxt is None:
            nxt = cur[k] = {}
        elif not isinstance(nxt, dict):
            if k in ("model", "cluster"):          # a preset name becomes {preset: name}
                nxt = cur[k] = {"preset": nxt}
            else:
                raise ConfigError(dotted, value, f"'{k}' is not a mapping in the base scenario")
        cur = nxt
    cur[keys[-1]] = value


def _load_base(base, where: str = "base") -> dict:
    if isinstance(base, dict):
        return copy.deepcopy(base)
    if isinstance(base, str):
        return read_yaml(base, where, "a scenario mapping")
    raise ConfigError(where, base, "must be a scenario mapping or the path of a scenario YAML")


def expand(spec: dict) -> list[dict]:
    """The scenarios of a sweep spec (``base`` + ``grid`` or ``points``), in order; grid keys
    are dotted paths into the scenario, the last key varying fastest.

    >>> [c["parallel"] for c in expand({"base": {"model": "tiny-dense"},
    ...                                 "grid": {"parallel.tp": [1, 2], "parallel.pp": [1, 2]}})]
    [{'tp': 1, 'pp': 1}, {'tp': 1, 'pp': 2}, {'tp': 2, 'pp': 1}, {'tp': 2, 'pp': 2}]
    """
    if not isinstance(spec, dict):
        raise ConfigError("sweep", spec, "expected a mapping with 'base' and 'grid' or 'points'")
    unknown = set(spec) - {"base", "grid", "points", "name", "description"}
    if unknown:
        raise ConfigError(f"sweep.{sorted(unknown)[0]}", spec[sorted(unknown)[0]],
                          "unknown key; valid keys: base, grid, points, name, description")
    if "base" not in spec:
        raise ConfigError("sweep.base", None, "required: a scenario mapping or a scenario YAML path")
    base = _load_base(spec["base"], "sweep.base")
    if ("grid" in spec) == ("points" in spec):
        raise ConfigError("sweep", sorted(spec), "give exactly one of 'grid' and 'points'")
    if "grid" in spec:
        grid = spec["grid"]
        if not isinstance(grid, dict) or not grid:
            raise ConfigError("sweep.grid", grid, "must map dotted scenario fields to lists of values")
        for k, v in grid.items():
            if not isinstance(v, list) or not v:
                raise ConfigError(f"sweep.grid.{k}", v, "must be a non-empty list of values")
        points = [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]
    else:
        points = spec["points"]
        if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
            raise ConfigError("sweep.points", points, "must be a list of mappings (dotted field -> value)")
    out = []
    for p in points:
        sc = copy.deepcopy(base)
        for k, v in p.items():
            set_dotted(sc, str(k), v)
        out.append(sc)
    return out


def load_sweep(path) -> list[dict]:
    """:func:`expand` of a sweep YAML file (a relative ``base`` path is tried from the
    current directory, then from the sweep file's folder)."""
    path = Path(path)
    spec = read_yaml(path, "sweep", "a mapping with 'base' and 'grid' or 'points'")
    if isinstance(spec.get("base"), str):
        b = Path(spec["base"])
        if not b.is_file() and (path.parent / b).is_file():
            spec = {**spec, "base": str(path.parent / b)}
    return expand(spec)


def config_hash(config: dict) -> str:
    """Hash of a scenario: SHA-256 of its canonical JSON (sorted keys), 16 hex digits."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def code_fingerprint() -> str:
    """Hash of clustersim's own source and preset files: results from other code are stale
    (the package version does not change with every commit)."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        root = Path(__file__).resolve().parents[2]
        h = hashlib.sha256()
        for pkg in ("simulator", "workloads", "topologies"):
            for f in sorted((root / pkg).rglob("*")):
                if f.suffix in (".py", ".yaml") and f.is_file():
                    h.update(str(f.relative_to(root)).encode())
                    h.update(f.read_bytes())
        _FINGERPRINT = h.hexdigest()[:16]
    return _FINGERPRINT


_FINGERPRINT: str | None = None


def versions() -> dict:
    out = {"python": sys.version.split()[0], "clustersim_code": code_fingerprint()}
    for pkg in ("clustersim", "simpy", "networkx", "numpy", "pandas"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


# -- the results database ---------------------------------------------------------------------
class Store:
    """An SQLite file of finished points, one row per config hash (written by the client)."""

    SCHEMA = """CREATE TABLE IF NOT EXISTS points (
        hash TEXT PRIMARY KEY, config TEXT NOT NULL, metrics TEXT, status TEXT NOT NULL,
        error TEXT, wall_s REAL, versions TEXT, finished_at REAL)"""

    def __init__(self, path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path))
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(self.SCHEMA)
        self.db.commit()
        self._versions = json.dumps(versions(), sort_keys=True)

    def finished(self, retry_failed: bool = False) -> set[str]:
        """Hashes of points finished by this code (a row written by other clustersim code is
        stale: it runs again and is replaced)."""
        q = "SELECT hash, versions FROM points" + (" WHERE status = 'ok'" if retry_failed else "")
        code = code_fingerprint()
        return {h for h, ver in self.db.execute(q) if json.loads(ver or "{}").get("clustersim_code") == code}

    def put(self, h: str, config: dict, result: dict) -> None:
        self.db.execute("INSERT OR REPLACE INTO points VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (h, json.dumps(config, sort_keys=True, default=str),
                         json.dumps(result.get("metrics"), sort_keys=True) if result.get("metrics") is not None
                         else None, result["status"], result.get("error"), result.get("wall_s"), self._versions,
                         time.time()))
        self.db.commit()

    def rows(self, hashes: Iterable[str] | None = None) -> list[dict]:
        cur = self.db.execute("SELECT hash, config, metrics, status, error, wall_s, versions FROM points "
                              "ORDER BY finished_at")
        want = None if hashes is None else set(hashes)
        out = []
        for h, cfg, met, status, err, wall, ver in cur:
            if want is not None and h not in want:
                continue
            out.append({"hash": h, "config": json.loads(cfg), "metrics": json.loads(met) if met else None,
                        "status": status, "error": err, "wall_s": wall, "versions": json.loads(ver)})
        return out

    def close(self) -> None:
        self.db.close()


# -- executors --------------------------------------------------------------------------------
class Executor:
    """Runs ``fn`` over items in worker processes; yields ``(index, result)`` as they finish."""

    def imap(self, fn: Callable, items: list) -> Iterator[tuple[int, object]]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalExecutor(Executor):
    """Local worker processes (``workers``: default the CPU count; 1 runs in this process)."""

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._pool = None

    def imap(self, fn, items):
        if self.workers == 1 or len(items) <= 1:
            for i, item in enumerate(items):
                yield i, fn(item)
            return
        import concurrent.futures as cf
        import multiprocessing as mp
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"))
        futures = {self._pool.submit(fn, item): i for i, item in enumerate(items)}
        try:
            for fut in cf.as_completed(futures):
                yield futures[fut], fut.result()
        finally:
            for fut in futures:
                fut.cancel()

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class DaskExecutor(Executor):
    """A Dask ``distributed`` cluster: ``address`` of a running scheduler, or ``"local"`` for
    a :class:`distributed.LocalCluster` of ``workers`` single-threaded worker processes."""

    def __init__(self, address: str = "local", workers: int | None = None):
        from distributed import Client, LocalCluster
        self._cluster = None
        if address == "local":
            self._cluster = LocalCluster(n_workers=max(1, workers or os.cpu_count() or 1), threads_per_worker=1,
                                         processes=True, dashboard_address=None)
            self.client = Client(self._cluster)
        else:
            try:
                self.client = Client(address, timeout="20s")
            except OSError as e:
                raise ConfigError("--dask", address, f"cannot reach the Dask scheduler: {e}") from None

    def imap(self, fn, items):
        from distributed import as_completed
        futures = self.client.map(fn, items, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        try:
            for fut in as_completed(futures):
                yield index[fut.key], fut.result()
        finally:
            self.client.cancel(futures)

    def close(self):
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def make_executor(dask: str | None = None, workers: int | None = None) -> Executor:
    """``dask``: None for local processes, ``"local"`` or a scheduler address for Dask."""
    return LocalExecutor(workers) if dask is None else DaskExecutor(dask, workers)


# -- one point --------------------------------------------------------------------------------
# A point past its limit is stopped by the engine's wall-clock limit (simulator.engine.limits:
# checked in the event loop, and an asynchronous exception for the rest); the name is kept here
# for callers of the sweep API.
PointTimeout = TimeLimitExceeded


def simulate_point(config: dict, timeout_s: float | None = None) -> dict:
    """Run one scenario with the full simulator (in a worker): ``{status, metrics, error,
    wall_s}``; bad input is ``invalid``, a crash ``error``, a run past ``timeout_s`` seconds
    ``timeout``, never an exception."""
    t0 = time.perf_counter()
    try:
        from ..engine import SimulationError, run
        try:
            with time_limit(timeout_s):
                res = run(config)
        except PointTimeout:
            return {"status": "timeout", "metrics": None, "wall_s": time.perf_counter() - t0,
                    "error": f"stopped at the per-point time limit of {timeout_s:g} s"}
        m = res.metrics
        metrics = {k: m[k] for k in METRIC_KEYS if k in m}
        return {"status": "ok", "metrics": _jsonable(metrics), "error": None, "wall_s": time.perf_counter() - t0}
    except (ConfigError, SimulationError) as e:
        status = "invalid" if isinstance(e, ConfigError) else "error"
        return {"status": status, "metrics": None, "error": str(e), "wall_s": time.perf_counter() - t0}
    except Exception as e:                     # a defect: recorded, the sweep goes on
        return {"status": "error", "metrics": None, "error": f"{type(e).__name__}: {e}",
                "wall_s": time.perf_counter() - t0}


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item"):
        return x.item()
    return x


def run_points(configs: list[dict], store: Store, executor: Executor, *, fn: Callable = simulate_point,
               progress: bool = True, retry_failed: bool = False, desc: str = "points",
               timeout_s: float | None = None) -> dict:
    """Run every config not yet in ``store``; write each result as it arrives.

    ``timeout_s``: the per-point time limit (``fn`` must take it as ``timeout_s``, as
    :func:`simulate_point` does); a point past it is recorded as ``timeout`` and, like a
    failed one, runs again only with ``retry_failed``.

    Returns counts: ``total``, ``skipped`` (already finished), ``ok``, ``failed`` (timeouts
    included).
    """
    if timeout_s is not None:
        if not timeout_s > 0:
            raise ConfigError("--point-timeout", timeout_s, "must be a number of seconds > 0")
        fn = functools.partial(fn, timeout_s=float(timeout_s))
    hashes = [config_hash(c) for c in configs]
    done = store.finished(retry_failed)
    todo, seen = [], set()
    for h, c in zip(hashes, configs):
        if h not in done and h not in seen:
            seen.add(h)
            todo.append((h, c))
    counts = {"total": len(set(hashes)), "skipped": len(set(hashes) & done), "ok": 0, "failed": 0}
    bar = None
    if progress:
        from ..report.progress import progress_bar
        bar = progress_bar(counts["total"], desc, "pt", initial=counts["skipped"], stream=sys.stderr)
    try:
        for i, result in executor.imap(fn, [c for _, c in todo]):
            h, c = todo[i]
            store.put(h, c, result)
            counts["ok" if result["status"] == "ok" else "failed"] += 1
            if bar is not None:
                bar.set_postfix(failed=counts["failed"], refresh=False)     # shown by the update
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return counts
