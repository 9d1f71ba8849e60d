"""What-ifs applied to one run: the perturbed cluster, per-rank compute hooks, fold colours
and the failed NICs that stop a job.

The ``whatif:`` section itself -- its keys, their parsing and their checks against a
cluster -- is :mod:`simulator.scenario.whatif`, whose docstring says what each what-if
models.  This module is where the engine applies them.
"""

from __future__ import annotations

import math

import numpy as np

from topologies import ConfigError
from workloads.ops import OpKind

from ..scenario.whatif import SEED_TAG, WhatIf, link_ids, nic_links, nic_name

__all__ = ["Perturbation", "JobStopped", "expected_max_lognormal"]


class JobStopped(RuntimeError):
    """The job stopped: a failed NIC was needed and no failover was configured."""

    def __init__(self, time_s: float, nic: str, gpus: tuple):
        # args are the fields (simpy re-creates a process's exception from its args)
        super().__init__(time_s, nic, tuple(gpus))
        self.time_s, self.nic, self.gpus = time_s, nic, tuple(gpus)
        self.steps_completed: int | None = None
        """Steps every cell had finished when the job stopped (set by the run)."""
        self.num_steps: int | None = None
        """Steps the run was to simulate (set by the run)."""

    def progress(self) -> str:
        """``"1 of 3 steps had completed"``, or "" when the run did not say."""
        if self.steps_completed is None:
            return ""
        return f"{self.steps_completed} of {self.num_steps} steps had completed"

    def __str__(self) -> str:
        gl = ", ".join(f"gpu{g}" for g in self.gpus)
        return (f"job stopped at t = {self.time_s:.6g} s: NIC {self.nic} ({gl}) failed and a transfer needs it; "
                "set whatif.nic_failover: pxn to route around it")


def expected_max_lognormal(n: int, mu: float = 0.0, sigma: float = 1.0) -> float:
    """E[max of n independent lognormal(mu, sigma) draws] = integral of exp(mu + sigma z)
    n phi(z) Phi(z)^(n-1) dz, by the trapezoidal rule on z in [-12, 12] (relative error
    below 1e-9 for n <= 1e6 and sigma <= 2)."""
    z = np.linspace(-12.0, 12.0, 48_001)
    phi = np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    dens = n * phi * cdf ** (n - 1)
    y = np.exp(mu + sigma * z) * dens
    return float(np.sum((y[1:] + y[:-1]) * 0.5 * np.diff(z)))


class Perturbation:
    """A :class:`WhatIf` applied to one run: the perturbed cluster, each rank's compute
    hooks and fold colour, and the failed NICs to watch.

    ``gpu_of`` maps ranks to GPUs (after ``placement``); ``ops_of(rank)`` is the rank's op
    list (op-scope jitter draws one value per op index).
    """

    def __init__(self, wi: WhatIf, cluster, world_size: int, gpu_of, seed: int, num_steps: int,
                 compute_scale: dict | None = None):
        self.wi = wi
        self.base_cluster = cluster
        self.num_steps = num_steps
        self.seed = seed
        self.gpu_of = gpu_of
        n_gpu = cluster.num_gpus
        # compute factor per rank: compute_scale (by rank) x slow_ranks x slow_gpus (by GPU)
        self.factor = {}
        for r, f in (compute_scale or {}).items():
            self.factor[int(r)] = self.factor.get(int(r), 1.0) * float(f)
        for r, f in wi.slow_ranks.items():
            self.factor[r] = self.factor.get(r, 1.0) * f
        if wi.slow_gpus:
            rank_of = {gpu_of(r): r for r in range(world_size)}
            for g, f in wi.slow_gpus.items():
                if g in rank_of:
                    self.factor[rank_of[g]] = self.factor.get(rank_of[g], 1.0) * f
        # step-scope jitter draws: per entry, (steps x units) factor and stall matrices
        self._step_draws = []
        for j, e in enumerate(wi.jitter):
            if e.scope == "op":
                self._step_draws.append(None)
                continue
            units = n_gpu if e.scope == "gpu_step" else cluster.num_hosts
            rng = np.random.default_rng([seed, SEED_TAG, j])
            if e.dist == "lognormal":
                mult = np.exp(e.params[0] + e.params[1] * rng.standard_normal((num_steps, units)))
                add = np.zeros((num_steps, units))
            else:
                mult = np.ones((num_steps, units))
                add = np.where(rng.random((num_steps, units)) < e.params[0], e.params[1], 0.0)
            self._step_draws.append((mult, add))
        self.cluster = self._perturb_cluster(cluster) if wi.touches_network else cluster
        self.watch = self._watch_list(cluster)

    # -- network ---------------------------------------------------------------------------------
    def _perturb_cluster(self, cluster):
        wi = self.wi
        nl = cluster.num_links
        cap = np.ones(nl)
        lat = np.zeros(nl)
        for c in wi.degraded_links:
            ids = link_ids(cluster, c.nodes, "whatif.degraded_links")
            cap[ids] *= c.bandwidth_factor
            lat[ids] += c.extra_latency_s
        for g, f in sorted(wi.slow_nics.items()):
            k = cluster.nic_of(g)
            if k < 0:
                raise ConfigError("whatif.slow_gpus", g, "this GPU's host has no NIC")
            _, port, _, _ = nic_links(cluster, cluster.router.nic_names[k], "whatif.slow_gpus")
            cap[port] /= f
        for c in wi.degraded_nics:
            _, port, _, _ = nic_links(cluster, c.nic, "whatif.degraded_nics")
            cap[port] *= c.bandwidth_factor
            lat[port] += c.extra_latency_s
        failed = []
        for nodes in wi.failed_links:
            failed += link_ids(cluster, nodes, "whatif.failed_links")
        failover = None
        if wi.failed_nics and wi.nic_failover == "pxn":
            failover = self._failover(cluster)
        return cluster.perturbed(capacity_factor=cap if (cap != 1).any() else None,
                                 extra_latency_s=lat if lat.any() else None, failed_links=failed, failover=failover)

    def _failover(self, cluster) -> list[int]:
        """Per GPU: the GPU whose NIC carries its traffic (the first GPU on the next working
        NIC of its host, in NIC order after its own)."""
        down = set()
        for j, c in enumerate(self.wi.failed_nics):
            name = nic_name(cluster, c.nic, f"whatif.failed_nics[{j}].nic")
            down.add(cluster.graph.nodes[name]["index"])
        out = list(range(cluster.num_gpus))
        per = cluster.gpus_per_host // max(cluster.nics_per_host, 1)
        k_host = cluster.nics_per_host
        for g in range(cluster.num_gpus):
            k = cluster.nic_of(g)
            if k not in down:
                continue
            h = cluster.host_of(g)
            peer = None
            for step in range(1, k_host):
                k2 = h * k_host + (k % k_host + step) % k_host
                if k2 not in down:
                    peer = h * cluster.gpus_per_host + (k2 % k_host) * per
                    break
            if peer is None:
                raise ConfigError("whatif.nic_failover", "pxn",
                                  f"gpu{g} has no working NIC left on host {h} to fail over to")
            if cluster.domain_of(peer) != cluster.domain_of(g) or cluster.nvlink_domain_size == 1:
                raise ConfigError("whatif.nic_failover", "pxn",
                                  f"gpu{g}'s failover peer gpu{peer} is not in its NVLink domain")
            out[g] = peer
        return out

    def _watch_list(self, cluster) -> list:
        """Failed NICs without failover: (name, GPUs, link ids, at_s)."""
        if self.wi.nic_failover == "pxn":
            return []
        out = []
        for j, c in enumerate(self.wi.failed_nics):
            name, port, pcie, gpus = nic_links(cluster, c.nic, f"whatif.failed_nics[{j}].nic")
            out.append((name, tuple(gpus), port + pcie, c.at_s))
        return out

    def link_colors(self) -> list | None:
        """A colour per physical link for folding: (latency, watched) -- capacity is
        coloured by the fold itself."""
        if not self.wi.touches_network:
            return None
        watched = np.zeros(self.cluster.num_links, dtype=bool)
        for _, _, links, _ in self.watch:
            watched[links] = True
        return [(float(a), bool(b)) for a, b in zip(self.cluster.link_latency, watched)]

    # -- compute ---------------------------------------------------------------------------------
    def _thermal_of(self, gpu: int) -> list:
        return [t for t in self.wi.thermal if t.gpus is None or gpu in t.gpus]

    def _jitter_of(self, gpu: int) -> list:
        return [(j, e) for j, e in enumerate(self.wi.jitter) if e.gpus is None or gpu in e.gpus]

    def rank_colors(self, world_size: int) -> list:
        """:meth:`rank_color` of every rank (one shared ``(1.0,)`` when no what-if touches compute)."""
        if not self.factor and not self.wi.thermal and not self.wi.jitter:
            plain = (1.0,)
            return [plain] * world_size
        return [self.rank_color(r) for r in range(world_size)]

    def rank_color(self, rank: int):
        """What the what-ifs do to ``rank``'s compute, as a hashable (equal only if equal)."""
        gpu = self.gpu_of(rank)
        parts: list = [self.factor.get(rank, 1.0)]
        for t in self._thermal_of(gpu):
            parts.append(("thermal", t.factor, t.start_s, t.start_step))
        for j, e in self._jitter_of(gpu):
            if e.scope == "op":
                parts.append(("op", j, gpu))
            else:
                u = gpu if e.scope == "gpu_step" else self.base_cluster.host_of(gpu)
                mult, add = self._step_draws[j]
                parts.append((j, mult[:, u].tobytes(), add[:, u].tobytes()))
        return tuple(parts)

    def hooks(self, rank: int, ops):
        """(factor, jitter(dur, step, op index) -> dur, thermal(dur, step, t0) -> dur) of a
        rank; the hooks are None when nothing applies."""
        gpu = self.gpu_of(rank)
        factor = self.factor.get(rank, 1.0)
        mults, adds = [], []            # (steps x ops) matrices, and (per step) vectors
        first = next((i for i, o in enumerate(ops) if o.kind == OpKind.COMPUTE and o.duration_s > 0), -1)
        n_ops = len(ops)
        for j, e in self._jitter_of(gpu):
            if e.scope == "op":
                rng = np.random.default_rng([self.seed, SEED_TAG, j, 1 + gpu])
                if e.dist == "lognormal":
                    mults.append(np.exp(e.params[0] + e.params[1] * rng.standard_normal((self.num_steps, n_ops))))
                else:
                    adds.append(np.where(rng.random((self.num_steps, n_ops)) < e.params[0], e.params[1], 0.0))
            else:
                u = gpu if e.scope == "gpu_step" else self.base_cluster.host_of(gpu)
                mult, add = self._step_draws[j]
                if e.dist == "lognormal":
                    mults.append(np.repeat(mult[:, u:u + 1], n_ops, axis=1))
                else:
                    a = np.zeros((self.num_steps, n_ops))
                    if first >= 0:
                        a[:, first] = add[:, u]
                    adds.append(a)
        jit = None
        if mults or adds:
            m = np.prod(mults, axis=0) if mults else None
            a = np.sum(adds, axis=0) if adds else None

            def jit(dur, step, idx, m=m, a=a):
                if m is not None:
                    dur = dur * m[step, idx]
                if a is not None:
                    dur = dur + a[step, idx]
                return dur
        therm_list = self._thermal_of(gpu)
        therm = None
        if therm_list:
            def therm(dur, step, t0, ts=tuple(therm_list)):
                for t in ts:
                    if t.start_step is not None:
                        if step >= t.start_step:
                            dur *= t.factor
                    elif t0 >= t.start_s:
                        dur *= t.factor
                    elif t0 + dur > t.start_s:
                        dur = (t.start_s - t0) + (t0 + dur - t.start_s) * t.factor
                return dur
        return factor, jit, therm
