"""A compiled twin of :func:`simulator.network.maxmin.max_min_rates` for large solves.

The numpy solver is the reference; this kernel runs the very same local-minimum rounds
as plain loops (numba), so that a solve of thousands of live flows does not pay numpy's
per-call overhead a few dozen times per round.  It returns the same floats, bit for bit,
and the same round count: every floating-point operation of the reference is repeated
with the same operands in the same order (tests/simulator/test_maxmin_jit.py checks this
on thousands of random instances and on solves of a skewed all-to-all):

- per-link usage ``cnt`` and the dense release are ``np.bincount`` sums, which numpy
  accumulates entry by entry in input order starting from 0.0; the loops below do the
  same, and a dense release subtracts the per-link sum once, as ``rem -= bincount(...)``;
- the sparse release (``np.subtract.at``) subtracts entry by entry, as here;
- shares are ``maximum(rem, 0) / cnt`` (``inf`` where ``cnt <= 1e-12``), computed once
  per link; which of the reference's two share branches runs does not change a value;
- ``np.maximum(x, 0.0)`` gives +0.0 for x = -0.0 and propagates NaN, and
  ``np.minimum(a, b)`` propagates NaN and returns ``b`` on a tie (signed zeros); the
  helpers below copy both;
- a minimum over a flow's links does not depend on the order (shares are never -0.0).

The kernel returns -1, and the reference solves the instance, unless every route entry's
usage (coefficient times weight) is positive and finite, every capacity in use finite and
every cap positive (or ``inf``).  Then no NaN and no -0.0 can arise in any round (a link's
remaining capacity only decreases, at worst to -inf; shares lie in [+0, inf]), and these
are the only values on which numpy's order or its SIMD paths show: its minimum reduction
returns a positive NaN where the elementwise minimum keeps the sign of a negative one,
``np.minimum.reduceat(np.full(17, -np.nan), [0])`` against ``np.minimum(-np.nan, 1.0)``,
so NaN bits are not reproducible in general.

numba is optional: :func:`load` returns None when it cannot be imported, and the
reference solves everything.  Compiled code is cached on disk (``cache=True``), so only
the first process on a machine pays the compilation.
"""

from __future__ import annotations

import glob
import os

import numpy as np

_REL = 1e-9      # as in maxmin.py
_EPS = 1e-12

_kernel = None
_tried = False


def disabled() -> bool:
    """True when CLUSTERSIM_NO_JIT is set to anything but '' or '0' (the reference solves all)."""
    return os.environ.get("CLUSTERSIM_NO_JIT", "") not in ("", "0")


def forced() -> bool:
    """True when CLUSTERSIM_JIT=always: the compiled kernel from the first solve on."""
    return os.environ.get("CLUSTERSIM_JIT", "") == "always"


def cached() -> bool:
    """Whether numba's on-disk cache next to this file holds the kernel (a stale entry, after
    an edit of this file, still counts; a cache elsewhere, e.g. NUMBA_CACHE_DIR, does not)."""
    return bool(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__",
                                       "maxmin_jit._solve-*.nbi")))


def loaded():
    """The compiled solver if :func:`load` has made it, else None (imports nothing)."""
    return _kernel


def load():
    """The compiled solver, or None without numba; imports numba on the first call only."""
    global _kernel, _tried
    if not _tried:
        _tried = True
        try:
            import numba
        except ImportError:
            return None
        _kernel = _compile(numba)
    return _kernel


_PARTS = ("_np_max0", "_np_min", "_prepare", "_round", "_release", "_solve")


def _compile(numba):
    """Compile the plain-Python functions below with numba, in place: each one's calls to
    the others then resolve to the compiled versions."""
    jit = numba.njit(cache=True, nogil=True)
    g = globals()
    for name in _PARTS:
        if not hasattr(g[name], "py_func"):     # not compiled yet
            g[name] = jit(g[name])
    return g["_solve"]


def _np_max0(x):
    """np.maximum(x, 0.0): NaN stays NaN, -0.0 gives +0.0."""
    return x if (x > 0.0 or x != x) else 0.0


def _np_min(a, b):
    """np.minimum(a, b): NaN if either is NaN, else the smaller, ``b`` on a tie."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a < b else b


def _prepare(ptr, links, coefs, weight, capacity, nzl, use):
    """Compact link ids (first-seen order), each entry's usage, and per-link ``cnt``/``rem``.

    Returns (cnt, rem), or empty arrays when some usage is not finite."""
    remap = np.full(capacity.size, -1, dtype=np.int64)
    used = np.empty(links.size, dtype=np.int64)
    n_used = 0
    for f in range(ptr.size - 1):
        w = weight[f] if weight.size else 1.0
        for e in range(ptr[f], ptr[f + 1]):
            lk = links[e]
            if remap[lk] < 0:
                remap[lk] = n_used
                used[n_used] = lk
                n_used += 1
            nzl[e] = remap[lk]
            u = coefs[e] if coefs.size else 1.0
            if weight.size:
                u = u * w
            if not (u > 0.0 and u < np.inf):
                return np.empty(0), np.empty(0)
            use[e] = u
    cnt = np.zeros(n_used)
    for e in range(links.size):          # np.bincount: entry by entry, from 0.0
        cnt[nzl[e]] += use[e]
    rem = np.empty(n_used)
    for c in range(n_used):
        rem[c] = capacity[used[c]]
        if not (abs(rem[c]) < np.inf and cnt[c] < np.inf):
            return np.empty(0), np.empty(0)
    return cnt, rem


def _round(ptr, nzl, rem, cnt, fcap, fids, n_live, share, notb, smin, fmin, frozen):
    """One round: shares, each live flow's bottleneck share, local bottlenecks, frozen flags.

    Returns the number of live flows that froze."""
    for c in range(rem.size):
        share[c] = _np_max0(rem[c]) / cnt[c] if cnt[c] > _EPS else np.inf
        notb[c] = False
    for i in range(n_live):
        f = fids[i]
        m = share[nzl[ptr[f]]]
        for e in range(ptr[f] + 1, ptr[f + 1]):
            m = _np_min(m, share[nzl[e]])
        smin[i] = m
        fmin[i] = _np_min(m, fcap[f])
    for i in range(n_live):              # links some crossing flow is held below
        f = fids[i]
        lim = fmin[i] * (1.0 + _REL)
        for e in range(ptr[f], ptr[f + 1]):
            if lim < share[nzl[e]]:
                notb[nzl[e]] = True
    n_frozen = 0
    for i in range(n_live):
        f = fids[i]
        fr = fcap[f] <= smin[i] * (1.0 + _REL)
        for e in range(ptr[f], ptr[f + 1]):
            if not notb[nzl[e]]:
                fr = True
                break
        frozen[i] = fr
        n_frozen += fr
    return n_frozen


def _release(ptr, nzl, use, rem, cnt, fids, n_live, fmin, frozen, acc, acc_c):
    """Take the frozen flows' usage off their links; returns the flows still live (compacted
    in place in ``fids``)."""
    n_entries = 0
    for i in range(n_live):
        if frozen[i]:
            n_entries += ptr[fids[i] + 1] - ptr[fids[i]]
    dense = 8 * n_entries > rem.size
    for i in range(n_live):
        if frozen[i]:
            f = fids[i]
            for e in range(ptr[f], ptr[f + 1]):
                if dense:                # rem -= np.bincount(...): sum per link first
                    acc[nzl[e]] += use[e] * fmin[i]
                    acc_c[nzl[e]] += use[e]
                else:                    # np.subtract.at: one subtraction per entry
                    rem[nzl[e]] -= use[e] * fmin[i]
                    cnt[nzl[e]] -= use[e]
    if dense:
        for c in range(rem.size):
            rem[c] -= acc[c]
            cnt[c] -= acc_c[c]
            acc[c] = 0.0
            acc_c[c] = 0.0
    n_keep = 0
    for i in range(n_live):
        if not frozen[i]:
            fids[n_keep] = fids[i]
            n_keep += 1
    return n_keep


def _solve(ptr, links, coefs, weight, capacity, fcap, rate):
    """The rounds of ``max_min_rates``; writes ``rate`` and returns the round count, or -1
    (``rate`` untouched) when the reference must solve.  ``coefs``/``weight`` empty: all 1."""
    nzl = np.empty(links.size, dtype=np.int64)
    use = np.empty(links.size)
    cnt, rem = _prepare(ptr, links, coefs, weight, capacity, nzl, use)
    if cnt.size == 0:
        return -1
    F = ptr.size - 1
    fids = np.empty(F, dtype=np.int64)
    n_live = 0
    for f in range(F):
        if not fcap[f] > 0.0:            # a cap <= 0 or NaN: the reference decides
            return -1
        if ptr[f + 1] > ptr[f]:
            fids[n_live] = f
            n_live += 1
    Lc = rem.size
    share, notb = np.empty(Lc), np.zeros(Lc, dtype=np.bool_)
    acc, acc_c = np.zeros(Lc), np.zeros(Lc)
    smin, fmin, frozen = np.empty(n_live), np.empty(n_live), np.zeros(n_live, dtype=np.bool_)
    rounds = 0
    while n_live:
        rounds += 1
        n_frozen = _round(ptr, nzl, rem, cnt, fcap, fids, n_live, share, notb, smin, fmin, frozen)
        for i in range(n_live):
            if frozen[i]:
                rate[fids[i]] = fmin[i]
        if n_frozen == n_live:
            break
        n_live = _release(ptr, nzl, use, rem, cnt, fids, n_live, fmin, frozen, acc, acc_c)
    return rounds
