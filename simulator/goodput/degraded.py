"""Slow GPUs that persist until detected (``RunModel.slow_rate_per_hour`` > 0).

At ``slow_rate_per_hour`` per GPU-hour a GPU turns slow: a synchronous step waits for its
slowest rank, so the whole job computes at ``1 / slow_factor`` of its speed (the wall time
this adds to kept work is ``degraded``).  The GPU stays slow, through checkpoints and through
restarts for other causes, until it is detected ``detect_s`` after it turned slow; detection
is then handled as a hardware failure of cause ``slow_gpu`` (the segment in progress is lost,
the node is swapped, the job restarts).  A second GPU turning slow while one is undetected
changes nothing (the job already runs at the slow speed) and is not counted.  Checkpoint
writes and restarts run at full speed.
"""

from __future__ import annotations

from .model import FailureCause, RunModel, RunOutcome, SparePool
from .rated import RatedJob

__all__ = ["SlowGpus", "SLOW_CAUSE"]

SLOW_CAUSE = FailureCause("slow_gpu", "hardware", "gpu", 0.0)
"""The failure a detected slow GPU is handled as (its rate is ``slow_rate_per_hour``)."""


class SlowGpus(RatedJob):
    """The job's speed (1, or ``1 / slow_factor`` while a slow GPU is undetected), the
    process that turns GPUs slow and detects them, and the job that computes at that speed."""

    def __init__(self, env, model: RunModel, out: RunOutcome, pool: SparePool, rng, strike):
        self.env, self.model, self.out, self.pool, self.rng = env, model, out, pool, rng
        self.strike = strike
        self.slow = False
        self.computing = False
        self.job = None

    @property
    def rate(self) -> float:
        return 1.0 / self.model.slow_factor if self.slow else 1.0

    def start(self):
        self.job = self.env.process(self._job())
        self.env.process(self._slowdowns())
        return self.job

    def _slowdowns(self):
        lam = self.model.slow_rate_per_hour * self.model.num_gpus / 3600.0
        while self.job.is_alive:
            yield self.env.timeout(self.rng.exponential(1.0 / lam))
            if not self.job.is_alive:
                return
            if self.slow:
                continue
            self._set(True)
            yield self.env.timeout(self.model.detect_s)
            self._set(False)
            struck = self.strike(SLOW_CAUSE)
            if struck is None:
                return
            self.out.interruptions[SLOW_CAUSE.name] += int(struck)

    def _set(self, slow: bool) -> None:
        self.slow = slow
        self.speed_changed()
