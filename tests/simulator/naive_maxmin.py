"""A deliberately naive max-min solver: one water level per iteration, pure Python.

Test oracle for simulator.network.maxmin; shares no code with it.
"""


def naive_max_min(routes, capacity, weights=None, caps=None):
    """routes: list of list[(link, coef)] per flow; returns list of rates."""
    n = len(routes)
    weights = weights or [1.0] * n
    caps = caps or [float("inf")] * n
    rate = [0.0] * n
    frozen = [False] * n
    used = [0.0] * len(capacity)
    for f, r in enumerate(routes):
        if not r:
            rate[f] = caps[f]
            frozen[f] = True
    level = 0.0
    while not all(frozen):
        # largest increment every live flow can take before a link fills or a cap is hit
        inc = float("inf")
        for l, c in enumerate(capacity):
            demand = sum(weights[f] * coef for f, r in enumerate(routes) if not frozen[f] for (ll, coef) in r if ll == l)
            if demand > 0:
                inc = min(inc, (c - used[l]) / demand)
        for f in range(n):
            if not frozen[f]:
                inc = min(inc, caps[f] - level)
        inc = max(inc, 0.0)
        level += inc
        for f in range(n):
            if not frozen[f]:
                for l, coef in routes[f]:
                    used[l] += weights[f] * coef * inc
        for f in range(n):
            if frozen[f]:
                continue
            if caps[f] - level <= 1e-12 * max(1.0, level):
                frozen[f] = True
                rate[f] = level
                continue
            for l, coef in routes[f]:
                if capacity[l] - used[l] <= 1e-12 * capacity[l]:
                    frozen[f] = True
                    rate[f] = level
                    break
    return rate
