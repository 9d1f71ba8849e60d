"""An error bar on a predicted step: where the measured step is likely to fall, from the
validation residuals of comparable measured runs.

The residuals come from the committed prediction tables (``experiments/predictions/
predictions_<set>.csv``, written by ``clustersim validate`` / ``experiments/validate_all.py``):
every ``ok`` row's measured and predicted step.  The signed error there is
``(predicted - measured) / measured``; here a row's residual is the log-ratio
``r = ln(measured / predicted)``, so a model that predicts too fast (negative error) has
``r > 0`` and puts the measured step *above* the prediction.  An interval on ``r`` turns into
one on the measured step: ``predicted x exp(r_low) .. predicted x exp(r_high)``.

**Comparable rows** share a stratum (:class:`Stratum`): the kernel stack (``megatron_core``:
Megatron-Core / NeMo / Megatron-Bridge / Megatron-DeepSpeed; ``llm_foundry``: Composer with
PyTorch FSDP), the GPU generation (ampere, hopper, blackwell), the model family (dense, moe,
hybrid) and the scope (one host of at most 8 GPUs, or several hosts: the vTrain single-host
set, 1,440 runs on one A100 host whose errors differ from the multi-host runs, would otherwise
outweigh them 13 to 1).

**The interval** of a stratum with at least :data:`MIN_ROWS` rows from at least
:data:`MIN_ROWS` distinct configurations is the pair of order statistics
``r_(k_lo), r_(k_hi)`` with ``k_lo = floor(0.1 (n + 1))`` and ``k_hi = ceil(0.9 (n + 1))``
(:func:`order_interval`): for exchangeable residuals a new one falls between them with
probability ``(k_hi - k_lo) / (n + 1)``, at least 80 % and close to it; with few rows it
widens towards the smallest and largest residual (at n = 10 it is the whole range), which is
the small-sample widening.  A smaller stratum takes the pooled interval of the next coarser
group that has enough (the same stack, generation and family across scopes; then the stack and
generation), widened to cover its own rows' 10th to 90th percentile when it has at least 3,
and says so.  When no row shares the stack, generation and family there is no interval:
"no comparable measurements" (a framework, GPU generation or model family never measured; a
GPU given by its specs or an AMD part is not an NVIDIA generation that was measured).

**Out of fold.**  No constant of clustersim is fitted on step times (the NCCL constants come
from collective microbenchmarks, the compute constants from datasheets and matmul
measurements), so every residual is already out of fold with respect to the step-time
sources.  A table that carries ``oof_predicted_step_s`` (the prediction of a row by constants
fitted without that row's source) is read in place of ``predicted_step_s``, so a fitted
constant's leave-one-source-out predictions slot in.  The coverage check
(:func:`coverage_table`) holds each row out: its interval is built from the other rows, leaving
out its source where the stratum has several sources (leave-one-source-out) and otherwise every
row of its configuration (leave-one-configuration-out: the releases that measured the same
configuration are not independent evidence).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

__all__ = ["MIN_ROWS", "LEVEL", "Interval", "Residual", "Stratum", "coverage_table", "interval_for", "scenario_interval",
           "result_interval", "step_text", "mapping_interval",
           "order_interval", "predictions_dir", "residuals", "row_interval", "row_stratum", "scenario_stratum",
           "SIGN_NOTE"]

LEVEL = 0.8
"""The stated interval holds the measured step with this probability (80 %)."""

MIN_ROWS = 10
"""Rows (and distinct configurations) a stratum needs for an interval of its own."""

ONE_HOST_GPUS = 8
"""A run on at most this many GPUs is a one-host run (the scope of a stratum)."""

SIGN_NOTE = ("error = (predicted - measured) / measured: a model that predicts too fast puts the measured step "
             "above the prediction")

_STACK_LABEL = {"megatron_core": "Megatron", "llm_foundry": "llm-foundry"}
#: Stacks that are variants of one framework's stack (another attention kernel) share its
#: measured rows: the llm-foundry set holds both kernels' runs under one framework cell.
_STACK_FAMILY = {"llm_foundry_flash": "llm_foundry"}


def predictions_dir() -> Path:
    """``experiments/predictions`` of the checkout clustersim runs from."""
    return Path(__file__).resolve().parents[2] / "experiments" / "predictions"


@dataclass(frozen=True)
class Stratum:
    """What makes measured runs comparable to a prediction."""

    stack: str
    generation: str
    family: str
    scope: str                       # "one host" or "several hosts"

    def label(self, levels: int = 4) -> str:
        """``Megatron-Core, Hopper, dense, several hosts`` (the first ``levels`` parts)."""
        parts = [_STACK_LABEL.get(self.stack, self.stack), self.generation.capitalize(), self.family, self.scope]
        return ", ".join(parts[:levels])

    def key(self, levels: int = 4) -> tuple:
        return (self.stack, self.generation, self.family, self.scope)[:levels]


@dataclass(frozen=True)
class Residual:
    """One measured row: its log-ratio ``ln(measured / predicted)`` and where it comes from."""

    r: float
    stratum: Stratum
    source: str
    config: tuple
    id: str = ""


@dataclass(frozen=True)
class Interval:
    """Where the measured step is likely to be, as multiples of the predicted step.

    ``low`` / ``high`` are ``exp`` of the residual quantiles (None: no comparable measurements);
    ``rows`` and ``sets`` the measured runs it rests on; ``basis`` how (own stratum, or pooled)."""

    low: float | None
    high: float | None
    rows: int
    sets: tuple[str, ...]
    stratum: str
    basis: str
    fold: str = "no constant is fitted on step times: every residual is out of fold"
    notes: tuple[str, ...] = field(default=())

    @property
    def sign(self) -> str:
        """How the error's sign reads (:data:`SIGN_NOTE`)."""
        return SIGN_NOTE

    @property
    def known(self) -> bool:
        return self.low is not None

    def bounds(self, step_s: float) -> tuple[float, float] | None:
        """(low, high) seconds around a predicted step; None without comparable measurements."""
        if not self.known or step_s is None or not math.isfinite(step_s):
            return None
        return step_s * self.low, step_s * self.high

    def short(self, step_s: float) -> str:
        """``likely 8.3-9.6 s; 41 comparable measured runs`` or ``no comparable measurements``."""
        if self.bounds(step_s) is None:
            return "no comparable measurements"
        pooled = ", pooled" if self.basis.startswith("pooled") else ""
        return f"likely {self.range_text(step_s)}; {self.rows} comparable measured runs{pooled}"

    def range_text(self, step_s: float) -> str:
        """``8.3-9.6 s``; empty without comparable measurements."""
        b = self.bounds(step_s)
        return f"{_sec(b[0])}-{_sec(b[1])} s" if b else ""

    def level_text(self) -> str:
        return f"{LEVEL:.0%} interval".replace("%", " %")

    def describe(self) -> str:
        """The stratum, its sets, how the interval was built."""
        if not self.known:
            return f"no comparable measurements ({self.stratum}): {self.basis}"
        return (f"{LEVEL:.0%} interval of the measured step from {self.rows} measured runs ({self.stratum}; "
                f"sets {', '.join(self.sets)}); {self.basis}; {self.fold}")

    def as_dict(self, step_s: float | None = None) -> dict:
        b = self.bounds(step_s) if step_s is not None else None
        return {"level": LEVEL, "low_s": b[0] if b else None, "high_s": b[1] if b else None,
                "low_ratio": self.low, "high_ratio": self.high, "rows": self.rows, "sets": list(self.sets),
                "stratum": self.stratum, "basis": self.basis, "fold": self.fold, "sign": SIGN_NOTE}


def _sec(x: float) -> str:
    """A step bound in plain decimals: one decimal from 10 s, else two significant digits.

    >>> _sec(8.314), _sec(12.46), _sec(0.0213), _sec(8.0)
    ('8.3', '12.5', '0.021', '8.0')
    """
    if x >= 10:
        return f"{x:.1f}"
    import numpy as np
    return np.format_float_positional(float(x), precision=2, unique=False, fractional=False, trim="0")


# -- the residual table ------------------------------------------------------------------------------
def order_interval(values, level: float = LEVEL) -> tuple[float, float] | None:
    """The ``(k_lo, k_hi)``-th smallest of ``values`` with ``k_lo = floor(a (n+1))``,
    ``k_hi = ceil((1-a)(n+1))``, ``a = (1 - level) / 2``; None when there are too few values
    (``k_lo < 1``: fewer than 9 at 80 %).

    >>> order_interval(range(10))
    (0, 9)
    >>> order_interval(range(20))
    (1, 18)
    >>> order_interval(range(5)) is None
    True
    """
    v = sorted(values)
    n = len(v)
    a = (1 - level) / 2
    lo, hi = math.floor(a * (n + 1) + 1e-9), math.ceil((1 - a) * (n + 1) - 1e-9)
    if lo < 1 or hi > n:
        return None
    return v[lo - 1], v[hi - 1]


def _percentile(values, q: float) -> float:
    v = sorted(values)
    x = q * (len(v) - 1)
    i = int(math.floor(x))
    return v[i] if i + 1 >= len(v) else v[i] + (v[i + 1] - v[i]) * (x - i)


@lru_cache(maxsize=None)
def _model_family(name: str) -> str:
    from workloads.model_loading import load_model

    from .ingest import Unsupported
    from .mapping import map_model
    try:
        preset, _ = map_model(name)
    except Unsupported:
        return "dense"                   # built from the row's dimensions: a dense transformer
    return model_family(load_model(preset))


def model_family(model) -> str:
    """``hybrid`` (a Mamba/attention layer pattern), ``moe`` or ``dense`` for a ModelSpec."""
    if getattr(model, "hybrid_override_pattern", None):
        return "hybrid"
    return "moe" if getattr(model, "moe", None) is not None else "dense"


@lru_cache(maxsize=None)
def _generation(gpu: str) -> str | None:
    from topologies.specs import get_gpu_spec

    from .ingest import Unsupported
    from .mapping import map_gpu
    try:
        return get_gpu_spec(map_gpu(gpu)[1]).generation
    except (Unsupported, Exception):     # noqa: BLE001 - a GPU clustersim cannot name has no generation
        return None


def _stack(framework: str) -> str:
    from .mapping import FRAMEWORKS, _framework
    return FRAMEWORKS[_framework(str(framework))[0]].get("stack", "megatron_core")


def _scope(num_gpus: int) -> str:
    return "one host" if num_gpus <= ONE_HOST_GPUS else "several hosts"


def row_stratum(row: dict) -> Stratum | None:
    """The stratum of a predictions-table row (None when its GPU has no generation)."""
    gen = _generation(str(row["gpu"]))
    if gen is None:
        return None
    fam = _model_family(str(row["model"]))
    if fam == "dense" and re.search(r"\bep([2-9]|\d\d+)\b", str(row.get("parallel", ""))):
        fam = "moe"                     # an unknown model run with expert parallelism
    return Stratum(_stack(row["framework"]), gen, fam, _scope(int(float(row["num_gpus"]))))


def _measured_part(gpu) -> bool:
    """An NVIDIA preset GPU (an AMD part borrows a generation's constants; a GPU given by its
    specs is no measured part)."""
    from topologies.specs import GPU_SPECS
    return gpu.name in GPU_SPECS and not gpu.name.upper().startswith("MI")


def scenario_stratum(scenario) -> Stratum | None:
    """The stratum of a loaded :class:`~simulator.scenario.Scenario`: its kernel stack, its
    GPU's generation, its model's family and its GPU count.  None for a GPU that is not an
    NVIDIA part of a measured generation (an AMD part borrows a generation's constants, and a
    GPU given by its specs is no measured part)."""
    gpu = scenario.cluster.gpu
    if not _measured_part(gpu):
        return None
    stack = _STACK_FAMILY.get(scenario.framework, scenario.framework)
    return Stratum(stack, gpu.generation, model_family(scenario.model), _scope(scenario.cluster.num_gpus))


def _config(row: dict) -> tuple:
    from .report import config_key
    return config_key(row)


def _row_residual(row: dict) -> Residual | None:
    if row.get("status") != "ok":
        return None
    try:
        measured = float(row["measured_step_s"])
        predicted = float(row.get("oof_predicted_step_s") or row["predicted_step_s"])
    except (TypeError, ValueError):
        return None
    stratum = row_stratum(row)
    if stratum is None or not (measured > 0 and predicted > 0):
        return None
    return Residual(math.log(measured / predicted), stratum, str(row["source"]), _config(row), str(row["id"]))


def residuals(paths=None) -> tuple[Residual, ...]:
    """The residuals of every ``ok`` row of the prediction tables (default: the committed
    ``experiments/predictions/predictions_*.csv``; none when there are none)."""
    if paths is None:
        d = predictions_dir()
        paths = sorted(d.glob("predictions_*.csv")) if d.is_dir() else []
    key = tuple((str(p), Path(p).stat().st_mtime_ns) for p in paths)
    return _residuals(key)


@lru_cache(maxsize=8)
def _residuals(key: tuple) -> tuple[Residual, ...]:
    out = []
    for path, _ in key:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                res = _row_residual(row)
                if res is not None:
                    out.append(res)
    return tuple(out)


# -- intervals ---------------------------------------------------------------------------------------
def _own(pool, stratum: Stratum, levels: int) -> list[Residual]:
    k = stratum.key(levels)
    return [p for p in pool if p.stratum.key(levels) == k]


def _enough(rows: list[Residual]) -> bool:
    return len(rows) >= MIN_ROWS and len({p.config for p in rows}) >= MIN_ROWS


def interval_for(stratum: Stratum | None, pool=None) -> Interval:
    """The interval of a stratum from the residual ``pool`` (default: :func:`residuals`)."""
    pool = residuals() if pool is None else pool
    if stratum is None:
        return Interval(None, None, 0, (), "a GPU that is no measured NVIDIA part", "no measured run on this GPU")
    if not _own(pool, stratum, 3):
        what = "no validation tables found" if not pool else "no measured run shares its stack, GPU generation " \
                                                              "and model family"
        return Interval(None, None, 0, (), stratum.label(3), what)
    own = _own(pool, stratum, 4)
    if _enough(own):
        lo, hi = order_interval([p.r for p in own])
        return Interval(math.exp(lo), math.exp(hi), len(own), _sets(own), stratum.label(4),
                        f"its own {len(own)} rows ({len({p.config for p in own})} configurations)")
    return _pooled(pool, stratum, own)


def _pooled(pool, stratum: Stratum, own: list[Residual]) -> Interval:
    """A stratum with too few rows: the next coarser group with enough, widened to its own rows."""
    for levels in (3, 2, 1):
        group = _own(pool, stratum, levels)
        if _enough(group):
            break
    else:
        group, levels = list(pool), 0
        if not _enough(group):
            return Interval(None, None, 0, (), stratum.label(4), "too few measured runs for an interval")
    lo, hi = order_interval([p.r for p in group])
    why = f"{len(own)} rows of its own" if own else "no rows of its own"
    basis = f"pooled over {stratum.label(levels) if levels else 'every measured run'} ({why}"
    if len(own) >= 3:
        lo, hi = min(lo, _percentile([p.r for p in own], 0.1)), max(hi, _percentile([p.r for p in own], 0.9))
        basis += ", widened to cover their 10th-90th percentile"
    rows = {id(p): p for p in group + own}
    return Interval(math.exp(lo), math.exp(hi), len(rows), _sets(list(rows.values())), stratum.label(4),
                    basis + ")")


def _sets(rows) -> tuple[str, ...]:
    return tuple(sorted({p.source for p in rows}))


def _held_out(pool, res: Residual) -> tuple[list[Residual], str]:
    """The pool without ``res``: without its source when several sources cover its stratum
    (leave-one-source-out), else without every row of its configuration."""
    same = _own(pool, res.stratum, 4)
    if len({p.source for p in same}) > 1:
        return [p for p in pool if not (p.source == res.source and p.stratum == res.stratum)], \
            "leave-one-source-out"
    return [p for p in pool if p.config != res.config], "leave-one-configuration-out"


def row_interval(row: dict, pool=None) -> Interval | None:
    """The out-of-sample interval of a predictions-table row: built without the row's own
    configuration (or source, :func:`_held_out`); None for a row without a stratum."""
    pool = residuals() if pool is None else pool
    stratum = row_stratum(row) if row.get("gpu") else None
    if stratum is None:
        return None
    res = Residual(0.0, stratum, str(row.get("source", "")), _config(row))
    kept, fold = _held_out(pool, res)
    iv = interval_for(stratum, kept)
    return Interval(iv.low, iv.high, iv.rows, iv.sets, iv.stratum, iv.basis, fold)


def coverage_table(pool=None) -> list[dict]:
    """Per stratum: rows, sets, the held-out scheme, and the share of rows whose measured step
    lies inside the 80 % interval built without them (:func:`_held_out`); ``covered`` is None
    for a stratum none of whose rows gets an interval."""
    pool = residuals() if pool is None else pool
    hits: dict[Stratum, list] = {}
    folds: dict[Stratum, set] = {}
    memo: dict[tuple, tuple[Interval, str]] = {}
    for res in pool:
        key = (res.stratum, res.config, res.source)      # rows of one configuration share their interval
        if key not in memo:
            kept, fold = _held_out(pool, res)
            memo[key] = interval_for(res.stratum, kept), fold
        iv, fold = memo[key]
        folds.setdefault(res.stratum, set()).add(fold)
        hits.setdefault(res.stratum, []).append(
            None if not iv.known else math.log(iv.low) - 1e-12 <= res.r <= math.log(iv.high) + 1e-12)
    out = []
    for s in sorted(hits, key=lambda s: s.key()):
        h = [x for x in hits[s] if x is not None]
        own = _own(pool, s, 4)
        out.append({"stratum": s, "rows": len(hits[s]), "configs": len({p.config for p in own}),
                    "sets": _sets(own), "fold": "/".join(sorted(folds[s])),
                    "own": _enough(own), "covered": sum(h) / len(h) if h else None})
    return out


def scenario_interval(scenario, pool=None) -> Interval:
    """The interval for a loaded scenario (:func:`scenario_stratum`, :func:`interval_for`)."""
    return interval_for(scenario_stratum(scenario), pool)


def result_interval(res) -> Interval:
    """The interval of a run (:class:`simulator.engine.Result`), computed once per result."""
    iv = getattr(res, "_step_interval", None)
    if iv is None:
        iv = scenario_interval(res.scenario)
        res._step_interval = iv
    return iv


def step_text(step_s: float, iv: Interval) -> str:
    """``step 8.74 s (likely 8.3-9.6 s; 41 comparable measured runs)``."""
    return f"step {step_s:.3g} s ({iv.short(step_s)})"


def mapping_interval(config: dict, pool=None) -> Interval:
    """The interval for a scenario mapping (a sweep point, a search's candidates): its kernel
    stack, cluster GPU and size, and model; built once per distinct (framework, cluster,
    model).  A mapping that does not load has no interval ("no comparable measurements")."""
    import json
    key = json.dumps([config.get("framework"), config.get("cluster"), config.get("model")], sort_keys=True,
                     default=str)
    if pool is not None:
        return _mapping_interval.__wrapped__(key, pool)
    return _mapping_interval(key, None)


@lru_cache(maxsize=256)
def _mapping_interval(key: str, pool) -> Interval:
    import json

    from topologies import ConfigError, build_cluster
    from workloads.model_loading import load_model
    from workloads.stacks import DEFAULT_STACK, get_stack
    framework, cluster, model = json.loads(key)
    try:
        c = build_cluster(cluster)
        m = load_model(model)
        stack = get_stack(framework or DEFAULT_STACK).name
        stack = _STACK_FAMILY.get(stack, stack)
    except (ConfigError, TypeError, ValueError, KeyError) as e:
        return Interval(None, None, 0, (), "a scenario that does not load", f"not loaded: {e}")
    if not _measured_part(c.gpu):
        return interval_for(None, pool)
    return interval_for(Stratum(stack, c.gpu.generation, model_family(m), _scope(c.num_gpus)), pool)
