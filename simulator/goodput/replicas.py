"""Data-parallel replicas as the unit of fault tolerance (``RunModel.replicas`` > 1).

A GPU or node failure takes down the replica it strikes; that replica waits for a spare if it
needs one, restarts (``restart_s``) and rejoins, while the others keep training at
``up / replicas`` of full speed.  Work is a fluid: the job's compute advances at the current
rate and is re-timed whenever a replica leaves or rejoins.  Job-wide failures (``per: job``)
roll the whole job back to its last checkpoint, as in :mod:`.model`, and bring every replica
back with the job's restart.
"""

from __future__ import annotations

import simpy

from .model import NODE_TAKING_KINDS, RunModel, RunOutcome, SparePool, _lose, _restart

_RATE = "rate"
"""The interrupt that tells the job the number of replicas up has changed."""


class Replicas:
    """The replicas' states and the job process that trains on those that are up."""

    def __init__(self, env, model: RunModel, out: RunOutcome, pool: SparePool, rng):
        self.env, self.model, self.out, self.pool, self.rng = env, model, out, pool, rng
        self.down = [False] * model.replicas
        self.generation = 0
        self.computing = False
        self.job = None

    @property
    def rate(self) -> float:
        return 1.0 - sum(self.down) / len(self.down)

    def start(self):
        self.job = self.env.process(self._job())
        return self.job

    # -- failures ----------------------------------------------------------------------------
    def strike(self, cause) -> bool:
        """Apply one failure: True if it took the job or a replica down, False if it struck a
        replica already down or the job while it waits for a node, None once the job is done."""
        if not self.job.is_alive:
            return None
        if self.pool.waiting:
            return False
        if cause.per == "job" or not self.computing:
            self.job.interrupt(cause)
            return True
        i = int(self.rng.integers(len(self.down)))
        if self.down[i]:
            return False
        self.down[i] = True
        self.env.process(self._rejoin(i, cause))
        self.job.interrupt(_RATE)
        return True

    def _rejoin(self, i: int, cause):
        gen = self.generation
        t = self.env.now
        if cause.kind in NODE_TAKING_KINDS:
            t = self.pool.replace(self.env.now)
        yield self.env.timeout(t - self.env.now + self.model.restart_s)
        self.pool.filled(self.env.now)
        if gen != self.generation or not self.down[i]:
            return
        self.down[i] = False
        if self.computing and self.job.is_alive:
            self.job.interrupt(_RATE)

    # -- the job -----------------------------------------------------------------------------
    def _compute(self, seg: float):
        """``seg`` seconds of full-speed work at the current rate; returns the wall time lost
        to replicas being down."""
        done, degraded = 0.0, 0.0
        while done < seg:
            rate, t0 = self.rate, self.env.now
            try:
                if rate > 0:
                    yield self.env.timeout((seg - done) / rate)
                    degraded += (self.env.now - t0) * (1.0 - rate)
                    return degraded
                yield self.env.event()          # no replica up: wait for one to rejoin
            except simpy.Interrupt as e:
                if e.cause != _RATE:
                    raise
                dt = self.env.now - t0
                done += dt * rate
                degraded += dt * (1.0 - rate)
        return degraded

    def _checkpoint(self):
        left = self.model.checkpoint_s
        while left > 0:
            t0 = self.env.now
            try:
                yield self.env.timeout(left)
                return
            except simpy.Interrupt as e:
                if e.cause != _RATE:
                    raise
                left -= self.env.now - t0

    def _job(self):
        out, model = self.out, self.model
        remaining, interval = model.work_s, model.interval
        while remaining > 0:
            seg = min(interval, remaining)
            start, ck_start = self.env.now, None
            self.computing = True
            try:
                degraded = yield from self._compute(seg)
                ck_start = self.env.now
                yield from self._checkpoint()
            except simpy.Interrupt as e:
                self.computing = False
                _lose(out, self.env.now, start, ck_start, ck_start - start if ck_start is not None else 0.0)
                self.generation += 1
                self.down = [False] * len(self.down)
                yield from _restart(self.env, out, model, self.pool, e.cause)
                continue
            remaining -= seg
            out.time_s["productive"] += seg
            out.time_s["degraded"] += degraded
            out.time_s["checkpoint"] += model.checkpoint_s
