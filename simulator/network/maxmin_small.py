"""The compiled kernel's rounds (:mod:`simulator.network.maxmin_jit`) in plain Python on lists,
for the many tiny solves of a run with few live flows.

A solve of a handful of flows costs numpy about 100 us (a few dozen calls on arrays of a
few elements per round); the same rounds as loops over Python floats cost a fraction of it.
They are the kernel's loops, line for line, so they give the numpy solver's floats bit for
bit and its round count, and decline (-1: the numpy solver answers) exactly where the
kernel does: an entry's usage not positive and finite, a capacity in use not finite, a cap
not positive.  Python floats are IEEE doubles and each operation below is the kernel's,
with the same operands in the same order (tests/simulator/test_maxmin_small.py checks the
result against the numpy solver on thousands of random small instances).
"""

from __future__ import annotations

import math

import numpy as np

_REL = 1e-9      # as in maxmin.py
_EPS = 1e-12
_INF = math.inf

#: instances with up to this many route entries are solved here when the compiled kernel is
#: not loaded (larger ones: numpy's per-call cost is then spread over enough entries)
MAX_ENTRIES = 64


def _max0(x: float) -> float:
    """np.maximum(x, 0.0): NaN stays NaN, -0.0 gives +0.0."""
    return x if (x > 0.0 or x != x) else 0.0


def _min(a: float, b: float) -> float:
    """np.minimum(a, b): NaN if either is NaN, else the smaller, ``b`` on a tie."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a < b else b


def _prepare(ptr, links, coefs, weight, capacity):
    """(per-entry compact link, per-entry usage, per-link cnt, per-link rem), or None when
    the kernel would decline."""
    remap: dict = {}
    used, nzl, use = [], [], []
    for f in range(len(ptr) - 1):
        w = weight[f] if weight is not None else 1.0
        for e in range(ptr[f], ptr[f + 1]):
            lk = links[e]
            c = remap.get(lk)
            if c is None:
                c = remap[lk] = len(used)
                used.append(lk)
            nzl.append(c)
            u = coefs[e] if coefs is not None else 1.0
            if weight is not None:
                u = u * w
            if not (u > 0.0 and u < _INF):
                return None
            use.append(u)
    cnt = [0.0] * len(used)
    for c, u in zip(nzl, use):          # np.bincount: entry by entry, from 0.0
        cnt[c] += u
    rem = capacity.take(used).tolist()
    for r, k in zip(rem, cnt):
        if not (abs(r) < _INF and k < _INF):
            return None
    return nzl, use, cnt, rem


def _round(ptr, nzl, rem, cnt, fcap, fids):
    """One round: (bottleneck share, rate if frozen, frozen) per live flow."""
    share = [_max0(r) / k if k > _EPS else _INF for r, k in zip(rem, cnt)]
    notb = [False] * len(rem)
    smin, fmin = [], []
    for f in fids:
        m = share[nzl[ptr[f]]]
        for e in range(ptr[f] + 1, ptr[f + 1]):
            m = _min(m, share[nzl[e]])
        smin.append(m)
        fmin.append(_min(m, fcap[f]))
    for f, x in zip(fids, fmin):        # links some crossing flow is held below
        lim = x * (1.0 + _REL)
        for e in range(ptr[f], ptr[f + 1]):
            if lim < share[nzl[e]]:
                notb[nzl[e]] = True
    frozen = []
    for f, m in zip(fids, smin):
        fr = fcap[f] <= m * (1.0 + _REL)
        if not fr:
            for e in range(ptr[f], ptr[f + 1]):
                if not notb[nzl[e]]:
                    fr = True
                    break
        frozen.append(fr)
    return fmin, frozen


def _release(ptr, nzl, use, rem, cnt, fids, fmin, frozen) -> list:
    """Take the frozen flows' usage off their links; returns the flows still live."""
    n_entries = sum(ptr[f + 1] - ptr[f] for f, fr in zip(fids, frozen) if fr)
    dense = 8 * n_entries > len(rem)
    if dense:
        acc, acc_c = [0.0] * len(rem), [0.0] * len(rem)
    for f, x, fr in zip(fids, fmin, frozen):
        if fr:
            for e in range(ptr[f], ptr[f + 1]):
                if dense:                # rem -= np.bincount(...): sum per link first
                    acc[nzl[e]] += use[e] * x
                    acc_c[nzl[e]] += use[e]
                else:                    # np.subtract.at: one subtraction per entry
                    rem[nzl[e]] -= use[e] * x
                    cnt[nzl[e]] -= use[e]
    if dense:
        for c in range(len(rem)):
            rem[c] -= acc[c]
            cnt[c] -= acc_c[c]
    return [f for f, fr in zip(fids, frozen) if not fr]


def solve(ptr, links, coefs, weight, capacity, rate) -> int:
    """The rounds of ``max_min_rates`` into ``rate`` (numpy, holding the caps); returns the
    round count, or -1 (``rate`` untouched) when the numpy solver must answer.
    ``coefs``/``weight`` None: all 1."""
    ptr, links = ptr.tolist(), links.tolist()
    coefs = None if coefs is None else np.asarray(coefs, dtype=float).tolist()
    weight = None if weight is None else np.asarray(weight, dtype=float).tolist()
    prep = _prepare(ptr, links, coefs, weight, capacity)
    if prep is None:
        return -1
    nzl, use, cnt, rem = prep
    fcap = rate.tolist()
    for x in fcap:
        if not x > 0.0:                  # a cap <= 0 or NaN: the reference decides
            return -1
    fids = [f for f in range(len(ptr) - 1) if ptr[f + 1] > ptr[f]]
    out = {}
    rounds = 0
    while fids:
        rounds += 1
        fmin, frozen = _round(ptr, nzl, rem, cnt, fcap, fids)
        for f, x, fr in zip(fids, fmin, frozen):
            if fr:
                out[f] = x
        if all(frozen):
            break
        fids = _release(ptr, nzl, use, rem, cnt, fids, fmin, frozen)
    for f, x in out.items():
        rate[f] = x
    return rounds
