"""What-ifs: slow GPUs, jitter, thermal throttling, degraded and failed links and NICs.

A :class:`WhatIf` is the ``whatif:`` section of a scenario (or the ``whatif=`` argument of
:func:`simulator.engine.run`).  Every key is optional; the simplest form is stable::

    whatif: {slow_gpus: {17: 1.5}}          # GPU 17 computes 1.5x slower

What is modelled
----------------
*Compute* perturbations change the duration of a rank's compute ops (``d`` is the op's
modelled duration on the rank):

* ``slow_gpus`` / ``slow_ranks``: ``d x factor`` on every op, for the whole run.
* ``jitter``: a random factor ``F`` (``lognormal(mu, sigma)``: ``F = exp(mu + sigma Z)``)
  or a stall of ``seconds`` with probability ``p`` (``bernoulli_stall(p, seconds)``),
  drawn per *scope*: ``op`` (every compute op of every GPU draws its own; ``d x F`` or
  ``d + stall``), ``gpu_step`` (one draw per GPU per step, applied to every op of that
  step; a stall is added once, to the step's first compute op) or ``host_step`` (one draw
  per host per step, shared by its GPUs).  Independent per-op noise averages out over the
  thousands of ops of a step; persistent per-GPU (per-host) slowness does not, and the
  slowest of N GPUs sets the pace of every synchronising collective.
* ``thermal``: ``factor`` from ``start_s`` on (a compute op that straddles the instant is
  slowed on its remaining part only: ``(s - t0) + (t0 + d - s) x factor``) or from step
  ``start_step`` on (every op of that step and later).

Multiplicative effects compose in this order: slow factor, jitter factor, the
communication-overlap slowdown of :data:`simulator.engine.COMM_SLOWDOWN`, then stalls
are added and thermal throttling is applied to the result.

*Network* perturbations build a perturbed copy of the cluster
(:meth:`topologies.cluster.Cluster.perturbed`) before anything is planned, so routes,
collective algorithm choices and latencies all see them:

* ``degraded_links``: a cable (both directions) at ``bandwidth_factor`` x its bandwidth
  and ``extra_latency`` more latency;
* ``failed_links``: a cable that carries nothing; routes use the remaining spine planes
  under the cluster's routing policy (:mod:`topologies.routing`); when none is left the
  run is a :class:`ConfigError` naming both GPUs;
* ``degraded_nics`` and the NIC form of ``slow_gpus``: the NIC's port (NIC <-> leaf) at
  a fraction of its bandwidth, plus latency;
* ``failed_nics``: without failover the job *stops* at the first transfer that needs the
  NIC at or after the failure instant ``at_s`` (:class:`JobStopped`, naming the NIC, its
  GPUs and the instant); with ``nic_failover: pxn`` the GPUs of the failed NIC send and
  receive through the NIC of a same-host peer (the next working NIC of the host), over
  NVLink, as NCCL's PXN does, and the job completes.

*Placement*: ``placement`` lists the GPU of every rank (a custom rank -> GPU map; the mesh
order stays ``parallel.mesh_order``).  Topology alternatives (oversubscription, NVLink
domain size, rail optimisation, racks, routing policy) are cluster keys.

*Algorithm*: ``cp_mla_latent: true`` changes what the program does, not the machine.  For
a model with multi-head latent attention (MLA) under context parallelism (``p2p`` ring or
``all_gather``), the exchange carries each token's compressed latent and decoupled RoPE
key, ``(kv_lora_rank + qk_rope_head_dim) x 2`` bytes per layer, instead of the per-head K
and V that Megatron-Core up-projects before Transformer Engine's exchange,
``heads/tp x (qk_head_dim + v_head_dim) x 2``; every rank up-projects the chunks it
receives (forward: the up-projection; backward: it again, its data and weight gradients),
work Megatron does once per token on the token's own rank.  No framework does this today
(:mod:`workloads.stacks.megatron_te.context_parallel`).

Randomness comes from the scenario's ``seed`` only: jitter entry ``j`` draws from
``numpy.random.default_rng([seed, 0x57484154, j])`` (step scopes: one matrix of steps x
GPUs or hosts) or ``default_rng([seed, 0x57484154, j, 1 + gpu])`` (op scope: one stream
per GPU), so a rank's draws do not depend on folding or on other GPUs.

Folding stays exact: every rank is coloured by what the what-ifs do to it (its factors,
its draws), links by capacity, latency and failure, so the refinement of
:mod:`simulator.engine.fold` splits only the cells a what-if touches.

Not modelled: failures of NVLink or PCIe links, a NIC that fails in the middle of a
transfer and recovers, SHARP trees around failed links, straggler mitigation by the
framework.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from topologies import ConfigError
from topologies.errors import check_keys
from topologies.units import parse_time

__all__ = ["WhatIf", "Jitter", "Thermal", "LinkChange", "NicChange", "NicFailure", "WHATIF_KEYS", "SCOPES",
           "SEED_TAG"]

WHATIF_KEYS = ("slow_gpus", "slow_ranks", "jitter", "thermal", "degraded_links", "failed_links", "degraded_nics",
               "failed_nics", "nic_failover", "placement", "cp_mla_latent")
SCOPES = ("op", "gpu_step", "host_step")
SEED_TAG = 0x57484154           # "WHAT": separates what-if draws from other users of the seed


@dataclass(slots=True)
class Jitter:
    """Random slowness: ``scope`` op | gpu_step | host_step; ``dist`` lognormal | bernoulli_stall
    with parameters ``(mu, sigma)`` or ``(p, seconds)``; ``gpus`` None = all."""

    scope: str
    dist: str
    params: tuple
    gpus: tuple | None = None


@dataclass(slots=True)
class Thermal:
    """Compute ``factor`` x slower on ``gpus`` (None = all) from ``start_s`` or from step ``start_step``."""

    factor: float
    gpus: tuple | None = None
    start_s: float | None = None
    start_step: int | None = None


@dataclass(slots=True)
class LinkChange:
    """A cable ``nodes`` (both directions) at ``bandwidth_factor`` x bandwidth, ``extra_latency_s`` more latency."""

    nodes: tuple
    bandwidth_factor: float = 1.0
    extra_latency_s: float = 0.0


@dataclass(slots=True)
class NicChange:
    """NIC ``nic``'s port at ``bandwidth_factor`` x bandwidth, ``extra_latency_s`` more latency."""

    nic: str
    bandwidth_factor: float = 1.0
    extra_latency_s: float = 0.0


@dataclass(slots=True)
class NicFailure:
    """NIC ``nic`` fails at ``at_s`` (0: from the start)."""

    nic: str
    at_s: float = 0.0


@dataclass(kw_only=True, slots=True)
class WhatIf:
    """The ``whatif:`` section, parsed (:meth:`from_dict`) and checked against a cluster
    (:meth:`check`).  Empty by default: no perturbation."""

    slow_gpus: dict = field(default_factory=dict)
    """GPU id -> compute slowdown factor (> 0; 1.5 = 50 % slower)."""
    slow_nics: dict = field(default_factory=dict)
    """GPU id -> slowdown factor of its NIC (bandwidth / factor), from ``slow_gpus: {g: {nic: f}}``."""
    slow_ranks: dict = field(default_factory=dict)
    """Rank -> compute slowdown factor (placed through the mesh)."""
    jitter: list = field(default_factory=list)
    thermal: list = field(default_factory=list)
    degraded_links: list = field(default_factory=list)
    failed_links: list = field(default_factory=list)
    degraded_nics: list = field(default_factory=list)
    failed_nics: list = field(default_factory=list)
    nic_failover: str = "none"
    """``none`` (a failed NIC stops the job) | ``pxn`` (a same-host peer's NIC carries its traffic)."""
    placement: tuple | None = None
    """GPU of every rank (None: the identity)."""
    cp_mla_latent: bool = False
    """The CP exchange of an MLA model carries the latent instead of per-head K/V (a what-if
    of the algorithm, see the module docstring)."""

    # -- parsing ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d) -> "WhatIf":
        """Parse a mapping (the YAML form); shapes, types and ranges are checked here, ids
        against a cluster by :meth:`check`."""
        if d is None:
            return cls()
        if isinstance(d, WhatIf):
            return d
        if not isinstance(d, dict):
            raise ConfigError("whatif", d, "expected a mapping of what-if keys")
        check_keys(d, WHATIF_KEYS, "whatif")
        w = cls()
        for g, v in _mapping(d.get("slow_gpus"), "whatif.slow_gpus").items():
            gid = _id(g, "whatif.slow_gpus")
            if isinstance(v, dict):
                check_keys(v, ("compute", "nic"), f"whatif.slow_gpus.{gid}")
                if "compute" in v:
                    w.slow_gpus[gid] = _factor(v["compute"], f"whatif.slow_gpus.{gid}.compute")
                if "nic" in v:
                    w.slow_nics[gid] = _factor(v["nic"], f"whatif.slow_gpus.{gid}.nic")
            else:
                w.slow_gpus[gid] = _factor(v, f"whatif.slow_gpus.{gid}")
        for r, v in _mapping(d.get("slow_ranks"), "whatif.slow_ranks").items():
            rid = _id(r, "whatif.slow_ranks")
            w.slow_ranks[rid] = _factor(v, f"whatif.slow_ranks.{rid}")
        for j, e in enumerate(_entries(d.get("jitter"), "whatif.jitter")):
            w.jitter.append(_jitter(e, f"whatif.jitter[{j}]"))
        for j, e in enumerate(_entries(d.get("thermal"), "whatif.thermal")):
            f = f"whatif.thermal[{j}]"
            _entry(e, ("factor", "gpus", "start_s", "start_step"), f, "{factor, gpus, start_s | start_step}")
            if ("start_s" in e) == ("start_step" in e):
                raise ConfigError(f"{f}.start_s", e.get("start_s"), "give exactly one of start_s and start_step")
            start_s = start_step = None
            if "start_s" in e:
                start_s = _time(e["start_s"], f"{f}.start_s")
            else:
                start_step = _id(e["start_step"], f"{f}.start_step")
            w.thermal.append(Thermal(_factor(e.get("factor"), f"{f}.factor"), _gpus(e.get("gpus", "all"), f"{f}.gpus"),
                                     start_s, start_step))
        for j, e in enumerate(_entries(d.get("degraded_links"), "whatif.degraded_links")):
            f = f"whatif.degraded_links[{j}]"
            _entry(e, ("link", "bandwidth_factor", "extra_latency"), f,
                   "{link: [node, node], bandwidth_factor, extra_latency}")
            w.degraded_links.append(LinkChange(_link(e.get("link"), f"{f}.link"),
                                               _factor(e.get("bandwidth_factor", 1.0), f"{f}.bandwidth_factor"),
                                               _time(e.get("extra_latency", 0.0), f"{f}.extra_latency")))
        for j, e in enumerate(_entries(d.get("failed_links"), "whatif.failed_links")):
            w.failed_links.append(_link(e, f"whatif.failed_links[{j}]"))
        for j, e in enumerate(_entries(d.get("degraded_nics"), "whatif.degraded_nics")):
            f = f"whatif.degraded_nics[{j}]"
            _entry(e, ("nic", "gpu", "bandwidth_factor", "extra_latency"), f,
                   "{nic: NAME | gpu: ID, bandwidth_factor, extra_latency}")
            w.degraded_nics.append(NicChange(_nic_ref(e, f), _factor(e.get("bandwidth_factor", 1.0),
                                                                      f"{f}.bandwidth_factor"),
                                             _time(e.get("extra_latency", 0.0), f"{f}.extra_latency")))
        for j, e in enumerate(_entries(d.get("failed_nics"), "whatif.failed_nics")):
            f = f"whatif.failed_nics[{j}]"
            if isinstance(e, dict):
                check_keys(e, ("nic", "gpu", "at_s"), f)
                w.failed_nics.append(NicFailure(_nic_ref(e, f), _time(e.get("at_s", 0.0), f"{f}.at_s")))
            else:
                w.failed_nics.append(NicFailure(_nic_ref({"gpu": e} if isinstance(e, int) else {"nic": e}, f)))
        fo = d.get("nic_failover", "none")
        if fo not in ("none", "pxn"):
            raise ConfigError("whatif.nic_failover", fo, "must be none or pxn")
        w.nic_failover = fo
        if d.get("placement") is not None:
            pl = d["placement"]
            if not isinstance(pl, (list, tuple)):
                raise ConfigError("whatif.placement", pl, "expected a list: the GPU of every rank")
            w.placement = tuple(_id(g, "whatif.placement") for g in pl)
        latent = d.get("cp_mla_latent", False)
        if not isinstance(latent, bool):
            raise ConfigError("whatif.cp_mla_latent", latent, "must be true or false")
        w.cp_mla_latent = latent
        return w

    def to_dict(self) -> dict:
        """The YAML form (only the keys that are set)."""
        out: dict = {}
        slow = {g: f for g, f in self.slow_gpus.items()}
        for g, f in self.slow_nics.items():
            slow[g] = {"nic": f, **({"compute": slow[g]} if g in slow else {})}
        if slow:
            out["slow_gpus"] = slow
        if self.slow_ranks:
            out["slow_ranks"] = dict(self.slow_ranks)
        if self.jitter:
            out["jitter"] = [{"scope": j.scope, "dist": f"{j.dist}({j.params[0]!r}, {j.params[1]!r})",
                              "gpus": "all" if j.gpus is None else list(j.gpus)} for j in self.jitter]
        if self.thermal:
            out["thermal"] = [{"factor": t.factor, "gpus": "all" if t.gpus is None else list(t.gpus),
                               **({"start_s": t.start_s} if t.start_s is not None else {"start_step": t.start_step})}
                              for t in self.thermal]
        if self.degraded_links:
            out["degraded_links"] = [{"link": list(c.nodes), "bandwidth_factor": c.bandwidth_factor,
                                      "extra_latency": c.extra_latency_s} for c in self.degraded_links]
        if self.failed_links:
            out["failed_links"] = [list(n) for n in self.failed_links]
        if self.degraded_nics:
            out["degraded_nics"] = [{"nic": c.nic, "bandwidth_factor": c.bandwidth_factor,
                                     "extra_latency": c.extra_latency_s} for c in self.degraded_nics]
        if self.failed_nics:
            out["failed_nics"] = [{"nic": n.nic, "at_s": n.at_s} for n in self.failed_nics]
        if self.nic_failover != "none":
            out["nic_failover"] = self.nic_failover
        if self.placement is not None:
            out["placement"] = list(self.placement)
        if self.cp_mla_latent:
            out["cp_mla_latent"] = True
        return out

    @property
    def empty(self) -> bool:
        return not self.to_dict()

    @property
    def touches_network(self) -> bool:
        return bool(self.slow_nics or self.degraded_links or self.failed_links or self.degraded_nics
                    or self.failed_nics)

    # -- checks against a cluster ------------------------------------------------------------------
    def check(self, cluster, world_size: int, num_steps: int | None = None) -> None:
        """Every id names something that exists (GPU, rank, link, NIC); raises ConfigError."""
        n = cluster.num_gpus
        for key, ids in (("slow_gpus", self.slow_gpus), ("slow_gpus", self.slow_nics)):
            for g in ids:
                if not 0 <= g < n:
                    raise ConfigError(f"whatif.{key}", g, f"unknown GPU id: the cluster has GPUs 0..{n - 1}")
        for r in self.slow_ranks:
            if not 0 <= r < world_size:
                raise ConfigError("whatif.slow_ranks", r, f"unknown rank: the job has ranks 0..{world_size - 1}")
        for j, e in enumerate(self.jitter):
            _check_gpus(e.gpus, n, f"whatif.jitter[{j}].gpus")
        for j, e in enumerate(self.thermal):
            _check_gpus(e.gpus, n, f"whatif.thermal[{j}].gpus")
            if e.start_step is not None and num_steps is not None and e.start_step >= num_steps:
                raise ConfigError(f"whatif.thermal[{j}].start_step", e.start_step,
                                  f"must be below num_steps = {num_steps} (steps count from 0)")
        for j, c in enumerate(self.degraded_links):
            link_ids(cluster, c.nodes, f"whatif.degraded_links[{j}].link")
        for j, nodes in enumerate(self.failed_links):
            f = f"whatif.failed_links[{j}]"
            link_ids(cluster, nodes, f)
            kinds = {cluster.graph.nodes[x]["kind"] for x in nodes}
            if not kinds <= {"leaf", "spine", "core"}:
                raise ConfigError(f, list(nodes), "only switch links (leaf-spine, spine-core) can fail here; "
                                  "use whatif.failed_nics for a NIC (NVLink and PCIe failures are not modelled)")
            if cluster.spec.sharp:
                raise ConfigError(f, list(nodes), "failed links are not modelled with cluster.sharp: true "
                                  "(SHARP trees are not re-routed)")
        for j, c in enumerate(self.degraded_nics):
            nic_links(cluster, c.nic, f"whatif.degraded_nics[{j}].nic")
        for j, c in enumerate(self.failed_nics):
            nic_links(cluster, c.nic, f"whatif.failed_nics[{j}].nic")
        if self.placement is not None:
            pl = self.placement
            if len(pl) != world_size or len(set(pl)) != len(pl) or not all(0 <= g < n for g in pl):
                raise ConfigError("whatif.placement", f"{len(pl)} entries",
                                  f"must map each of the {world_size} ranks to a distinct GPU id in 0..{n - 1}")


# -- parsing helpers ----------------------------------------------------------------------------------
def _mapping(v, f) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ConfigError(f, v, "expected a mapping {id: factor}")
    return v


def _entry(e, keys, f, shape: str) -> None:
    """An entry must be a mapping of ``keys`` only (``shape`` shows its form in the error)."""
    if not isinstance(e, dict):
        raise ConfigError(f, e, f"expected a mapping {shape}")
    check_keys(e, keys, f)


def _entries(v, f) -> list:
    if v is None:
        return []
    if isinstance(v, dict):
        return [v]
    if not isinstance(v, (list, tuple)):
        raise ConfigError(f, v, "expected a list of entries")
    return list(v)


def _id(v, f) -> int:
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise ConfigError(f, v, "must be an integer id >= 0")
    return int(v)


def _factor(v, f) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f, v, "must be a number > 0")
    return float(v)


def _time(v, f) -> float:
    t = parse_time(v, f) if isinstance(v, str) else v
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise ConfigError(f, v, "must be a time >= 0 (seconds, or a string like '5 us')")
    return float(t)


def _gpus(v, f):
    if v == "all" or v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, (list, tuple)) or not v:
        raise ConfigError(f, v, "must be 'all' or a non-empty list of GPU ids")
    return tuple(sorted({_id(g, f) for g in v}))


def _check_gpus(gpus, n, f) -> None:
    for g in gpus or ():
        if not 0 <= g < n:
            raise ConfigError(f, g, f"unknown GPU id: the cluster has GPUs 0..{n - 1}")


_DIST = re.compile(r"^\s*(lognormal|bernoulli_stall)\s*\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)\s*$")


def _jitter(e, f) -> Jitter:
    _entry(e, ("scope", "dist", "gpus"), f, "{scope, dist, gpus}")
    scope = e.get("scope", "op")
    if scope not in SCOPES:
        raise ConfigError(f"{f}.scope", scope, f"must be one of {', '.join(SCOPES)}")
    dist = e.get("dist")
    m = _DIST.match(dist) if isinstance(dist, str) else None
    if m is None:
        raise ConfigError(f"{f}.dist", dist, "must be lognormal(mu, sigma) or bernoulli_stall(p, seconds)")
    kind = m.group(1)
    try:
        a = float(m.group(2))
    except ValueError:
        raise ConfigError(f"{f}.dist", dist, "parameters must be numbers") from None
    if kind == "lognormal":
        try:
            b = float(m.group(3))
        except ValueError:
            raise ConfigError(f"{f}.dist", dist, "parameters must be numbers") from None
        if not (math.isfinite(a) and math.isfinite(b)) or b < 0:
            raise ConfigError(f"{f}.dist", dist, "lognormal(mu, sigma) needs finite mu and sigma >= 0")
    else:
        b = _time(m.group(3) if not _isnum(m.group(3)) else float(m.group(3)), f"{f}.dist")
        if not 0 <= a <= 1:
            raise ConfigError(f"{f}.dist", dist, "bernoulli_stall(p, seconds) needs 0 <= p <= 1")
    return Jitter(scope, kind, (a, b), _gpus(e.get("gpus", "all"), f"{f}.gpus"))


def _isnum(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _link(v, f) -> tuple:
    if isinstance(v, str) and "--" in v:
        v = [x.strip() for x in v.split("--")]
    if not isinstance(v, (list, tuple)) or len(v) != 2 or not all(isinstance(x, str) for x in v):
        raise ConfigError(f, v, "a link is two node names, e.g. [leaf0.0, spine0.1] (see clustersim topo --route)")
    return (v[0], v[1])


def _nic_ref(e: dict, f) -> str:
    """A NIC name, or ('gpu', id) resolved by :func:`_nic_links`."""
    if ("nic" in e) == ("gpu" in e):
        raise ConfigError(f, e, "give exactly one of nic: NAME (e.g. nic0.3) and gpu: ID (its NIC)")
    if "gpu" in e:
        return f"gpu:{_id(e['gpu'], f + '.gpu')}"
    if not isinstance(e["nic"], str):
        raise ConfigError(f"{f}.nic", e["nic"], "must be a NIC name like nic0.3 (host 0, NIC 3)")
    return e["nic"]


def link_ids(cluster, nodes, f) -> list[int]:
    u, v = nodes
    ids = [cluster.link_id.get((u, v)), cluster.link_id.get((v, u))]
    if ids[0] is None or ids[1] is None:
        raise ConfigError(f, list(nodes), f"no such link in cluster {cluster.spec.name} (node names as in "
                          "'clustersim topo --route'; e.g. leaf0.0 -- spine0.1)")
    return ids


def nic_name(cluster, ref: str, f) -> str:
    if ref.startswith("gpu:"):
        g = int(ref[4:])
        f = f[:-4] + ".gpu" if f.endswith(".nic") else f
        if not 0 <= g < cluster.num_gpus:
            raise ConfigError(f, g, f"unknown GPU id: the cluster has GPUs 0..{cluster.num_gpus - 1}")
        k = cluster.nic_of(g)
        if k < 0:
            raise ConfigError(f, g, "this GPU's host has no NIC")
        return cluster.router.nic_names[k]
    return ref


def nic_links(cluster, ref: str, f) -> tuple[str, list[int], list[int], list[int]]:
    """(name, port links NIC <-> leaf, PCIe links GPU <-> NIC, its GPUs) of a NIC."""
    name = nic_name(cluster, ref, f)
    g = cluster.graph
    if name not in g or g.nodes[name].get("kind") != "nic":
        raise ConfigError(f, ref, f"no such NIC in cluster {cluster.spec.name} (names are nic<host>.<k>, "
                          f"k < nics_per_host = {cluster.nics_per_host})")
    port, pcie, gpus = [], [], []
    for nb in g.successors(name):
        kind = g.nodes[nb]["kind"]
        if kind == "leaf":
            port += [cluster.link_id[(name, nb)], cluster.link_id[(nb, name)]]
        elif kind == "gpu":
            pcie += [cluster.link_id[(name, nb)], cluster.link_id[(nb, name)]]
            gpus.append(int(g.nodes[nb]["index"]))
    return name, port, pcie, sorted(gpus)
