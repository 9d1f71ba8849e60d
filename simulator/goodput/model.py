"""The whole training run: steps, failures, checkpoints and restarts, by Monte Carlo on simpy.

A run needs ``work_s`` seconds of productive step time.  It computes in segments of
``interval_s`` and writes a checkpoint (``checkpoint_s``, blocking) at the end of each.
Failures arrive as independent Poisson processes, one per cause (:class:`FailureCause`), at
any moment: while computing, while writing a checkpoint, while restarting.  A failure loses
the segment in progress (computed work and any part-written checkpoint) and costs a restart
(``restart_s``: detection, rescheduling, process start, communicator set-up, checkpoint load,
warm-up) before the segment starts again; a failure during a restart starts the restart again.

That is the model of Daly's higher-order estimate (J. T. Daly, "A higher order estimate of
the optimum checkpoint interval for restart dumps", Future Generation Computer Systems 22,
2006): with ``M`` the job's mean time between failures, the expected wall time of ``n``
segments of ``interval_s`` is ``n M e^(R/M) (e^((interval + C)/M) - 1)``
(:func:`daly_expected_wall_s`), and its optimum interval (:func:`daly_optimal_interval_s`)
tends to Young's ``sqrt(2 C M)`` (J. W. Young, CACM 17, 1974) when ``C << M``.  The Monte
Carlo reproduces the formula (tests/simulator/test_goodput.py); what it adds is the
distribution (p50, p90), the causes and the time lost by kind.

Two options change what a failure costs:

- Hot spares (``spares``, ``repair_s``): a hardware or maintenance failure takes a node out
  of the job; it goes to repair for ``repair_s`` and then joins the spare pool.  The restart
  swaps in a ready spare; when none is ready it waits (``spare_wait``) for the next repaired
  node, and while it waits it runs nothing, so nothing of it fails.  ``spares=None``
  (unlimited) is the model above, bit for bit; so is any pool that never runs dry.  Software
  failures take no node.  With no spares at all and a repair time ``D``, each failure costs
  ``D e^(R/M) + M (e^(R/M) - 1)`` before the work resumes, and the expected wall time is
  Daly's with ``M`` replaced by ``M + D`` outside the exponentials:
  ``n e^(R/M) (e^((tau + C)/M) - 1) (M + D)`` (:func:`no_spares_expected_wall_s`).
- Data-parallel replicas as the unit of fault tolerance (``replicas`` > 1): a GPU or node
  failure takes down the one replica it strikes (each equally likely), which rejoins after its
  restart (and any wait for a spare) while the others keep training at ``up / replicas`` of
  full speed (the time lost is ``degraded``); no work is rolled back.  Job-wide causes
  (``per: job``) and failures during a whole-job restart still roll the job back to its last
  checkpoint.  With only replica failures of total rate ``L`` each replica is up a fraction
  ``1 / (1 + L R / replicas)`` of the time (an alternating renewal process: up for an
  exponential time of mean ``replicas / L``, down for ``R``), so the work takes
  ``work (1 + L R / replicas)`` plus its checkpoints; as ``R -> 0`` goodput tends to the
  checkpoint overhead alone, ``interval / (interval + C)``.

Asynchronous checkpoint writes (``async_write_s``): :mod:`.asyncckpt`.

Slow (not failed) GPUs that persist until detected (``slow_rate_per_hour``): :mod:`.degraded`.

Not modelled yet: slow links.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import simpy

from topologies import ConfigError

__all__ = ["FailureCause", "GoodputResult", "RunModel", "RunOutcome", "simulate_run", "monte_carlo", "daly_expected_wall_s",
           "daly_optimal_interval_s", "young_interval_s", "no_spares_expected_wall_s", "SparePool"]

HOUR = 3600.0
UNITS = ("gpu", "node", "job")
NODE_TAKING_KINDS = ("hardware", "maintenance")
"""Causes of these kinds take a node out of the job (to repair); software failures do not."""
KINDS = ("productive", "checkpoint", "lost_work", "lost_checkpoint", "restart", "spare_wait", "degraded")


@dataclass(frozen=True)
class FailureCause:
    """One cause of interruptions: ``rate_per_hour`` per ``per`` (a GPU, a node or the whole
    job); ``kind`` keeps hardware apart from software and maintenance."""

    name: str
    kind: str
    per: str
    rate_per_hour: float

    def __post_init__(self):
        if self.per not in UNITS:
            raise ConfigError(f"failures.{self.name}.per", self.per, f"must be one of {', '.join(UNITS)}")
        if not (isinstance(self.rate_per_hour, (int, float)) and self.rate_per_hour >= 0
                and math.isfinite(self.rate_per_hour)):
            raise ConfigError(f"failures.{self.name}.rate_per_hour", self.rate_per_hour, "must be a finite number >= 0")


@dataclass(frozen=True)
class RunModel:
    """A training run: the work, the job's size, its failure causes and its checkpoint policy."""

    work_s: float
    """Productive step time the run needs (steps x step time)."""
    num_gpus: int
    gpus_per_node: int
    causes: tuple[FailureCause, ...]
    checkpoint_s: float
    """Blocking time of one checkpoint write."""
    restart_s: float
    """Time from a failure until steps run again (detection, rescheduling, start-up, load)."""
    interval_s: float | None = None
    """Productive time between checkpoints; None: Daly's optimum for this job."""
    spares: int | None = None
    """Hot spare nodes ready at the start; None: unlimited (a failed node is always replaced at once)."""
    repair_s: float = 0.0
    """Time from a node's failure until it is back in the spare pool (only with ``spares``)."""
    replicas: int = 1
    """Data-parallel replicas that fail and rejoin independently (1: any failure stops the job)."""
    async_write_s: float | None = None
    """Asynchronous checkpoints: the background write to storage after the blocking copy
    (``checkpoint_s``); None: checkpoints are written synchronously (:mod:`.asyncckpt`)."""
    slow_rate_per_hour: float = 0.0
    """GPUs turning slow (not failing), per GPU-hour (:mod:`.degraded`)."""
    slow_factor: float = 1.0
    """How much longer a step takes while a slow GPU is undetected."""
    detect_s: float = 0.0
    """Time from a GPU turning slow until it is detected and handled as a failure."""

    def __post_init__(self):
        for name in ("work_s", "checkpoint_s", "restart_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"run.{name}", v, "must be a finite number of seconds >= 0")
        if self.work_s <= 0:
            raise ConfigError("run.work_s", self.work_s, "must be > 0")
        if self.interval_s is not None and not (self.interval_s > 0 and math.isfinite(self.interval_s)):
            raise ConfigError("run.checkpoint_interval_s", self.interval_s, "must be > 0 (or auto)")
        if self.num_gpus < 1 or self.gpus_per_node < 1:
            raise ConfigError("run.num_gpus", self.num_gpus, "must be >= 1, with gpus_per_node >= 1")
        if self.spares is not None and not (isinstance(self.spares, int) and self.spares >= 0):
            raise ConfigError("run.spares", self.spares, "must be an integer >= 0 (or None: unlimited)")
        if not (isinstance(self.repair_s, (int, float)) and math.isfinite(self.repair_s) and self.repair_s >= 0):
            raise ConfigError("run.repair_s", self.repair_s, "must be a finite number of seconds >= 0")
        if not (isinstance(self.replicas, int) and 1 <= self.replicas <= self.units("node")):
            raise ConfigError("run.replicas", self.replicas,
                              f"must be an integer from 1 to the job's {self.units('node')} nodes")

        if self.async_write_s is not None:
            if not (isinstance(self.async_write_s, (int, float)) and math.isfinite(self.async_write_s)
                    and self.async_write_s >= 0):
                raise ConfigError("run.async_write_s", self.async_write_s, "must be a finite number of seconds >= 0")
            if self.replicas > 1:
                raise ConfigError("run.async_write_s", self.async_write_s, "asynchronous checkpoints need replicas = 1")

        self._check_slow()

    def _check_slow(self) -> None:
        for name, low in (("slow_rate_per_hour", 0.0), ("slow_factor", 1.0), ("detect_s", 0.0)):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= low):
                raise ConfigError(f"run.{name}", v, f"must be a finite number >= {low:g}")
        if self.slow_rate_per_hour > 0 and (self.replicas > 1 or self.async_write_s is not None):
            raise ConfigError("run.slow_rate_per_hour", self.slow_rate_per_hour,
                              "slow GPUs are modelled with replicas = 1 and synchronous checkpoints only")

    def units(self, per: str) -> float:
        return {"gpu": self.num_gpus, "node": math.ceil(self.num_gpus / self.gpus_per_node), "job": 1}[per]

    def rates_per_s(self) -> np.ndarray:
        """Each cause's interruption rate for this job, per second."""
        return np.array([c.rate_per_hour * self.units(c.per) / HOUR for c in self.causes], dtype=float)

    @property
    def mtbf_s(self) -> float:
        """The job's mean time between interruptions (inf without failures)."""
        lam = float(self.rates_per_s().sum())
        return math.inf if lam == 0 else 1.0 / lam

    @property
    def rollback_mtbf_s(self) -> float:
        """Mean time between the failures that roll the job back to its checkpoint: all of
        them with one replica, the job-wide (``per: job``) ones with several."""
        if self.replicas == 1:
            return self.mtbf_s
        lam = sum(r for r, c in zip(self.rates_per_s(), self.causes) if c.per == "job")
        return math.inf if lam == 0 else 1.0 / lam

    @property
    def interval(self) -> float:
        """The checkpoint interval in effect (the given one, or Daly's optimum for the
        failures that roll the job back, at least an asynchronous write's time (closer
        checkpoints would be skipped), at most the whole work: one checkpoint at the end)."""
        if self.interval_s is not None:
            return float(self.interval_s)
        daly = daly_optimal_interval_s(self.checkpoint_s, self.rollback_mtbf_s)
        return min(max(daly, self.async_write_s or 0.0), float(self.work_s))


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum ``sqrt(2 C M)``."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_optimal_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum: ``sqrt(2CM) [1 + sqrt(C/2M)/3 + (C/2M)/9] - C`` for
    ``C < 2M``, else ``M``; infinite without failures."""
    if math.isinf(mtbf_s):
        return math.inf
    c, m = checkpoint_s, mtbf_s
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def daly_expected_wall_s(work_s: float, interval_s: float, checkpoint_s: float, restart_s: float,
                         mtbf_s: float) -> float:
    """Expected wall time of ``work_s / interval_s`` segments, each ``interval_s`` of work and a
    checkpoint, under exponential failures of mean ``mtbf_s`` that also strike restarts:
    ``M e^(R/M) (e^((tau + C)/M) - 1) work / tau`` (Daly 2006, eq. for T_w)."""
    m = mtbf_s
    if math.isinf(m):
        return work_s / interval_s * (interval_s + checkpoint_s)
    return m * math.exp(restart_s / m) * math.expm1((interval_s + checkpoint_s) / m) * work_s / interval_s


def no_spares_expected_wall_s(work_s: float, interval_s: float, checkpoint_s: float, restart_s: float,
                              mtbf_s: float, repair_s: float) -> float:
    """Expected wall time when every failure takes a node and no spare is kept: Daly's model
    with each restart preceded by a wait of ``repair_s`` during which nothing fails,
    ``n e^(R/M) (e^((tau + C)/M) - 1) (M + D)``; ``repair_s = 0`` is Daly's."""
    m = mtbf_s
    if math.isinf(m):
        return work_s / interval_s * (interval_s + checkpoint_s)
    return math.exp(restart_s / m) * math.expm1((interval_s + checkpoint_s) / m) * (m + repair_s) * work_s / interval_s


@dataclass
class RunOutcome:
    """One simulated run: its wall time, the interruptions by cause and the time by kind."""

    wall_s: float = 0.0
    interruptions: dict = field(default_factory=dict)
    time_s: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))

    @property
    def goodput(self) -> float:
        return self.time_s["productive"] / self.wall_s if self.wall_s else 1.0


class SparePool:
    """Hot spare nodes: ``ready`` now, and failed nodes in repair until their return times
    (first in, first out: every repair takes ``repair_s``).  Unlimited when ``spares`` is None."""

    def __init__(self, spares: int | None, repair_s: float):
        self.ready, self.repair_s = spares, repair_s
        self.returns: deque = deque()
        self.deficit = 0
        self.waiting = False
        """True while the job waits for a node: it runs nothing, so nothing of it can fail."""

    def _settle(self, now: float) -> None:
        while self.returns and self.returns[0] <= now and self.deficit == 0:
            self.returns.popleft()
            self.ready += 1

    def replace(self, now: float) -> float:
        """A node fails at ``now``: it goes to repair and a spare replaces it.  When the spare
        is there (``now`` if one is ready, else the return of the node that will fill the gap)."""
        if self.ready is None:
            return now
        self._settle(now)
        self.returns.append(now + self.repair_s)
        if self.ready > 0:
            self.ready -= 1
            return now
        # no spare ready: the job waits for the next returns not yet promised to a waiter
        self.deficit += 1
        at = self.returns[self.deficit - 1]
        return at

    def filled(self, now: float) -> None:
        """The waiters whose node has returned by ``now`` take it."""
        while self.deficit and self.returns and self.returns[0] <= now:
            self.returns.popleft()
            self.deficit -= 1
        self._settle(now)


def _plain_strike(job_of, pool: SparePool):
    """The strike of a job that any failure stops: None once it is over, False while it waits
    for a node (nothing of it runs), else it is interrupted (True)."""
    def strike(cause):
        job = job_of()
        if not job.is_alive:
            return None
        if pool.waiting:
            return False
        job.interrupt(cause)
        return True
    return strike


# -- one run -----------------------------------------------------------------------------------
def _restart(env, out: RunOutcome, model: RunModel, pool: SparePool, cause: FailureCause):
    """Wait for a replacement node if the failure took one and no spare is ready, then restart
    until it completes (a failure during the wait or the restart may take another node; one
    during the restart starts it again)."""
    need = pool.replace(env.now) if cause.kind in NODE_TAKING_KINDS else env.now
    while True:
        t0, waiting = env.now, need > env.now
        try:
            if waiting:
                pool.waiting = True
                yield env.timeout(need - env.now)
                pool.waiting = False
                out.time_s["spare_wait"] += env.now - t0
                pool.filled(env.now)
                continue
            yield env.timeout(model.restart_s)
            out.time_s["restart"] += model.restart_s
            return
        except simpy.Interrupt as e:
            out.time_s["spare_wait" if waiting else "restart"] += env.now - t0
            if e.cause.kind in NODE_TAKING_KINDS:
                need = max(need, pool.replace(env.now))


def _lose(out: RunOutcome, now: float, start: float, ck_start, seg_wall: float) -> None:
    if ck_start is None:
        out.time_s["lost_work"] += now - start
    else:
        out.time_s["lost_work"] += seg_wall
        out.time_s["lost_checkpoint"] += now - ck_start


def _job(env, model: RunModel, out: RunOutcome, interval_s: float, pool: SparePool):
    """Segments of work, each followed by a checkpoint; a failure loses the segment."""
    remaining, ckpt = model.work_s, model.checkpoint_s
    while remaining > 0:
        seg = min(interval_s, remaining)
        start, ck_start = env.now, None
        try:
            yield env.timeout(seg)
            ck_start = env.now
            yield env.timeout(ckpt)
        except simpy.Interrupt as e:
            _lose(out, env.now, start, ck_start, seg)
            yield from _restart(env, out, model, pool, e.cause)
            continue
        remaining -= seg
        out.time_s["productive"] += seg
        out.time_s["checkpoint"] += ckpt


def _failures(env, strike, rng, rates: np.ndarray, causes, out: RunOutcome):
    """Superposed Poisson processes: the next failure after an exponential wait of the total
    rate, its cause drawn in proportion to the causes' rates; ``strike(cause)`` applies it and
    says whether it interrupted anything (None once the run is over)."""
    total = float(rates.sum())
    probs = rates / total
    while True:
        yield env.timeout(rng.exponential(1.0 / total))
        cause = causes[int(rng.choice(len(causes), p=probs))]
        struck = strike(cause)
        if struck is None:
            return
        if struck:
            out.interruptions[cause.name] += 1


def simulate_run(model: RunModel, seed) -> RunOutcome:
    """One run of ``model`` on a simpy event loop, its randomness from ``seed`` (an int or a
    numpy SeedSequence): the same seed, the same run, bit for bit."""
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    out = RunOutcome(interruptions={c.name: 0 for c in model.causes})
    pool = SparePool(model.spares, model.repair_s)
    if model.replicas > 1:
        from .replicas import Replicas
        ctl = Replicas(env, model, out, pool, rng)
        job = ctl.start()
        strike = ctl.strike
    elif model.slow_rate_per_hour > 0:
        from .degraded import SLOW_CAUSE, SlowGpus
        out.interruptions[SLOW_CAUSE.name] = 0
        strike = _plain_strike(lambda: job, pool)
        job = SlowGpus(env, model, out, pool, rng, strike).start()
    else:
        if model.async_write_s is None:
            job = env.process(_job(env, model, out, model.interval, pool))
        else:
            from .asyncckpt import async_job
            job = env.process(async_job(env, model, out, model.interval, pool))
        strike = _plain_strike(lambda: job, pool)
    rates = model.rates_per_s()
    if rates.sum() > 0:
        env.process(_failures(env, strike, rng, rates, model.causes, out))
    env.run(until=job)
    out.wall_s = env.now
    return out


# -- many runs ---------------------------------------------------------------------------------
@dataclass
class GoodputResult:
    """Monte Carlo over ``runs`` seeded runs of one :class:`RunModel`."""

    model: RunModel
    seed: int
    outcomes: list

    @property
    def wall_s(self) -> np.ndarray:
        return np.array([o.wall_s for o in self.outcomes])

    def summary(self) -> dict:
        """Time to train (mean with its standard error, p50, p90), goodput, the interval used,
        mean interruptions by cause and mean time by kind."""
        w = self.wall_s
        n = len(w)
        kinds = self.outcomes[0].time_s.keys()
        return {
            "runs": n, "seed": self.seed, "work_s": self.model.work_s, "mtbf_s": self.model.mtbf_s,
            "interval_s": self.model.interval, "checkpoint_s": self.model.checkpoint_s,
            "restart_s": self.model.restart_s, "async_write_s": self.model.async_write_s,
            "wall_mean_s": float(w.mean()), "wall_sem_s": float(w.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
            "wall_p50_s": float(np.percentile(w, 50)), "wall_p90_s": float(np.percentile(w, 90)),
            "goodput": float(np.mean([o.goodput for o in self.outcomes])),
            "interruptions": {k: float(np.mean([o.interruptions[k] for o in self.outcomes]))
                              for k in self.outcomes[0].interruptions},
            "time_s": {k: float(np.mean([o.time_s[k] for o in self.outcomes])) for k in kinds},
            "daly_expected_wall_s": daly_expected_wall_s(self.model.work_s, self.model.interval,
                                                         self.model.checkpoint_s, self.model.restart_s,
                                                         self.model.mtbf_s) if self.model.replicas == 1 else None,
        }


def monte_carlo(model: RunModel, runs: int = 200, seed: int = 0) -> GoodputResult:
    """``runs`` independent runs of ``model``, run ``i`` seeded by the ``i``-th child of
    ``SeedSequence(seed)`` (so a run's randomness does not depend on how many others run)."""
    if not (isinstance(runs, int) and runs >= 1):
        raise ConfigError("runs", runs, "must be an integer >= 1")
    seeds = np.random.SeedSequence(seed).spawn(runs)
    return GoodputResult(model, seed, [simulate_run(model, s) for s in seeds])
