"""Settings a run asked for that its job never meets.

A what-if or a cluster setting changes links or GPUs; when the job sends nothing over those
links, the setting cannot change its result, and a sweep over
it gives the same answer at every value (an oversubscription ratio with every host under one
leaf, a failed spine link the job's traffic never reaches, a slow NIC on a host the job does
not use).  :func:`untouched_settings` names each such setting from a finished run, read
from the bytes every physical link carried (``Result.network``), so ``clustersim run`` can
say so, one line each on stderr.  Nothing here changes a result.

The rules, per setting:

* ``cluster.oversubscription`` (not 1): thins the leaf -> spine links; untouched when the
  job sent nothing over any leaf <-> spine link.
* ``whatif.degraded_links`` / ``whatif.failed_links``: a cable between switches (leaf,
  spine, core) is on the job's paths when the job's traffic leaves its lower switch through
  that tier (a failed cable carries nothing, and routes around it use the switch's other
  uplinks, so the switch's uplinks are what tell); any other cable when it carried bytes.
* ``whatif.degraded_nics`` and the NIC form of ``slow_gpus``: the NIC's port carried bytes.
* ``whatif.failed_nics``: the job sends traffic through the NICs of the NIC's host (the
  failover's route, or where the job would stop).

(A job uses every GPU of its cluster, so a compute what-if always meets it.)
"""

from __future__ import annotations

import numpy as np

__all__ = ["untouched_settings"]

_SWITCHES = ("leaf", "spine", "core")
_LEVEL = {"leaf": 0, "spine": 1, "core": 2}


def untouched_settings(res) -> list[str]:
    """One sentence per setting of ``res`` (a :class:`~simulator.engine.Result`) that
    touches no link its job uses; empty when every one is met, or when the run
    kept no per-link counters."""
    net = getattr(res, "network", None)
    if net is None:
        return []
    sc = res.scenario
    cluster = sc.cluster
    wi = sc.whatif
    over = getattr(cluster.spec, "oversubscription", 1.0)
    if over == 1 and not (wi.degraded_links or wi.failed_links or wi.degraded_nics or wi.slow_nics
                          or wi.failed_nics):
        return []       # nothing to check: spare the per-link counters of a large folded run
    used = np.asarray(net.link_bytes) > 0
    g = cluster.graph
    nodes = cluster.link_nodes
    out = []

    if over != 1 and not any(used[i] and {g.nodes[u].get("kind"), g.nodes[v].get("kind")} == {"leaf", "spine"}
                             for i, (u, v) in enumerate(nodes)):
        out.append(f"cluster.oversubscription = {over:g} changes only the leaf <-> spine links, and this job sends "
                   f"nothing over them (its traffic stays under its leaves); the result is the same at any ratio")

    def uplinked(node: str) -> bool:
        """The job's traffic leaves switch ``node`` upwards (over any of its uplinks)."""
        lvl = _LEVEL[g.nodes[node]["kind"]]
        return any(used[i] for i, (u, v) in enumerate(nodes) if node in (u, v)
                   and _LEVEL.get(g.nodes[v if u == node else u].get("kind"), -1) > lvl)

    def cable_met(pair, ids) -> bool:
        a, b = pair
        if g.nodes[a].get("kind") in _SWITCHES and g.nodes[b].get("kind") in _SWITCHES:
            low = min(pair, key=lambda n: _LEVEL[g.nodes[n]["kind"]])
            return uplinked(low)
        return bool(used[ids].any())

    for j, c in enumerate(wi.degraded_links):
        ids = [cluster.link_id[(c.nodes[0], c.nodes[1])], cluster.link_id[(c.nodes[1], c.nodes[0])]]
        if not cable_met(c.nodes, ids):
            out.append(f"whatif.degraded_links[{j}] ({c.nodes[0]} -- {c.nodes[1]}) is on none of this job's paths")
    for j, pair in enumerate(wi.failed_links):
        ids = [cluster.link_id[(pair[0], pair[1])], cluster.link_id[(pair[1], pair[0])]]
        if not cable_met(pair, ids):
            out.append(f"whatif.failed_links[{j}] ({pair[0]} -- {pair[1]}) is on none of this job's paths")

    from ..scenario.whatif import nic_links

    def port_used(nic: str) -> bool:
        _, port, _, _ = nic_links(cluster, nic, "whatif")
        return bool(used[port].any())

    for j, c in enumerate(wi.degraded_nics):
        if not port_used(c.nic):
            name = nic_links(cluster, c.nic, "whatif")[0]
            out.append(f"whatif.degraded_nics[{j}] ({name}) carries none of this job's traffic")
    for gpu in sorted(wi.slow_nics):
        k = cluster.nic_of(gpu)
        if k >= 0 and not port_used(cluster.router.nic_names[k]):
            out.append(f"whatif.slow_gpus.{gpu}.nic ({cluster.router.nic_names[k]}) carries none of this job's "
                       f"traffic")
    for j, c in enumerate(wi.failed_nics):
        name, _, _, gpus = nic_links(cluster, c.nic, "whatif")
        if not gpus:
            continue
        host = cluster.host_of(gpus[0])
        host_nics = {cluster.router.nic_names[cluster.nic_of(x)] for x in range(cluster.num_gpus)
                     if cluster.host_of(x) == host and cluster.nic_of(x) >= 0}
        if not any(port_used(n) for n in host_nics):
            out.append(f"whatif.failed_nics[{j}] ({name}): this job sends nothing through the NICs of its host")
    return out
