"""A job whose speed changes while it runs: the part slow GPUs (:mod:`.degraded`) and
data-parallel replicas (:mod:`.replicas`) share.

A subclass gives :attr:`RatedJob.rate` (the fraction of full speed, 0 while nothing can
train) and interrupts the job with :data:`RATE` when it changes; the job then continues the
segment at the new speed.  Wall time beyond the segment's full-speed time is counted as
``degraded``.  Any other interrupt is a failure: the segment is lost and the job restarts.
"""

from __future__ import annotations

import simpy

from .model import _lose, _restart

__all__ = ["RatedJob", "RATE"]

RATE = "rate"
"""The interrupt cause that says the job's speed changed (not a failure)."""


class RatedJob:
    """Segments of work at :attr:`rate`, each followed by a checkpoint (set ``env``, ``model``,
    ``out``, ``pool``, ``computing`` and ``job`` in the subclass)."""

    @property
    def rate(self) -> float:
        raise NotImplementedError

    def speed_changed(self) -> None:
        """Tell a computing job that :attr:`rate` changed."""
        if self.computing and self.job.is_alive:
            self.job.interrupt(RATE)

    def _on_rollback(self) -> None:
        """What a failure resets besides the lost segment (nothing by default)."""

    def _compute(self, seg: float):
        """``seg`` seconds of full-speed work at the current rate; returns the wall time the
        lower speed added."""
        done, degraded = 0.0, 0.0
        while done < seg:
            rate, t0 = self.rate, self.env.now
            try:
                if rate > 0:
                    yield self.env.timeout((seg - done) / rate)
                    degraded += (self.env.now - t0) * (1.0 - rate)
                    return degraded
                yield self.env.event()          # nothing can train: wait for the speed to change
            except simpy.Interrupt as e:
                if e.cause != RATE:
                    raise
                dt = self.env.now - t0
                done += dt * rate
                degraded += dt * (1.0 - rate)
        return degraded

    def _checkpoint(self):
        """The checkpoint write; speed changes do not stop it, failures do."""
        left = self.model.checkpoint_s
        while left > 0:
            t0 = self.env.now
            try:
                yield self.env.timeout(left)
                return
            except simpy.Interrupt as e:
                if e.cause != RATE:
                    raise
                left -= self.env.now - t0

    def _job(self):
        out, model, env = self.out, self.model, self.env
        remaining = model.work_s
        while remaining > 0:
            seg = min(model.interval, remaining)
            start, ck_start = env.now, None
            self.computing = True
            try:
                degraded = yield from self._compute(seg)
                ck_start = env.now
                yield from self._checkpoint()
            except simpy.Interrupt as e:
                self.computing = False
                _lose(out, env.now, start, ck_start, ck_start - start if ck_start is not None else 0.0)
                self._on_rollback()
                yield from _restart(env, out, model, self.pool, e.cause)
                continue
            self.computing = False
            remaining -= seg
            out.time_s["productive"] += seg
            out.time_s["degraded"] += degraded
            out.time_s["checkpoint"] += model.checkpoint_s
