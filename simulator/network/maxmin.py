"""Max-min fair rates of fluid flows over capacitated links.

The model
---------
``F`` flows share ``L`` links.  Flow ``f`` crosses links ``links[ptr[f]:ptr[f+1]]``
and puts ``coefs[k]`` bytes on the k-th of them for every byte it moves (1 on an
ordinary route; 2 when a coupled ring channel crosses a link twice; 1/k when a flow is
sprayed over k equal-cost paths).  A flow stands for ``weight[f]`` identical flows on
the same route (folded ranks); each of them gets the returned rate.  ``cap[f]`` is an
optional per-flow rate limit (e.g. a protocol's per-channel maximum).

The allocation is the max-min fair one (progressive filling, "water-filling"): all
flows' rates rise together; when a link fills, the flows crossing it freeze at their
current rate; a flow also freezes when it reaches its cap; the rest keep rising.  The
result is feasible (no link above capacity) and every flow is either at its cap or
crosses a saturated link on which no flow has a larger rate.  This is the classic
bandwidth-sharing model of flow-level network simulators (SimGrid's LMM solver without
its TCP-specific weights; Bertsekas & Gallager, *Data Networks*, Sec. 6.5.2).

The solver: local-minimum rounds
--------------------------------
Instead of raising one water level per iteration, every round freezes all links whose
fair share ``rem/cnt`` is not larger than the bottleneck share of any flow crossing
them.  Such a link saturates at exactly its current share, because during progressive
filling a link's share never decreases (a flow frozen at ``x <= rem/cnt`` leaves
``(rem - x)/(cnt - 1) >= rem/cnt``).  A round is a handful of vectorised numpy passes
over the non-zeros of the still-active flows; cluster-like instances need few rounds.
(Route coefficients, rate caps and a compact link space are this implementation's
additions to plain progressive filling.)
"""

from __future__ import annotations

import numpy as np

from . import maxmin_jit, maxmin_small

__all__ = ["max_min_rates"]

_REL = 1e-9      # relative tolerance when comparing fair shares
_EPS = 1e-12     # a link whose remaining usage count is below this carries no live flow

# The compiled twin (maxmin_jit.py, numba, the same floats bit for bit) takes over once the
# numpy solver has spent, by estimate, twice what loading the kernel from numba's on-disk
# cache costs (0.4-0.6 s CPU), or once what compiling it costs when nothing is cached
# (4.5-5.7 s, once per machine): short runs never load it, and a run that stops right after
# loading it loses at most that cost.  numpy costs about 100 us per solve plus 0.05 us per
# route entry (2-core x86, measured).  CLUSTERSIM_NO_JIT=1 keeps numpy; CLUSTERSIM_JIT=always
# takes the kernel from the first solve (tests, benchmarks).
_NUMPY_SOLVE_S, _NUMPY_ENTRY_S = 100e-6, 0.05e-6
_LOAD_CACHED_S, _LOAD_COMPILE_S = 1.0, 5.0
_load_after_s: float | None = None     # one of the two, decided at the first solve
_numpy_spent_s = 0.0


def max_min_rates(ptr: np.ndarray, links: np.ndarray, coefs: np.ndarray | None, capacity: np.ndarray,
                  weight: np.ndarray | None = None, cap: np.ndarray | None = None,
                  return_rounds: bool = False):
    """Max-min fair rate of every flow (bytes/s per member flow).

    Parameters
    ----------
    ptr : int array, shape (F+1,)
        CSR row pointer: flow ``f`` uses ``links[ptr[f]:ptr[f+1]]``.
    links : int array, shape (nnz,)
        Link ids into ``capacity``; a link may repeat inside one flow.
    coefs : float array, shape (nnz,) or None
        Bytes on the link per byte of the flow (None: all 1).
    capacity : float array, shape (L,)
        Link capacities, bytes/s.
    weight : float array, shape (F,) or None
        Identical member flows each entry stands for (None: all 1).
    cap : float array, shape (F,) or None
        Per-flow rate limits (``inf`` for none).

    Returns
    -------
    numpy.ndarray, shape (F,)
        Rates; a flow with no links and no cap gets ``inf``.

    One function on purpose: it is the innermost numerical kernel (every re-solve of every
    run goes through it), and its rounds share arrays that splitting would pass around or
    copy; the steps are commented where they happen.
    """
    ptr = np.asarray(ptr, dtype=np.int64)
    F = ptr.size - 1
    rate = np.full(F, np.inf)
    if cap is not None:
        rate[:] = np.asarray(cap, dtype=float)
    links = np.asarray(links, dtype=np.int64)
    if F == 0 or links.size == 0:
        return (rate, 0) if return_rounds else rate
    capacity = np.asarray(capacity, dtype=float)
    if F == 1 and not return_rounds:
        # one flow: it rises until its most loaded link fills (or it reaches its cap)
        use = np.ones(links.size) if coefs is None else np.asarray(coefs, dtype=float)
        if weight is not None:
            use = use * float(np.asarray(weight, dtype=float)[0])
        u, inv = np.unique(links, return_inverse=True)
        load = np.bincount(inv.ravel(), weights=use, minlength=u.size)
        live = load > _EPS
        if live.any():
            rate[0] = min(rate[0], float(np.min(capacity[u[live]] / load[live])))
        return rate
    rounds = _solve_compiled(ptr, links, coefs, capacity, weight, rate)
    if rounds >= 0:
        return (rate, rounds) if return_rounds else rate
    seg_all = np.diff(ptr)
    fids = np.flatnonzero(seg_all)          # flows with at least one link
    seg = seg_all[fids]
    # compact link space without sorting: only links some flow crosses take part
    mark = np.zeros(capacity.size, dtype=bool)
    mark[links] = True
    used = np.flatnonzero(mark)
    remap = np.empty(capacity.size, dtype=np.int64)
    remap[used] = np.arange(used.size)
    nz_link = remap[links]
    Lc = used.size
    use = np.ones(links.size) if coefs is None else np.array(coefs, dtype=float)
    if weight is not None:
        use *= np.repeat(np.asarray(weight, dtype=float), seg_all)     # each entry's flow's weight
    cnt = np.bincount(nz_link, weights=use, minlength=Lc)
    rem = capacity[used].copy()
    fcap = np.full(F, np.inf) if cap is None else np.asarray(cap, dtype=float)
    fcap_a = fcap[fids]
    rounds = 0
    while fids.size:
        rounds += 1
        # Shares of the links live flows cross: per link when routes are long (ring
        # channels put many entries on few links), else on the live route entries only,
        # so late rounds with few live flows stay cheap.
        if nz_link.size > 2 * Lc:   # many route entries per link: evaluate shares per link
            share = np.full(Lc, np.inf)
            np.divide(np.maximum(rem, 0.0), cnt, out=share, where=cnt > _EPS)
            s_nz = share[nz_link]
        else:                       # few: evaluate them on the live routes only
            c_nz = cnt[nz_link]
            s_nz = np.maximum(rem[nz_link], 0.0) / np.where(c_nz > _EPS, c_nz, 1.0)
            s_nz[c_nz <= _EPS] = np.inf
        starts = np.zeros(fids.size, dtype=np.int64)
        np.cumsum(seg[:-1], out=starts[1:])
        smin = np.minimum.reduceat(s_nz, starts)
        fmin = np.minimum(smin, fcap_a)
        fmin_nz = np.repeat(fmin, seg)
        # A link is a local bottleneck when no flow crossing it is held lower elsewhere
        # (share <= fmin (1 + tol) for every crossing flow); mark the links that fail it.
        lower = fmin_nz * (1.0 + _REL) < s_nz
        notb = np.zeros(Lc, dtype=bool)     # (fresh: cheaper than clearing the live entries' links)
        notb[nz_link[lower]] = True
        bott_nz = ~notb[nz_link]
        frozen = np.logical_or.reduceat(bott_nz, starts) | (fcap_a <= smin * (1.0 + _REL))
        rate[fids[frozen]] = fmin[frozen]
        if frozen.all():
            break
        # Every flow crossing a bottleneck link froze, so those links drop out with them.
        fro_nz = np.repeat(frozen, seg)
        k = nz_link[fro_nz]
        u = use[fro_nz]
        if 8 * k.size > Lc:        # dense release: one pass over the link table
            rem -= np.bincount(k, weights=u * fmin_nz[fro_nz], minlength=Lc)
            cnt -= np.bincount(k, weights=u, minlength=Lc)
        else:                       # sparse release: touch only the freed links
            np.subtract.at(rem, k, u * fmin_nz[fro_nz])
            np.subtract.at(cnt, k, u)
        keep_nz = ~fro_nz
        keep = ~frozen
        nz_link, use = nz_link[keep_nz], use[keep_nz]
        fids, seg, fcap_a = fids[keep], seg[keep], fcap_a[keep]
    return (rate, rounds) if return_rounds else rate


def _solve_compiled(ptr, links, coefs, capacity, weight, rate) -> int:
    """Solve with the compiled kernel into ``rate`` (holding the caps) and return the round
    count; -1 when it is not loaded yet, disabled, absent (no numba) or declines the instance.
    Until it is loaded, small instances run its rounds in plain Python
    (:mod:`.maxmin_small`: the same floats; disabled with it by CLUSTERSIM_NO_JIT)."""
    global _numpy_spent_s, _load_after_s
    if maxmin_jit.disabled():
        return -1
    kernel = maxmin_jit.loaded()
    if kernel is None:
        if links.size <= maxmin_small.MAX_ENTRIES and not maxmin_jit.forced():
            rounds = maxmin_small.solve(ptr, links, coefs, weight, capacity, rate)
            if rounds >= 0:
                return rounds
        if _load_after_s is None:
            _load_after_s = _LOAD_CACHED_S if maxmin_jit.cached() else _LOAD_COMPILE_S
        _numpy_spent_s += _NUMPY_SOLVE_S + _NUMPY_ENTRY_S * links.size
        if (_numpy_spent_s < _load_after_s and not maxmin_jit.forced()) or (kernel := maxmin_jit.load()) is None:
            return -1
    empty = np.empty(0)
    return kernel(np.ascontiguousarray(ptr), np.ascontiguousarray(links),
                  empty if coefs is None else np.ascontiguousarray(coefs, dtype=float),
                  empty if weight is None else np.ascontiguousarray(weight, dtype=float),
                  np.ascontiguousarray(capacity), rate.copy(), rate)
