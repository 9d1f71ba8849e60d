"""`Cluster`: the graph, the ordered GPU list, the link table and structural routes.

A cluster is described by a :class:`ClusterSpec` (from a YAML preset, a mapping, or
keyword arguments) and built by :func:`build_cluster`.  The spec keeps three sizes
apart, as real systems do:

* ``gpus_per_host``   GPUs that share a host (PCIe, CPU, NICs);
* ``nics_per_host``   scale-out NICs of a host, with GPU ``local`` affine to NIC
  ``local // (gpus_per_host // nics_per_host)``;
* ``nvlink_domain_size``  GPUs in one NVLink domain: 8 for DGX/HGX (= the host),
  72 for GB200 NVL72 (18 hosts of 4 GPUs); a job on fewer GPUs than that is one domain of
  its own size.

Links are numbered as the graph iterates its edges (:mod:`topologies.builders`); ``link_capacity``,
``link_latency`` and ``link_tier`` are numpy arrays indexed by link id, and routes are
arrays of link ids (see :mod:`topologies.routing`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from . import builders
from .constants import value as active_value
from .errors import ConfigError, check_keys
from .specs import (LINK_LATENCY_S, PCIE_BANDWIDTH, GPUSpec, Tier,
                    get_gpu_spec, get_nic_spec)
from .units import fmt_bw, parse_bandwidth, parse_time

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["ClusterSpec", "Cluster", "build_cluster", "CLUSTER_PRESETS", "load_preset", "ROUTING_POLICIES",
           "domain_that_divides"]

PRESET_DIR = Path(__file__).with_name("presets")
ROUTING_POLICIES = ("dmodk", "ecmp_hash", "adaptive")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """What a cluster is made of.  Bandwidths are bytes/s per direction."""

    name: str = "custom"
    gpu: GPUSpec
    num_nodes: int
    """Hosts (the contract's ``num_nodes``)."""
    gpus_per_host: int = 8
    nvlink_domain_size: int = 8
    nvlink_bandwidth_bytes_per_s: float
    nics_per_host: int = 8
    nic_bandwidth_bytes_per_s: float = 400e9 / 8
    pcie_bandwidth_bytes_per_s: float
    hosts_per_leaf: int = 32
    """Hosts under one leaf (per rail when rail-optimised): a scalable unit."""
    rail_optimized: bool = True
    oversubscription: float = 1.0
    """Leaf downlink : uplink capacity ratio (1 = full bisection)."""
    num_spines: int | None = None
    """Spine planes per pod; default: one per leaf uplink port."""
    hosts_per_rack: int | None = None
    """Hosts per rack (pod with its own leaf/spine); None = one pod, no cross-rack tier."""
    xrack_bandwidth_per_host_bytes_per_s: float | None = None
    """Cross-rack bandwidth per host, one direction (the rack's uplink / hosts per rack)."""
    num_cores: int = 1
    xrack_latency_s: float = field(default_factory=lambda: _link_latency()[Tier.XRACK])
    """Default: the active ``topologies.specs.LINK_LATENCY_S`` (:mod:`topologies.constants`)."""
    routing: str = "dmodk"
    """``dmodk`` | ``ecmp_hash`` | ``adaptive``."""
    pxn: bool = True
    """Forward cross-rail traffic over NVLink to the peer on the destination rail (NCCL PXN)."""
    sharp: bool = False
    """The switches reduce in network (InfiniBand SHARP): enables NCCL's CollNet Direct and
    multi-node NVLS for all-reduce across nodes."""
    seed: int = 0
    """Seed of the ECMP hash."""
    nvls: bool = True
    """NCCL may use NVLink SHARP where the GPUs and switches have it (``NCCL_NVLS_ENABLE``,
    default on); false: never (``NCCL_NVLS_ENABLE=0``, as some recipes set)."""
    scaleup_topology: str = "switch"
    """``switch``: each GPU's NVLink port into one switch node per domain, of
    ``nvlink_bandwidth_bytes_per_s``; ``mesh``: a link of ``nvlink_bandwidth_bytes_per_s`` per
    direction between every pair of GPUs of a domain (AMD xGMI), no switch.  The GPU's."""

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_host


def _link_latency() -> dict:
    return active_value("topologies.specs.LINK_LATENCY_S", LINK_LATENCY_S)


_SPEC_KEYS = {
    "preset", "name", "gpu", "num_nodes", "num_gpus", "gpus_per_host", "nvlink_domain_size",
    "nvlink_bandwidth", "nics_per_host", "nic", "nic_bandwidth", "pcie_bandwidth", "hosts_per_leaf",
    "rail_optimized", "oversubscription", "num_spines", "hosts_per_rack", "xrack_bandwidth_per_host",
    "num_cores", "xrack_latency", "routing", "pxn", "sharp", "nvls", "seed", "source", "description",
}


def _preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


CLUSTER_PRESETS = tuple(_preset_names())


def load_preset(name: str) -> dict:
    """The mapping stored in ``presets/<name>.yaml``."""
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError("cluster.preset", name, f"unknown preset; known: {', '.join(_preset_names())}")
    with path.open() as f:        # package data: libyaml's parser where PyYAML has it (same mapping)
        data = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 (safe)
    return data


def _int(d: dict, key: str, default=None, minimum: int = 1) -> int | None:
    v = d.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise ConfigError(f"cluster.{key}", v, f"must be an integer >= {minimum}")
    return int(v)


def spec_from_mapping(cfg: dict | str) -> ClusterSpec:
    """Resolve a preset name, or a mapping of ``preset`` + overrides, into a ClusterSpec."""
    if isinstance(cfg, str):
        cfg = {"preset": cfg}
    if not isinstance(cfg, dict):
        raise ConfigError("cluster", cfg, "expected a preset name or a mapping")
    check_keys(cfg, _SPEC_KEYS, "cluster")
    merged: dict = {}
    if "preset" in cfg:
        base = load_preset(cfg["preset"])
        check_keys(base, _SPEC_KEYS - {"preset"}, f"preset {cfg['preset']}")
        merged.update(base)
        merged.setdefault("name", cfg["preset"])
        # the user's size replaces the preset's, in whichever form the user gives it
        for mine, theirs in (("num_gpus", "num_nodes"), ("num_nodes", "num_gpus")):
            if mine in cfg and theirs not in cfg:
                merged.pop(theirs, None)
    merged.update({k: v for k, v in cfg.items() if k != "preset"})
    d = merged
    if "gpu" not in d:
        raise ConfigError("cluster.gpu", None, "required (e.g. 'H100-SXM'), or give a preset")
    gpu = get_gpu_spec(d["gpu"])
    gph = _int(d, "gpus_per_host", 8)
    if "num_gpus" in d and "num_nodes" in d:
        raise ConfigError("cluster.num_gpus", d["num_gpus"], "give num_nodes or num_gpus, not both")
    if "num_gpus" in d:
        ng = _int(d, "num_gpus")
        if ng % gph:
            raise ConfigError("cluster.num_gpus", ng, f"must be divisible by gpus_per_host = {gph}")
        num_nodes = ng // gph
    else:
        num_nodes = _int(d, "num_nodes", 1)
    nics = _int(d, "nics_per_host", 8 if gph >= 8 else gph, minimum=0)
    if "nic_bandwidth" in d:
        nic_bw = parse_bandwidth(d["nic_bandwidth"], "cluster.nic_bandwidth")
    elif "nic" not in d and gpu.nic_bandwidth_bytes_per_s:
        nic_bw = gpu.nic_bandwidth_bytes_per_s
    else:
        nic_bw = get_nic_spec(d.get("nic", "ndr")).bandwidth_bytes_per_s
    xr = d.get("xrack_bandwidth_per_host")
    routing = d.get("routing", "dmodk")
    if routing not in ROUTING_POLICIES:
        raise ConfigError("cluster.routing", routing, f"must be one of {', '.join(ROUTING_POLICIES)}")
    over = d.get("oversubscription", 1.0)
    if isinstance(over, bool) or not isinstance(over, (int, float)) or not over > 0:
        raise ConfigError("cluster.oversubscription", over, "must be a positive number (downlink:uplink ratio)")
    for key in ("rail_optimized", "pxn", "sharp", "nvls"):
        if key in d and not isinstance(d[key], bool):
            raise ConfigError(f"cluster.{key}", d[key], "must be true or false")
    return ClusterSpec(
        name=str(d.get("name", "custom")), gpu=gpu, num_nodes=num_nodes, gpus_per_host=gph,
        # a job smaller than the preset's NVLink domain (16 trays of an NVL72 rack) has all of
        # its GPUs in one domain of its own size
        nvlink_domain_size=min(_int(d, "nvlink_domain_size", gpu.nvlink_domain_size), gph * num_nodes),
        nvlink_bandwidth_bytes_per_s=parse_bandwidth(d.get("nvlink_bandwidth", gpu.nvlink_bandwidth_bytes_per_s),
                                                     "cluster.nvlink_bandwidth"),
        nics_per_host=nics, nic_bandwidth_bytes_per_s=nic_bw,
        pcie_bandwidth_bytes_per_s=parse_bandwidth(
            d.get("pcie_bandwidth", active_value("topologies.specs.PCIE_BANDWIDTH", PCIE_BANDWIDTH)[gpu.generation]),
            "cluster.pcie_bandwidth"),
        hosts_per_leaf=_int(d, "hosts_per_leaf", 32), rail_optimized=bool(d.get("rail_optimized", True)),
        oversubscription=float(over), num_spines=_int(d, "num_spines", None),
        hosts_per_rack=_int(d, "hosts_per_rack", None),
        xrack_bandwidth_per_host_bytes_per_s=None if xr is None else parse_bandwidth(xr, "cluster.xrack_bandwidth_per_host"),
        num_cores=_int(d, "num_cores", 1), xrack_latency_s=parse_time(d.get("xrack_latency", _link_latency()[Tier.XRACK]),
                                                                    "cluster.xrack_latency"),
        routing=routing, pxn=bool(d.get("pxn", True)), sharp=bool(d.get("sharp", False)),
        seed=_int(d, "seed", 0, minimum=0), nvls=bool(d.get("nvls", True)), scaleup_topology=gpu.scaleup_topology,
    )


def domain_that_divides(num_gpus: int, gpus_per_host: int, domain: int) -> int:
    """The largest NVLink domain of whole hosts, at most ``domain`` GPUs, that divides
    ``num_gpus`` (how a scheduler fills racks evenly: 128 GPUs on NVL72 racks run as two
    domains of 64)."""
    return max((k for k in range(gpus_per_host, min(domain, num_gpus) + 1, gpus_per_host) if num_gpus % k == 0),
               default=gpus_per_host)


SIZE_BUDGET_GPUS = 131_072
"""The largest cluster clustersim builds: 16,384 8-GPU hosts (1.06 M links, about 0.5 s and
0.13 GB for the link table).  Larger requests are refused before any graph is built, with the
estimate of what they would cost (:func:`graph_estimate`)."""

_LINKS_PER_GPU, _BYTES_PER_LINK, _SECONDS_PER_LINK = 133_120 / 16_384, 16 * 2**20 / 133_120, 0.06 / 133_120
"""Measured on ``h100-16k`` (16,384 GPUs, 133,120 links): 16 MiB at the peak and 0.05-0.06 s to
build its link table on a 2-core machine (benchmarks/bench_routing.py)."""


def graph_estimate(num_gpus: int) -> tuple[int, float, float]:
    """(links, bytes, seconds) to build the graph of a ``num_gpus`` cluster, scaled linearly
    from the measured ``h100-16k`` build."""
    links = int(num_gpus * _LINKS_PER_GPU)
    return links, links * _BYTES_PER_LINK, links * _SECONDS_PER_LINK


def check_size(spec: ClusterSpec) -> None:
    """Refuse a cluster over :data:`SIZE_BUDGET_GPUS`, naming what it would cost."""
    if spec.num_gpus > SIZE_BUDGET_GPUS:
        links, nbytes, secs = graph_estimate(spec.num_gpus)
        raise ConfigError("cluster", f"{spec.num_gpus:,} GPUs",
                          f"over the size budget of {SIZE_BUDGET_GPUS:,} GPUs (num_nodes x gpus_per_host): its "
                          f"graph alone would have about {links / 1e6:.1f} M links and take about "
                          f"{nbytes / 2**30:.0f} GB and {secs:.0f} s to build")


MESH_MAX_DOMAIN = 32
"""Largest full-mesh scale-up domain built (32 GPUs: 992 links); xGMI meshes have 8."""


def _validate(spec: ClusterSpec) -> None:
    check_size(spec)
    gph, dom, nics = spec.gpus_per_host, spec.nvlink_domain_size, spec.nics_per_host
    if dom % gph and gph % dom:
        raise ConfigError("cluster.nvlink_domain_size", dom,
                          f"must be a multiple or a divisor of gpus_per_host = {gph}")
    if spec.num_gpus % dom:
        fit = domain_that_divides(spec.num_gpus, gph, dom)
        raise ConfigError("cluster.nvlink_domain_size", dom,
                          f"must divide the GPU count {spec.num_gpus} (num_nodes x gpus_per_host); "
                          f"the largest that does and fits is {fit} (e.g. 16 trays of each NVL72 rack: 64)")
    if spec.scaleup_topology == "mesh" and dom > MESH_MAX_DOMAIN:
        raise ConfigError("cluster.nvlink_domain_size", dom,
                          f"a full-mesh scale-up domain has a link per GPU pair: at most {MESH_MAX_DOMAIN} GPUs")
    if nics and gph % nics:
        raise ConfigError("cluster.nics_per_host", nics, f"must divide gpus_per_host = {gph}")
    if nics == 0 and spec.num_gpus > dom:
        raise ConfigError("cluster.nics_per_host", 0,
                          f"GPU gpu{dom} has no path to gpu0: more than one NVLink domain needs NICs")
    if spec.hosts_per_rack is not None:
        if spec.num_nodes % spec.hosts_per_rack:
            raise ConfigError("cluster.hosts_per_rack", spec.hosts_per_rack,
                              f"must divide num_nodes = {spec.num_nodes}")
        if spec.num_nodes > spec.hosts_per_rack and spec.xrack_bandwidth_per_host_bytes_per_s is None:
            raise ConfigError("cluster.xrack_bandwidth_per_host", None,
                              "required when the cluster has more than one rack")
        if (dom // gph) > 1 and spec.hosts_per_rack % (dom // gph):
            raise ConfigError("cluster.hosts_per_rack", spec.hosts_per_rack,
                              f"must hold whole NVLink domains ({dom // gph} hosts each)")


class Cluster:
    """A built cluster: graph, GPUs in placement order, link arrays, structural routes.

    Attributes
    ----------
    spec : ClusterSpec
    table : topologies.builders.GraphTable
        Nodes and links as arrays; ``graph`` (an ``nx.DiGraph``), ``link_nodes`` and
        ``link_id`` are built from it on first use.
    gpus : tuple[str, ...]
        GPU node names; GPU ``g`` is ``gpus[g]`` (placement order: host-major).
    link_capacity, link_latency : numpy.ndarray
        Per link id: bytes/s (one direction) and seconds.
    link_tier : numpy.ndarray
        Per link id: index into :data:`topologies.specs.TIERS`.
    link_nodes : list[tuple[str, str]]
        Per link id: (source node, destination node).
    """

    def __init__(self, spec: ClusterSpec, table: builders.GraphTable):
        self.spec = spec
        self.table = table
        self.gpu = spec.gpu
        self.num_gpus = spec.num_gpus
        self.gpus = tuple(f"gpu{i}" for i in range(self.num_gpus))
        self.gpus_per_host = spec.gpus_per_host
        self.nics_per_host = spec.nics_per_host
        self.nvlink_domain_size = spec.nvlink_domain_size
        self.num_hosts = spec.num_nodes
        self.link_capacity = table.capacity
        self.link_latency = table.latency
        self.link_tier = table.tier
        self.num_links = int(table.src.size)
        if self.nics_per_host:
            per = self.gpus_per_host // self.nics_per_host
            g = np.arange(self.num_gpus)
            self._nic = ((g // self.gpus_per_host) * self.nics_per_host + (g % self.gpus_per_host) // per).tolist()
            self._rail = [n % self.nics_per_host for n in self._nic]
        else:
            self._nic = self._rail = [-1] * self.num_gpus
        from .routing import Router  # local: routing imports Cluster for typing only
        self.router = Router(self)

    # -- names (built on first use: a 131,072-GPU cluster's graph is 1.06 M edges) ----------
    @functools.cached_property
    def graph(self) -> nx.DiGraph:
        """The cluster as an ``nx.DiGraph`` (see :mod:`topologies.builders`)."""
        return self.table.graph()

    @functools.cached_property
    def link_nodes(self) -> list[tuple[str, str]]:
        """Per link id: (source node, destination node)."""
        nm = self.table.names
        return [(nm[u], nm[v]) for u, v in zip(self.table.src.tolist(), self.table.dst.tolist())]

    @functools.cached_property
    def link_id(self) -> dict[tuple[str, str], int]:
        """(source node, destination node) -> link id."""
        return {uv: i for i, uv in enumerate(self.link_nodes)}

    # -- structure --------------------------------------------------------------------------
    def host_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_host

    def domain_of(self, gpu: int) -> int:
        return gpu // self.nvlink_domain_size

    def nic_of(self, gpu: int) -> int:
        """Global index of the NIC affine to ``gpu`` (-1 when hosts have no NIC)."""
        return self._nic[gpu]

    def rail_of(self, gpu: int) -> int:
        return self._rail[gpu]

    def route(self, src: int, dst: int, *, pxn: bool | None = None, flow_key: int = 0):
        """Route from GPU ``src`` to GPU ``dst`` under the cluster's policy (see Router.route)."""
        return self.router.route(src, dst, pxn=pxn, flow_key=flow_key)

    def perturbed(self, *, capacity_factor=None, extra_latency_s=None, failed_links=(),
                  failover=None) -> "Cluster":
        """A copy of this cluster with degraded or failed links (what-ifs).

        Parameters
        ----------
        capacity_factor : numpy.ndarray, optional
            Per link id: multiplies the link's bandwidth (0.5 = half).
        extra_latency_s : numpy.ndarray, optional
            Per link id: seconds added to the link's latency.
        failed_links : iterable of int
            Link ids that carry nothing: routes avoid them (:mod:`topologies.routing`).
        failover : sequence of int, optional
            Per GPU: the GPU whose NIC carries its scale-out traffic (itself unless its NIC
            failed and ``nic_failover: pxn`` moves it to a same-host peer).

        The graph and spec are shared with this cluster; the link arrays and the router
        (with its route caches) are new.
        """
        import copy
        from .routing import Router
        c = copy.copy(self)
        if capacity_factor is not None:
            c.link_capacity = self.link_capacity * np.asarray(capacity_factor, dtype=float)
        if extra_latency_s is not None:
            c.link_latency = self.link_latency + np.asarray(extra_latency_s, dtype=float)
        c.router = Router(c)
        failed = np.zeros(self.num_links, dtype=bool)
        failed[list(failed_links)] = True
        if failed.any():
            c.router.link_failed = failed
        if failover is not None:
            c.router.failover = np.asarray(failover, dtype=np.int64)
        return c

    def summary(self) -> str:
        s = self.spec
        n_kind = {k: self.table.count(k) for k in self.table.kinds if self.table.count(k)}
        racks = 1 if s.hosts_per_rack is None else s.num_nodes // s.hosts_per_rack
        lines = [
            f"cluster {s.name}: {self.num_gpus} x {s.gpu.name} in {s.num_nodes} hosts "
            f"({s.gpus_per_host} GPUs, {s.nics_per_host} NICs each), "
            f"{'scale-up mesh' if s.scaleup_topology == 'mesh' else 'NVLink domain'} {s.nvlink_domain_size}, "
            f"{racks} rack(s)",
            f"  {_scaleup_words(s)}, NIC {fmt_bw(s.nic_bandwidth_bytes_per_s)}, "
            f"PCIe {fmt_bw(s.pcie_bandwidth_bytes_per_s)}, oversubscription {s.oversubscription:g}:1, "
            f"{'rail-optimised' if s.rail_optimized else 'not rail-optimised'}, routing {s.routing}"
            + (f", cross-rack {fmt_bw(s.xrack_bandwidth_per_host_bytes_per_s)}/host"
               if s.xrack_bandwidth_per_host_bytes_per_s else ""),
            "  nodes: " + ", ".join(f"{v} {k}" for k, v in sorted(n_kind.items())) + f"; {self.num_links} links",
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Cluster({self.spec.name!r}, {self.num_gpus} GPUs)"


def _scaleup_words(s: ClusterSpec) -> str:
    if s.scaleup_topology == "mesh":
        return f"scale-up full mesh, {fmt_bw(s.nvlink_bandwidth_bytes_per_s)} per link per direction"
    return f"NVLink {fmt_bw(s.nvlink_bandwidth_bytes_per_s)}/GPU"


def build_cluster(cfg: dict | str | ClusterSpec | None = None, **overrides) -> Cluster:
    """Build a :class:`Cluster` from a preset name, a mapping or a ClusterSpec.

    >>> c = build_cluster("dgx-h100", num_nodes=2)
    >>> c.num_gpus, c.nvlink_domain_size
    (16, 8)
    """
    if isinstance(cfg, ClusterSpec):
        spec = dataclasses.replace(cfg, **overrides) if overrides else cfg
    else:
        if cfg is None:
            cfg = {}
        if isinstance(cfg, str):
            cfg = {"preset": cfg}
        spec = spec_from_mapping({**cfg, **overrides})
    _validate(spec)
    return Cluster(spec, cluster_table(spec))


def checked_spec(cfg: dict | str) -> ClusterSpec:
    """The validated spec of a cluster mapping, without building its graph: what a scenario
    checks its degrees against before paying for the graph."""
    spec = spec_from_mapping(cfg)
    _validate(spec)
    return spec


def cluster_table(spec: ClusterSpec) -> builders.GraphTable:
    """The graph of ``spec`` as a link table: NVLink domains, NICs, leaf/spine pods, cross-rack core."""
    g = builders.GraphTable()
    build = builders.mesh_domains if spec.scaleup_topology == "mesh" else builders.nvlink_domains
    build(g, spec.num_nodes, spec.gpus_per_host, spec.nvlink_domain_size, spec.nvlink_bandwidth_bytes_per_s)
    if spec.nics_per_host == 0 or spec.num_gpus <= spec.nvlink_domain_size and spec.num_nodes == 1:
        if spec.nics_per_host:
            builders.host_nics(g, spec.num_nodes, spec.gpus_per_host, spec.nics_per_host,
                               spec.pcie_bandwidth_bytes_per_s)
        return g.finish()
    builders.host_nics(g, spec.num_nodes, spec.gpus_per_host, spec.nics_per_host, spec.pcie_bandwidth_bytes_per_s)
    rack = spec.hosts_per_rack or spec.num_nodes
    num_pods = spec.num_nodes // rack
    hpl = min(spec.hosts_per_leaf, rack)
    if rack % hpl:
        raise ConfigError("cluster.hosts_per_leaf", spec.hosts_per_leaf, f"must divide the hosts per rack ({rack})")
    ports = hpl * (1 if spec.rail_optimized else spec.nics_per_host)
    spines = spec.num_spines or max(1, int(round(ports / spec.oversubscription)))
    for p in range(num_pods):
        builders.leaf_spine(g, p, range(p * rack, (p + 1) * rack), spec.nics_per_host, spec.nic_bandwidth_bytes_per_s,
                            hpl, spec.rail_optimized, spec.oversubscription, spines)
    if num_pods > 1:
        builders.cross_rack_core(g, num_pods, spines, spec.num_cores,
                                 spec.xrack_bandwidth_per_host_bytes_per_s * rack, spec.xrack_latency_s)
    return g.finish()
