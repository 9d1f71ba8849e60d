"""Evaluating rows: the measured step time and FLOP conventions of a row, its simulation, and
:func:`validate`, the predicted against measured step time of every row of a runs table.

``validate(RUNS.csv)`` reads a table of measured runs (:mod:`.ingest`), turns every row into
a scenario (:mod:`.mapping`), simulates it and reports, per row, the measured and predicted
step time, the signed error, TFLOP/s per GPU and MFU where the source gives them, where the
predicted step went (:data:`BREAKDOWN_COLUMNS`), a status and how each number was obtained.
No row is dropped: a row that cannot be simulated gets
``unsupported: <reason>`` (a feature clustersim lacks, or ``over --max-gpus``),
``invalid: <reason>`` (the row contradicts itself or a clustersim rule) or
``error: <message>`` (the simulator raised).  :func:`.report.summary` gives coverage and
error statistics per source and counts the reasons, so a report can name the missing
features that cost the most rows.

Measured step time (the ``derivation`` column)
----------------------------------------------
In order of preference: ``step_time_s``; ``global_batch_size * seq_len /
tokens_per_s_total``; ``global_batch_size * seq_len / (tokens_per_s_per_gpu * num_gpus)``;
model FLOPs per step in the source's convention / (``tflops_per_gpu`` x 1e12 x num_gpus);
the same FLOPs / (``mfu_pct`` / 100 x num_gpus x dense peak of the precision); vTrain:
``iteration time (ms) / 1000``.  The step-time and token-rate columns present besides the
one used are cross-checked; a disagreement over 2 % is noted.

FLOP convention (``flop_convention`` column) of a published-format row: a
:data:`~workloads.FLOP_CONVENTIONS` name in ``tflops_definition``; else ``nemo_24`` when the
definition describes NeMo's count (``12*l*h^2*(1+g/a+s/h)``, no causal halving); else
``palm_6n`` / ``narayanan_eq3`` by keyword; else the framework's (NeMo ``nemo_24``,
otherwise ``megatron_core_2025``).  A definition that counts the recomputed forward pass
("4 passes", "includes recompute", hardware FLOPs) adds a third of the count but the logits
(suffix ``+recompute_forward``): without it the derived step is 25 % short.  The published H100 runs' MFU is NeMo's formula, so their
predicted MFU is ``model_flops_per_step(model, gbs, seq, 'nemo_24', vocab_size=<row's>)``
over (predicted step x GPUs x dense peak of the recipe's GEMM dtype: 989 / 1,979 TFLOP/s on
H100 BF16 / FP8, the publisher's peaks); the notes also give that formula's MFU at the
measured step, a check on the convention against the published value.  Predicted TFLOP/s
and MFU are reported only where the source gives the measured ones.

``error_pct`` = (predicted - measured) / measured x 100: positive means clustersim predicts
a slower step than was measured.
"""

from __future__ import annotations

import csv
import re
import time
from pathlib import Path

from topologies import ConfigError
from topologies.constants import Constants, active, using

from .ingest import InvalidRow, Unsupported, _cell, _int, _num, load_runs
from .mapping import FRAMEWORKS, _framework, row_to_scenario

__all__ = ["BREAKDOWN_COLUMNS", "INTERVAL_COLUMNS", "NOTE_SEP", "OUTPUT_COLUMNS", "add_interval", "measured_step",
           "scenario_cost", "scenario_key", "source_convention", "validate", "validate_tables", "write_csv"]

BREAKDOWN_COLUMNS = ("compute_s", "recompute_s", "bubble_s", "host_issue_s", "exposed_tp_s", "exposed_cp_s",
                     "exposed_ep_s", "exposed_pp_s", "exposed_dp_s")
"""The predicted step split into where the slowest rank's compute stream spent it (the
simulator's ``breakdown_s``; they sum to ``predicted_step_s``): what
``experiments/validation_residuals.py`` attributes the errors to."""

INTERVAL_COLUMNS = ("likely_low_s", "likely_high_s", "comparable_runs", "interval_basis")
"""The row's 80 % interval of the measured step around its prediction, from the committed
prediction tables without the row's own configuration (:func:`.intervals.row_interval`): low and
high seconds (empty when no comparable run was measured), the measured runs it rests on, and
how it was built."""

#: Columns of the output table (``validate(..., out_csv=...)``).
OUTPUT_COLUMNS = ("id", "source", "framework", "format", "model", "gpu", "num_gpus", "precision", "parallel", "measured_step_s",
                  "predicted_step_s", "error_pct", *INTERVAL_COLUMNS, "measured_tflops_per_gpu", "predicted_tflops_per_gpu",
                  "measured_mfu_pct", "predicted_mfu_pct", *BREAKDOWN_COLUMNS, "measured_share_pct", "flop_convention", "status",
                  "derivation", "notes", "wall_s")

#: Separator of the notes of one output row.
NOTE_SEP = " | "



# -- measurements ----------------------------------------------------------------------------------
#: Suffix of a convention whose count includes the recomputed forward pass (:func:`source_convention`).
RECOMPUTE_SUFFIX = "+recompute_forward"

#: A ``tflops_definition`` that counts the recomputed forward pass: "4 passes", "includes
#: recompute", hardware FLOPs.
_RECOMPUTE_COUNT = re.compile(r"\b(4|four)\s*(forward\s*/?\s*backward\s*)?passes|incl\w*\.?\s+(the\s+)?"
                              r"(activation\s+)?recomput|with\s+(activation\s+)?recomput|hardware\s+flops|\bhfu\b",
                              re.IGNORECASE)


def source_convention(row: dict) -> tuple[str, str]:
    """``(FLOP convention, why)`` for a published-format row (see the module docstring).  A
    definition that counts the recomputed forward pass gets :data:`RECOMPUTE_SUFFIX` on its
    base convention (unless the base, ``narayanan_eq3``, already counts it)."""
    conv, why = _base_convention(row)
    text = _cell(row, "tflops_definition")
    if conv != "narayanan_eq3" and _RECOMPUTE_COUNT.search(text):
        return conv + RECOMPUTE_SUFFIX, why + "; the count includes the recomputed forward pass (4 passes, not 3)"
    return conv, why


def _base_convention(row: dict) -> tuple[str, str]:
    from workloads import FLOP_CONVENTIONS
    text = _cell(row, "tflops_definition")
    low = text.lower()
    for name in FLOP_CONVENTIONS:
        if name in low:
            return name, "named in tflops_definition"
    if re.search(r"no causal|non-causal|not causal|without causal|12\s*\*\s*l\s*\*\s*h", low):
        return "nemo_24", "tflops_definition describes NeMo's count (full s^2 attention)"
    if "palm" in low or re.search(r"\b6\s*\*?\s*n\b", low):
        return "palm_6n", "tflops_definition names 6N"
    if "narayanan" in low or "eq. 3" in low or "eq3" in low:
        return "narayanan_eq3", "tflops_definition names Narayanan et al. eq. 3"
    fw, _ = _framework(_cell(row, "framework"))
    conv = FRAMEWORKS[fw]["convention"]
    return conv, f"the framework's ({FRAMEWORKS[fw]['label']})"


def _flops(scenario: dict, row: dict, conv: str) -> float:
    """Model FLOPs of one step in convention ``conv``.  With :data:`RECOMPUTE_SUFFIX`, the
    recomputed forward pass is added: a third of everything but the logits (``6 s h V`` per
    sequence, never recomputed) -- on GPT, exactly Narayanan et al.'s 72 -> 96 (eq. 3)."""
    from workloads import load_model, model_flops_per_step
    model = load_model(scenario["model"])
    par = scenario["parallel"]
    vocab = _int(row, "vocab_size")
    base_conv, recompute = (conv[:-len(RECOMPUTE_SUFFIX)], True) if conv.endswith(RECOMPUTE_SUFFIX) else (conv, False)
    flops = model_flops_per_step(model, par["global_batch_size"], par["seq_len"], base_conv, vocab_size=vocab)
    if recompute:
        logits = 6 * par["global_batch_size"] * par["seq_len"] * model.hidden_size * (vocab or model.vocab_size)
        flops += (flops - logits) / 3
    return flops


def _peak(scenario: dict) -> float:
    from topologies.cluster import spec_from_mapping
    from workloads import get_recipe
    gpu = spec_from_mapping(scenario["cluster"]).gpu
    recipe = get_recipe(scenario.get("precision", "bf16"))
    return gpu.peak_flops.get(recipe.peak_dtype, gpu.peak_flops["bf16"])


def measured_step(row: dict, fmt: str | None = None, scenario: dict | None = None) -> tuple[float, str, list[str]]:
    """``(measured step time in s, derivation, notes)`` of one row; :class:`InvalidRow` if none.

    The FLOP-based derivations need the row's ``scenario`` (from :func:`row_to_scenario`).
    """
    fmt = fmt or row.get("_format")
    if fmt == "vtrain":
        ms = _num(row, "iteration time (ms)")
        if ms is None or ms <= 0:
            raise InvalidRow("iteration time (ms) is empty or not positive")
        return ms / 1000.0, "iteration time (ms) / 1000", []
    n = _int(row, "num_gpus")
    gbs = _int(row, "global_batch_size")
    seq = _int(row, "seq_len")
    if seq is None and scenario is not None:
        seq = scenario["parallel"]["seq_len"]
    cands: list[tuple[float, str]] = []
    v = _num(row, "step_time_s")
    if v is not None and v > 0:
        cands.append((v, "step_time_s"))
    v = _num(row, "tokens_per_s_total")
    if v and gbs and seq:
        cands.append((gbs * seq / v, "global_batch_size*seq_len/tokens_per_s_total"))
    v = _num(row, "tokens_per_s_per_gpu")
    if v and gbs and seq and n:
        cands.append((gbs * seq / (v * n), "global_batch_size*seq_len/(tokens_per_s_per_gpu*num_gpus)"))
    if scenario is not None and n:
        conv, _why = source_convention(row)
        tf = _num(row, "tflops_per_gpu")
        mfu = _num(row, "mfu_pct")
        if tf or mfu:
            flops = _flops(scenario, row, conv)
            if tf:
                cands.append((flops / (tf * 1e12 * n), f"{conv} model FLOPs/(tflops_per_gpu*num_gpus)"))
            if mfu:
                peak = _peak(scenario)
                cands.append((flops / (mfu / 100 * n * peak),
                              f"{conv} model FLOPs/(mfu_pct/100*num_gpus*{peak / 1e12:g} TFLOP/s peak)"))
    if not cands:
        raise InvalidRow("no measured step time (step_time_s, tokens_per_s_total, tokens_per_s_per_gpu, "
                         "tflops_per_gpu or mfu_pct)")
    best, how = cands[0]
    notes = []
    for other, other_how in cands[1:]:
        if abs(other / best - 1) > 0.02 and "FLOPs" not in other_how:
            notes.append(f"check: {other_how} gives {other:.4g} s ({(other / best - 1) * 100:+.1f}%)")
    return best, how, notes


# -- validation ------------------------------------------------------------------------------------
def _describe_parallel(par: dict) -> str:
    """The ``parallel`` column: degrees and batch sizes, e.g. ``tp4 pp4 dp2 cp2 vpp5 mbs1 gbs128``."""
    s = f"tp{par['tp']} pp{par['pp']} dp{par['dp']} cp{par['cp']}"
    if par.get("ep", 1) > 1:
        s += f" ep{par['ep']}"
    if par.get("vpp", 1) > 1:
        s += f" vpp{par['vpp']}"
    return s + f" mbs{par['micro_batch_size']} gbs{par['global_batch_size']}"


def _row_id(row: dict) -> str:
    if row.get("_format") == "published" and _cell(row, "row_id"):
        return _cell(row, "row_id")
    return f"{Path(row.get('_file', 'runs')).stem}:{row.get('_line', '?')}"


def _source(row: dict) -> str:
    if row.get("_format") == "vtrain":
        # vTrain's two files are separate sources: 64-512 GPUs, and one host
        return "vtrain_single" if Path(row.get("_file", "")).stem == "ground_truth_single" else "vtrain"
    return _cell(row, "source_id") or Path(row.get("_file", "runs")).stem


def _classify_config_error(e: ConfigError) -> str:
    """``unsupported: ...`` for a feature the simulator lacks, else ``invalid: ...``."""
    text = str(e)
    if re.search(r"not modelled|not supported|not implemented|not yet", text):
        return f"unsupported: {text}"
    return f"invalid: {text}"

class _Runs:
    """The distinct scenarios of one or more tables, each simulated once.

    Rows map to the same scenario when a recipe is republished (the Blackwell set's 114
    simulated rows are 62 scenarios); rows whose :func:`scenario_key` is equal share one run, across tables
    too.  The simulator is deterministic, so a shared run is the run each row would have made.
    With more than one worker every run is handed to one pool of ``workers`` processes that
    import the simulator once and live for the whole batch, costliest first
    (:func:`scenario_cost`), so the long runs start first and the workers finish together;
    with one, runs are made in this process as the rows ask for them.  Neither the pool nor
    the order changes a result."""

    def __init__(self, run_fn, workers: int, on_done=None):
        self.run_fn, self.workers, self.on_done = run_fn, workers, on_done
        self.first: dict[str, tuple] = {}           # key -> (table, row) that asked first
        self.count: dict[str, int] = {}
        self.scenarios: dict[str, dict] = {}
        self._sims: dict[str, dict] = {}
        self._futures: dict = {}
        self._pool = None
        self._finished, self._total = 0, 0
        self._lock = None

    def add(self, scenario: dict | None, where: tuple) -> str | None:
        """Register the row at ``where`` (None: a row that is not simulated); its key."""
        self._total += 1
        if scenario is None:
            self.tick(1)
            return None
        key = scenario_key(scenario)
        if key not in self.first:
            self.first[key], self.count[key], self.scenarios[key] = where, 0, scenario
        self.count[key] += 1
        return key

    def tick(self, n: int) -> None:
        if self.on_done is not None:
            self._finished += n
            self.on_done(self._finished, self._total)

    def order(self) -> list[str]:
        """The keys costliest first (ties: in the order the rows asked for them)."""
        return sorted(self.first, key=lambda k: -scenario_cost(self.scenarios[k]))

    def start(self) -> None:
        """Hand every run to the pool (more than one worker and more than one run)."""
        if self.workers == 1 or len(self.first) < 2:
            return
        from concurrent.futures import ProcessPoolExecutor
        import multiprocessing
        import threading
        self._lock = threading.Lock()
        ctx = multiprocessing.get_context("spawn")      # no forked copy of a caller's simpy or numpy state
        self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx)
        for k in self.order():
            # the active constants (topologies.constants) travel with every job: a perturbation
            # (simulator.validation.constants.scaled) holds in the workers too
            f = self._pool.submit(_simulate, self.scenarios[k], self.run_fn, active())
            if self.on_done is not None:
                f.add_done_callback(lambda _f, n=self.count[k]: self._tick_locked(n))
            self._futures[k] = f

    def _tick_locked(self, n: int) -> None:
        with self._lock:
            self.tick(n)

    def result(self, key: str) -> dict:
        """The run of ``key`` (waiting for it, or making it here)."""
        if key in self._futures:
            return self._futures[key].result()
        if key not in self._sims:
            self._sims[key] = _simulate(self.scenarios[key], self.run_fn)
            self.tick(self.count[key])
        return self._sims[key]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def scenario_key(scenario) -> str:
    """Rows with the same key simulate the same thing: every field of the scenario mapping,
    nested, with its type (``1``, ``1.0``, ``True`` and ``"1"`` differ, as keys and as values;
    floats by their exact ``repr``); the order of a mapping's keys does not count.  A value of
    any other type never matches another (its identity is part of the key)."""
    return repr(_canonical(scenario))


def _canonical(v):
    if isinstance(v, dict):
        items = [(_canonical(k), _canonical(x)) for k, x in v.items()]
        return ("dict", tuple(sorted(items, key=lambda kv: repr(kv[0]))))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_canonical(x) for x in v))
    if v is None or type(v) in (bool, int, float, str):
        return (type(v).__name__, repr(v))
    return ("object", type(v).__qualname__, id(v))


def scenario_cost(scenario: dict) -> float:
    """A rough relative cost of simulating ``scenario``, only to hand the long runs out first:
    the (layer x micro-batch) passes one pipeline makes over all steps (micro-batches per
    pipeline from the cluster's GPU count: an expert-parallel recipe's ``dp`` may be 1), twice
    for an MoE model (its dispatch and expert ops), plus a little per GPU (graph, folding,
    collective plans).  0 for a scenario that cannot be costed (it goes last)."""
    try:
        from topologies.cluster import spec_from_mapping
        from workloads import load_model
        par, m = scenario["parallel"], load_model(scenario["model"])
        gpus = spec_from_mapping(scenario["cluster"]).num_gpus
        model_parallel = par.get("tp", 1) * par.get("pp", 1) * par.get("cp", 1)
        dp = max(par.get("dp", 1), gpus // max(1, model_parallel))
        micro = max(1, par["global_batch_size"] // (par.get("micro_batch_size", 1) * dp))
        steps = int(scenario.get("num_steps", 1) or 1)
        moe = 2 if getattr(m, "moe", None) else 1
        return float(m.num_layers * micro * steps * moe + 4 * gpus)
    except Exception:  # noqa: BLE001 -- an estimate only
        return 0.0


def _prepare(row: dict, max_gpus) -> dict:
    """Everything about one input row short of simulating it: its output row, notes,
    scenario, measured step and FLOP convention, and the status of the first check that
    fails (None: it is to be simulated)."""
    fmt = row.get("_format")
    out = _output_row(row, fmt)
    notes: list[str] = []
    scenario, status = _map_row(row, fmt, out, notes)
    measured, status = _measure_row(row, fmt, scenario, status, out, notes)
    conv = _row_convention(row, fmt, scenario, out, notes)
    if status is None:
        status = _scenario_check(scenario)
    try:
        n = int(float(out["num_gpus"]))
    except ValueError:
        n = 0
    if status is None and max_gpus is not None and n > max_gpus:
        status = "unsupported: over --max-gpus"
    return {"out": out, "notes": notes, "scenario": scenario, "status": status, "measured": measured,
            "conv": conv, "n": n}


def _evaluate(row: dict, run_fn, max_gpus) -> dict:
    """The output row (:data:`OUTPUT_COLUMNS`) of one input row: map it, derive its measured
    step, check the scenario and simulate it; the first step that fails sets the status."""
    p = _prepare(row, max_gpus)
    return _finish(row, p, _simulate(p["scenario"], run_fn) if p["status"] is None else None)


def _simulate(scenario: dict, run_fn, constants: Constants | None = None) -> dict:
    """One simulation: ``{"status", "metrics", "wall_s"}``, the metrics the rows need
    (picklable: it comes back from a worker process), under ``constants`` (None: the
    active ones; :mod:`topologies.constants`)."""
    t0 = time.perf_counter()
    metrics = None
    try:
        with using(constants):
            res = run_fn(scenario)
        m = getattr(res, "metrics", res)
        pred = float(m["step_time_s"])
        if not pred > 0:
            raise ValueError(f"predicted step time {pred!r} is not positive")
        metrics = {"step_time_s": pred, "breakdown_s": dict(m.get("breakdown_s") or {}) if hasattr(m, "get") else {},
                   "peak_memory_bytes": m.get("peak_memory_bytes") if hasattr(m, "get") else None,
                   "measured_step_share": float(m.get("measured_step_share", 0.0)) if hasattr(m, "get") else 0.0}
        status = "ok"
    except ConfigError as e:
        status = _classify_config_error(e)
    except Exception as e:  # noqa: BLE001 -- the simulator's failure is reported on the row, not raised
        status = f"error: {type(e).__name__}: {e}"
    return {"status": status, "metrics": metrics, "wall_s": round(time.perf_counter() - t0, 3)}


def _finish(row: dict, prep: dict, sim: dict | None, same_as: str | None = None) -> dict:
    """The output row from its preparation and (if it was simulated) the simulation;
    ``same_as``: the id of the row whose identical scenario made the run."""
    out, notes, status = prep["out"], prep["notes"], prep["status"]
    if sim is not None:
        status = sim["status"]
        out["wall_s"] = 0.0 if same_as else sim["wall_s"]
        if same_as:
            notes.append(f"the same scenario as row {same_as}: simulated once")
        if status == "ok":
            _record_prediction(out, prep["scenario"], row, prep["conv"], prep["measured"], prep["n"], notes,
                               sim["metrics"])
    out["status"] = status
    out["notes"] = NOTE_SEP.join(notes)
    return out


def _output_row(row: dict, fmt: str | None) -> dict:
    """An output row with the input row's identity filled in (id, source, format, model,
    GPU, GPU count, precision as the source wrote them) and every other column empty."""
    out = {c: "" for c in OUTPUT_COLUMNS}
    out.update(id=_row_id(row), source=_source(row), format=fmt)
    if fmt == "vtrain":
        size = _cell(row, "Parameters (billion)")
        out.update(framework="Megatron-DeepSpeed", model=f"GPT {size}B" if size else "GPT", gpu="A100",
                   num_gpus=_cell(row, "# GPUs"),
                   precision="mixed")
    else:
        out.update(framework=_cell(row, "framework"), model=_cell(row, "model"),
                   gpu=_cell(row, "gpu_type") or _cell(row, "system"),
                   num_gpus=_cell(row, "num_gpus"), precision=_cell(row, "precision"))
    return out


def _map_row(row: dict, fmt: str | None, out: dict, notes: list[str]) -> tuple[dict | None, str | None]:
    """``(scenario or None, status or None)``: the row's scenario (its layout in ``out``, its
    notes appended), or the status of why it has none."""
    try:
        scenario, mnotes = row_to_scenario(row, fmt)
    except Unsupported as e:
        return None, f"unsupported: {e.reason}"
    except InvalidRow as e:
        return None, f"invalid: {e.reason}"
    except ConfigError as e:
        return None, _classify_config_error(e)
    notes += mnotes
    out["parallel"] = _describe_parallel(scenario["parallel"])
    return scenario, None


def _measure_row(row: dict, fmt: str | None, scenario: dict | None, status: str | None, out: dict,
                 notes: list[str]) -> tuple[float | None, str | None]:
    """``(measured step or None, status)``: the measured step and its derivation into ``out``;
    a row without one is invalid unless it already has a status (then noted)."""
    try:
        measured, how, cnotes = measured_step(row, fmt, scenario)
    except InvalidRow as e:
        if status is None:
            return None, f"invalid: {e.reason}"
        notes.append(e.reason)
        return None, status
    except ConfigError as e:
        return None, status if status is not None else _classify_config_error(e)
    out.update(measured_step_s=measured, derivation=how)
    notes += cnotes
    return measured, status


def _row_convention(row: dict, fmt: str | None, scenario: dict | None, out: dict, notes: list[str]) -> str | None:
    """The FLOP convention of a mapped published-format row (None otherwise), with the
    measured TFLOP/s and MFU the source gives, into ``out``."""
    if scenario is None or fmt != "published":
        return None
    conv = None
    try:
        conv, why = source_convention(row)
        out["flop_convention"] = conv
        notes.append(f"FLOP convention {conv}: {why}")
        out["measured_tflops_per_gpu"] = _num(row, "tflops_per_gpu") or ""
        out["measured_mfu_pct"] = _num(row, "mfu_pct") or ""
    except InvalidRow as e:
        notes.append(e.reason)
    return conv


def _scenario_check(scenario: dict) -> str | None:
    """The status of a scenario the contract rejects (:func:`simulator.scenario.load_scenario`), else None."""
    from ..scenario import load_scenario
    try:
        load_scenario(scenario)
    except ConfigError as e:
        return _classify_config_error(e)
    return None


def _record_prediction(out: dict, scenario: dict, row: dict, conv: str | None, measured: float, n: int,
                       notes: list[str], metrics: dict) -> None:
    """A successful run's prediction, its error, rates and breakdown into ``out`` (a
    memory model's OOM verdict noted)."""
    pred = metrics["step_time_s"]
    out["predicted_step_s"] = pred
    out["error_pct"] = (pred - measured) / measured * 100
    _predicted_rates(out, scenario, row, conv, pred, measured, n, notes)
    _predicted_breakdown(out, metrics)
    # the share of the predicted step costed from measured kernel tables (metrics.py)
    out["measured_share_pct"] = 100.0 * float(metrics.get("measured_step_share", 0.0) or 0.0)
    peak_mem = metrics.get("peak_memory_bytes")
    hbm = _hbm(scenario)
    if peak_mem and hbm and peak_mem > hbm:
        notes.append(f"memory model predicts OOM: {peak_mem / 2**30:.1f} GiB > {hbm / 2**30:.0f} GiB")


def _hbm(scenario: dict) -> float | None:
    """HBM bytes of the scenario's GPU; None when its cluster does not resolve."""
    try:
        from topologies.cluster import spec_from_mapping
        return spec_from_mapping(scenario["cluster"]).gpu.hbm_bytes
    except ConfigError:
        return None


def _predicted_rates(out, scenario, row, conv, pred, measured, n, notes) -> None:
    """Predicted TFLOP/s per GPU and MFU into ``out``, each only where the source gives the measured one."""
    if conv is None or not n:
        return
    flops = _flops(scenario, row, conv)
    if out["measured_tflops_per_gpu"] != "":
        out["predicted_tflops_per_gpu"] = flops / pred / n / 1e12
    if out["measured_mfu_pct"] != "":
        peak = _peak(scenario)
        out["predicted_mfu_pct"] = flops / (pred * n * peak) * 100
        at_measured = flops / (measured * n * peak) * 100
        notes.append(f"check: {conv} MFU at the measured step {at_measured:.2f}% (published {out['measured_mfu_pct']}%)")


def _predicted_breakdown(out: dict, metrics) -> None:
    """The simulator's ``breakdown_s`` into the :data:`BREAKDOWN_COLUMNS` of ``out``."""
    bd = metrics.get("breakdown_s") if hasattr(metrics, "get") else None
    if not bd:
        return
    for col in BREAKDOWN_COLUMNS:               # a test checks that they sum to the step
        out[col] = float(bd.get(col[:-2], 0.0))


def write_csv(results: list[dict], path) -> None:
    """Write :func:`validate` rows to ``path`` (columns :data:`OUTPUT_COLUMNS`)."""
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(OUTPUT_COLUMNS), extrasaction="ignore")
        w.writeheader()
        for r in results:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def _run_streamed(scenario):
    """:func:`simulator.engine.run` with its timeline streamed: validation reads only the
    step time, breakdown, peak memory and measured share, which a streamed run gives bit for
    bit (``docs/performance.md``), without building the full timeline."""
    from ..engine import run
    return run(scenario, timeline="stream")


def validate(path, out_csv=None, *, run_fn=None, max_gpus: int | None = None, progress=None,
             select=None, limit: int | None = None, workers: int = 1, on_done=None) -> list[dict]:
    """Simulate every row of a runs table and compare with its measurement.

    Parameters
    ----------
    path
        A CSV in the published-runs or vTrain format (:func:`load_runs`).
    out_csv
        Where to write the result rows (columns :data:`OUTPUT_COLUMNS`); None: not written.
    run_fn
        ``run_fn(scenario_mapping)`` returning an object with ``.metrics["step_time_s"]`` (or
        the metrics mapping itself); default :func:`simulator.engine.run` with the timeline
        streamed.
    max_gpus
        Rows on more GPUs are reported as ``unsupported: over --max-gpus`` (still mapped
        and checked, not simulated).
    progress
        ``progress(index, total, result_row)`` after each row, in input order.
    on_done
        ``on_done(finished, total)`` as each row finishes (with workers, in the order they
        finish, from a helper thread): for a progress bar.
    select
        ``select(row) -> bool`` on the loaded rows (:func:`load_runs`): only selected rows
        are evaluated and reported (a documented subset, e.g. for a CI test); None: all.
    limit
        Evaluate only the first ``limit`` (selected) rows; None: all.
    workers
        Rows simulated at once, each in its own process (rows are independent: the results
        are the same, in the same order, for any number); 1: in this process.  With more
        than one, ``run_fn`` must be picklable (a module-level function).

    Returns
    -------
    list of dict
        One per input row, in order (:data:`OUTPUT_COLUMNS`); ``status`` is ``ok``,
        ``unsupported: ...``, ``invalid: ...`` or ``error: ...``.
    """
    table = {"path": path, "out_csv": out_csv, "max_gpus": max_gpus, "progress": progress, "select": select,
             "limit": limit}
    return validate_tables([table], run_fn=run_fn, workers=workers, on_done=on_done)[0]


def validate_tables(tables: list[dict], *, run_fn=None, workers: int = 1, on_done=None) -> list[list[dict]]:
    """:func:`validate` of several tables at once, one result list per table: every row of
    every table is mapped first, then each distinct scenario is simulated once (:class:`_Runs`:
    one pool of ``workers`` processes for all tables, costliest runs first).  A table is a
    mapping with ``path`` and optionally ``out_csv``, ``max_gpus``, ``progress``, ``select``,
    ``limit`` and ``name`` (how another table's notes name its rows; default the file's stem),
    each as in :func:`validate`; ``on_done(finished, total)`` counts the rows of all tables.
    The results are those of :func:`validate` on each table alone, whatever the tables, their
    order or the number of workers."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError("workers", workers, "must be a positive integer")
    for t in tables:
        mg = t.get("max_gpus")
        if mg is not None and (isinstance(mg, bool) or not isinstance(mg, int) or mg < 1):
            raise ConfigError("--max-gpus", mg, "must be a positive integer")
    if run_fn is None:
        run_fn = _run_streamed
    rows = [_table_rows(t) for t in tables]
    preps = [[_prepare(r, t.get("max_gpus")) for r in rs] for t, rs in zip(tables, rows)]
    runs = _Runs(run_fn, workers, on_done)
    keys = [[runs.add(p["scenario"] if p["status"] is None else None, (ti, i)) for i, p in enumerate(ps)]
            for ti, ps in enumerate(preps)]
    runs.start()
    try:
        return [_table_results(tables, ti, rows[ti], preps, keys[ti], runs) for ti in range(len(tables))]
    finally:
        runs.close()


def _table_rows(table: dict) -> list[dict]:
    """The rows of ``table`` to evaluate: loaded, selected, limited."""
    rows = load_runs(table["path"])
    if table.get("select") is not None:
        rows = [r for r in rows if table["select"](r)]
    if table.get("limit") is not None:
        rows = rows[:max(0, int(table["limit"]))]
    return rows


def _table_results(tables, ti: int, rows: list[dict], preps, keys: list, runs: _Runs) -> list[dict]:
    """The output rows of table ``ti`` in input order (intervals filled, ``progress`` called,
    the CSV written)."""
    table, results = tables[ti], []
    progress = table.get("progress")
    for i, (row, key) in enumerate(zip(rows, keys)):
        same_as = None
        if key is not None and runs.first[key] != (ti, i):
            fti, fi = runs.first[key]
            same_as = preps[fti][fi]["out"]["id"]
            if fti != ti:
                same_as = f"{tables[fti].get('name') or Path(tables[fti]['path']).stem} {same_as}"
        out = _finish(row, preps[ti][i], runs.result(key) if key is not None else None, same_as)
        add_interval(out)
        results.append(out)
        if progress is not None:
            progress(i, len(rows), out)
    if table.get("out_csv") is not None:
        write_csv(results, table["out_csv"])
    return results


def add_interval(out: dict, pool=None) -> None:
    """Fill the :data:`INTERVAL_COLUMNS` of a simulated output row (left empty otherwise)."""
    from .intervals import row_interval
    if out.get("status") != "ok" or not isinstance(out.get("predicted_step_s"), float):
        return
    iv = row_interval(out, pool)
    if iv is None:
        return
    b = iv.bounds(out["predicted_step_s"])
    out.update(likely_low_s=b[0] if b else "", likely_high_s=b[1] if b else "", comparable_runs=iv.rows,
               interval_basis=f"{iv.stratum}: {iv.basis}; {iv.fold}")
