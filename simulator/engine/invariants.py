"""Invariants every run keeps by construction, checked on a :class:`~simulator.engine.Result`.

The fuzz driver (``experiments/fuzz.py``) calls :func:`check_invariants` on every scenario
it runs, and the test suite on its own samples.  Each check is a property the engine
guarantees whatever the scenario, not a physical expectation: no "more GPUs is faster",
no "a slower link gives a longer step" (contention and pipeline effects break those
legitimately).  What is checked:

* **numbers**: every numeric metric is finite; the step time is positive; MFU, HFU and
  fractions are not negative;
* **steps**: the step bounds tile ``[0, end]`` back to back, and ``step_time_s`` is the
  last one's length;
* **breakdown**: on *every* rank cell (not only the one the metrics report), the compute
  stream's step window splits into compute, recompute and idle reasons that add up to the
  step time within 1e-9 of it, none negative;
* **causality**: every timeline row has ``0 <= start <= end <= the run's end``; a cell's
  compute ops do not overlap one another (one compute stream per GPU: F&B pairs take
  turns on it); a cell's compute ops of step ``k + 1`` start after its compute ops of step
  ``k`` end, and no compute op of step ``k`` ends after the step does; every blocking wait
  lies inside the run; no compute op runs while its cell's compute stream waits; a wait on
  an input (a collective, a p2p receive) ends exactly when one of the cell's communication
  ops ends, so the op that waited starts no earlier than its input arrived;
* **bytes conserved**: on every link of the simulated network (the quotient links when
  folded), the bytes its counters integrated from the flows' rates, plus what flows still
  running have left, equal the bytes the started flows asked of it (size x weight x link
  coefficient, summed over flows), to 1e-9 of the larger;
* **network**: per physical link, bytes and busy time are finite and not negative; a link
  that carried bytes was busy; no link moved more than its capacity times its busy time
  (the max-min allocation never oversubscribes a link); no link was busy longer than the
  run; a failed link (``whatif.failed_links``) carries nothing; per-tier utilisation of
  the reported step is within ``[0, 1]``.

The closed-form estimator is held to the engine by its own module
(:func:`simulator.explore.estimate.check_estimate`), which sits above the engine.

:func:`check_same_run` compares a folded run with the unfolded reference: folding is exact,
so every step bound and every link's bytes (so every tier's total: bytes are conserved
through the quotient network) must agree.

Each failure raises :class:`InvariantError` naming the invariant, where it broke and the
numbers.
"""

from __future__ import annotations

import math

import numpy as np

from topologies import ConfigError
from topologies.specs import TIERS
from workloads.ops import Stream

__all__ = ["InvariantError", "check_invariants", "check_same_run", "rounding_spread", "REL_TOL"]

#: Relative tolerance of sums of floating-point intervals (the breakdown, the step bounds).
REL_TOL = 1e-9
#: Capacity slack: rates come from a max-min solve in float64; a link's bytes over its busy
#: time may exceed its capacity only by rounding.
CAPACITY_SLACK = 1e-6


class InvariantError(AssertionError):
    """A run broke an invariant the engine guarantees (a simulator bug, not bad input)."""


def _fail(name: str, detail: str) -> None:
    raise InvariantError(f"invariant '{name}' broken: {detail}")


def check_invariants(res) -> None:
    """Check every invariant of the module docstring on ``res``; raises :class:`InvariantError`.
    They read every row of the timeline: a streamed one (``run(..., timeline="stream")``)
    is refused."""
    if getattr(res, "stream", None) is not None:
        raise ConfigError("timeline", "stream", "the invariants read every timeline row: run with timeline='full'")
    _check_metrics(res.metrics)
    _check_steps(res)
    _check_breakdowns(res)
    _check_causality(res)
    _check_network(res)
    _check_bytes_conserved(res)


def _numbers(x, path=""):
    """(path, value) of every number in a nested metrics mapping (bools and strings skipped)."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
        yield path, float(x)


def _check_metrics(m: dict) -> None:
    for path, v in _numbers(m):
        if not math.isfinite(v):
            _fail("finite metrics", f"metrics.{path} = {v}")
    if not m["step_time_s"] > 0:
        _fail("positive step", f"step_time_s = {m['step_time_s']}")
    for key in ("mfu", "mfu_bf16_peak", "hfu", "tflops_per_gpu", "tokens_per_s", "bubble_fraction"):
        if m[key] < 0:
            _fail("non-negative metrics", f"{key} = {m[key]}")
    for axis, v in m["exposed_comm_s"].items():
        if v < 0:
            _fail("non-negative metrics", f"exposed_comm_s.{axis} = {v}")


def _check_steps(res) -> None:
    bounds = res.step_bounds
    if len(bounds) != res.scenario.num_steps:
        _fail("steps", f"{len(bounds)} step bounds for num_steps = {res.scenario.num_steps}")
    prev = 0.0
    for k, (a, b) in enumerate(bounds):
        if a != prev or not b > a:
            _fail("steps", f"step {k} spans [{a!r}, {b!r}] after the previous step ended at {prev!r}")
        prev = b
    t0, t1 = bounds[-1]
    step = res.metrics["step_time_s"]
    if abs(step - (t1 - t0)) > REL_TOL * step:
        _fail("steps", f"step_time_s = {step!r} but the last step spans {t1 - t0!r}")


def _check_breakdowns(res) -> None:
    from .metrics import breakdown
    t0, t1 = res.step_bounds[-1]
    step = t1 - t0
    m = res.metrics
    total = sum(m["breakdown_s"].values())
    if abs(total - m["step_time_s"]) > REL_TOL * m["step_time_s"]:
        _fail("breakdown covers the step", f"metrics breakdown sums to {total!r}, step {m['step_time_s']!r}")
    for cid in range(res.folding.num_cells):
        bd = breakdown(res.timeline, res.waits[cid], t0, t1, cid)
        total = sum(bd.values())
        if abs(total - step) > REL_TOL * step:
            _fail("breakdown covers the step", f"cell {cid} (ranks {_ranks(res, cid)}): {bd} sums to {total!r}, "
                                               f"step {step!r}")
        neg = {k: v for k, v in bd.items() if v < -REL_TOL * step}
        if neg:
            _fail("breakdown covers the step", f"cell {cid}: negative terms {neg}")


def _ranks(res, cid) -> str:
    members = res.folding.cells[cid]
    return f"{members[0]}..{members[-1]}" if len(members) > 1 else str(members[0])


def _end_of_run(res) -> float:
    tl = res.timeline
    return max(float(tl["end_s"].max()) if len(tl) else 0.0, res.step_bounds[-1][1])


def _check_causality(res) -> None:
    tl = res.timeline
    start, end = tl["start_s"].to_numpy(dtype=float), tl["end_s"].to_numpy(dtype=float)
    t_end = _end_of_run(res)
    bad = ~(np.isfinite(start) & np.isfinite(end) & (start >= 0) & (end >= start))
    if bad.any():
        row = tl[bad].iloc[0]
        _fail("causality", f"op {row['name']} (cell {row['cell']}, step {row['step']}) runs "
                           f"[{row['start_s']!r}, {row['end_s']!r}]")
    eps = REL_TOL * max(t_end, 1e-30)
    comp = tl[tl["stream"] == Stream.COMPUTE]
    comm = tl[tl["stream"] != Stream.COMPUTE]
    comm_ends = {cid: np.sort(r["end_s"].to_numpy(dtype=float)) for cid, r in comm.groupby("cell", sort=True)}
    for cid, rows in comp.groupby("cell", sort=True):
        rows = rows.sort_values(["start_s", "end_s"], kind="stable")
        s, e = rows["start_s"].to_numpy(), rows["end_s"].to_numpy()
        steps = rows["step"].to_numpy()
        # one compute stream per GPU: an op starts once the one before it ended
        over = np.nonzero(s[1:] < np.maximum.accumulate(e)[:-1] - eps)[0]
        if over.size:
            i = int(over[0]) + 1
            prev = int(np.argmax(e[:i]))
            _fail("compute ops serialise", f"cell {cid}: {rows['name'].iloc[i]} (step {steps[i]}) starts at {s[i]!r} "
                                           f"while {rows['name'].iloc[prev]} (step {steps[prev]}) runs until "
                                           f"{e[prev]!r}")
        # steps follow one another on the compute stream, and a step ends after its compute
        for k in range(res.scenario.num_steps):
            mine = steps == k
            if not mine.any():
                _fail("causality", f"cell {cid} ran no compute op in step {k}")
            if e[mine].max() > res.step_bounds[k][1] + eps:
                _fail("causality", f"cell {cid}: a compute op of step {k} ends at {e[mine].max()!r}, after the "
                                   f"step ended at {res.step_bounds[k][1]!r}")
            later = steps > k
            if later.any() and s[later].min() < e[mine].max() - eps:
                _fail("causality", f"cell {cid}: a compute op of a later step starts at {s[later].min()!r} before "
                                   f"step {k}'s compute ended at {e[mine].max()!r}")
        _check_waits(cid, res.waits.get(cid, ()), rows, s, e, comm_ends.get(cid, np.empty(0)), eps)
    for cid, ws in res.waits.items():
        for a, b, axis in ws:
            if not (0 <= a <= b <= t_end + eps):
                _fail("causality", f"cell {cid} waits on {axis} over [{a!r}, {b!r}], outside the run [0, {t_end!r}]")


#: Waits that end when an input arrives on the waiting cell's own communication streams
#: (a collective or a p2p receive it takes part in).  A ``bubble`` wait ends at a peer's send
#: and a ``host_issue`` wait at the host's launch, neither of which is a row of this cell.
_INPUT_AXES = ("tp", "cp", "ep", "dp", "pp")


def _check_waits(cid, ws, rows, s, e, ends, eps) -> None:
    """Causality against inputs, for cell ``cid`` (its compute ``rows`` sorted by start, with
    starts ``s`` and ends ``e``; ``ends``: its communication ops' ends, sorted): while its
    compute stream waits (an input, the host's issue, a pipeline bubble), no compute op runs;
    and a wait on an input ends exactly when one of its communication ops ends (the op that
    waited then starts no earlier than its input arrived)."""
    if not ws:
        return
    a = np.array([w[0] for w in ws], dtype=float)
    b = np.array([w[1] for w in ws], dtype=float)
    axis = np.array([w[2] for w in ws], dtype=object)
    # compute ops serialise (checked before), so only the last one starting before a wait
    # ends can run inside it
    k = np.searchsorted(s, b - eps) - 1
    hit = (k >= 0) & (e[np.maximum(k, 0)] > a + eps) & (b - a > 2 * eps)
    if hit.any():
        j = int(np.nonzero(hit)[0][0])
        op = rows.iloc[k[j]]
        _fail("causality", f"cell {cid}: {op['name']} (step {op['step']}) runs [{op['start_s']!r}, "
                           f"{op['end_s']!r}] while the compute stream waits on {axis[j]} over "
                           f"[{a[j]!r}, {b[j]!r}]")
    inp = np.isin(axis, _INPUT_AXES)
    if inp.any():
        bi = b[inp]
        if ends.size:
            i = np.minimum(np.searchsorted(ends, bi - eps), ends.size - 1)
            ok = np.abs(ends[i] - bi) <= eps
        else:
            ok = np.zeros(bi.size, dtype=bool)
        if not ok.all():
            j = int(np.nonzero(~ok)[0][0])
            _fail("causality", f"cell {cid}: a wait on {axis[inp][j]} ends at {bi[j]!r}, when none of the "
                               f"cell's communication ops ends: the compute stream resumed without its input")


def _check_network(res) -> None:
    net = res.network
    if net is None:
        return
    cap = np.asarray(net.capacity, dtype=float)
    b = np.asarray(net.link_bytes, dtype=float)
    busy = np.asarray(net.link_busy_s, dtype=float)
    names = res.scenario.cluster.link_nodes
    t_end = _end_of_run(res)

    def where(i) -> str:
        u, v = names[int(i)]
        return f"link {u} -> {v}"

    for label, arr in (("bytes", b), ("busy time", busy)):
        bad = ~np.isfinite(arr) | (arr < 0)
        if bad.any():
            i = np.nonzero(bad)[0][0]
            _fail("link counters", f"{where(i)}: {label} {arr[i]!r}")
    idle_but_carried = (b > 0) & (busy <= 0)
    if idle_but_carried.any():
        i = np.nonzero(idle_but_carried)[0][0]
        _fail("link counters", f"{where(i)} carried {b[i]!r} bytes in no busy time")
    over = b > cap * busy * (1 + CAPACITY_SLACK) + 1e-6
    if over.any():
        i = np.nonzero(over)[0][0]
        _fail("link capacity", f"{where(i)} moved {b[i]:.6g} bytes in {busy[i]:.6g} s busy: "
                               f"{b[i] / busy[i]:.6g} B/s over its capacity {cap[i]:.6g} B/s")
    late = busy > t_end * (1 + REL_TOL) + 1e-12
    if late.any():
        i = np.nonzero(late)[0][0]
        _fail("link counters", f"{where(i)} busy {busy[i]!r} s in a run of {t_end!r} s")
    wi = res.scenario.whatif
    if wi.failed_links:
        from ..scenario.whatif import link_ids
        for nodes in wi.failed_links:
            for i in link_ids(res.scenario.cluster, nodes, "whatif.failed_links"):
                if b[i] > 0:
                    _fail("failed links carry nothing", f"{where(i)} failed but carried {b[i]:.6g} bytes")
    for tier, u in res.metrics["link_utilization"].items():
        if not -REL_TOL <= u <= 1 + CAPACITY_SLACK:
            _fail("link capacity", f"tier {tier}: utilisation {u!r} in the reported step")


def check_same_run(folded, unfolded, spread_s: float = 0.0) -> None:
    """A folded run against its unfolded reference: the same step bounds (to 1e-9, or to
    three times ``spread_s``, the run's own sensitivity to rounding: :func:`rounding_spread`)
    and the same bytes on every physical link (so on every tier: a flow's bytes do not
    depend on when it runs, so this part is exact whatever the spread)."""
    a, b = folded.step_bounds, unfolded.step_bounds
    for k, ((a0, a1), (b0, b1)) in enumerate(zip(a, b)):
        if abs(a1 - b1) > max(REL_TOL * max(abs(b1), 1e-30), 3.0 * spread_s):
            more = f" (more than 3x the run's rounding spread, {spread_s:.3g} s)" if spread_s else ""
            _fail("folded == unfolded", f"step {k} ends at {a1!r} folded, {b1!r} unfolded{more}")
    fa, fb = folded.network, unfolded.network
    if fa is None or fb is None:
        return
    x, y = np.asarray(fa.link_bytes, dtype=float), np.asarray(fb.link_bytes, dtype=float)
    diff = np.abs(x - y) > 1e-9 * np.maximum(np.abs(y), 1.0) + 1e-3
    if diff.any():
        i = int(np.nonzero(diff)[0][0])
        u, v = folded.scenario.cluster.link_nodes[i]
        _fail("folded == unfolded", f"link {u} -> {v} carried {x[i]!r} bytes folded, {y[i]!r} unfolded "
                                    f"({int(diff.sum())} links differ)")


def _check_bytes_conserved(res) -> None:
    net = res.network
    if net is None:
        return
    carried, left, asked = net.byte_balance()
    diff = np.abs(carried + left - asked)
    bad = diff > REL_TOL * np.maximum(asked, carried) + 1e-6
    if bad.any():
        q = int(np.nonzero(bad)[0][0])
        link_cell = res.folding.link_cell
        i = q if link_cell is None else int(np.nonzero(np.asarray(link_cell) == q)[0][0])
        u, v = res.scenario.cluster.link_nodes[i]
        tier = TIERS[int(res.scenario.cluster.link_tier[i])]
        _fail("bytes conserved", f"link {u} -> {v} (tier {tier}): carried {carried[q]:.9g} B + {left[q]:.9g} B "
                                 f"still in flight, but the flows started on it asked for {asked[q]:.9g} B "
                                 f"({int(bad.sum())} links differ)")


#: The relative change of one rank's compute that stands for rounding in :func:`rounding_spread`.
ROUNDING_NUDGE = 1e-15


def rounding_spread(scenario, ref=None, ranks=None) -> float:
    """How far the unfolded run's step ends move (seconds, the largest over steps and
    nudges) when one rank's compute is nudged by :data:`ROUNDING_NUDGE` (about one ulp), for
    the first, a middle and the last rank (or ``ranks``); ``ref``: the unfolded run, if at hand.

    Folding is exact in exact arithmetic, but a folded run sums link loads in another order
    than the unfolded one, so their event times differ in the last bits.  Most runs forget
    that; a run where near-simultaneous collectives meet on one stream (a permuted placement
    with jitter or thermal throttling, say) takes one order or the other, and its step moves
    by far more than the rounding (0.4 % from a 1e-15 nudge in one fuzz draw).  That spread
    is the run's own, not folding's: :func:`check_same_run` is held to it."""
    from .simulate import run
    ref = run(scenario, fold=False) if ref is None else ref
    if ranks is None:
        world = ref.program.grid.world_size
        ranks = sorted({0, world // 2, world - 1})
    ends = np.array([e for _, e in ref.step_bounds])
    spread = 0.0
    for r in ranks:
        nudged = run(scenario, fold=False, compute_scale={int(r): 1.0 + ROUNDING_NUDGE})
        spread = max(spread, float(np.max(np.abs(np.array([e for _, e in nudged.step_bounds]) - ends))))
    return spread
