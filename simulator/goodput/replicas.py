"""Data-parallel replicas as the unit of fault tolerance (``RunModel.replicas`` > 1).

A GPU or node failure takes down the replica it strikes; that replica waits for a spare if it
needs one, restarts (``restart_s``) and rejoins, while the others keep training at
``up / replicas`` of full speed.  Work is a fluid: the job's compute advances at the current
rate and is re-timed whenever a replica leaves or rejoins.  Job-wide failures (``per: job``)
roll the whole job back to its last checkpoint, as in :mod:`.model`, and bring every replica
back with the job's restart.
"""

from __future__ import annotations

from .model import NODE_TAKING_KINDS, RunModel, RunOutcome, SparePool
from .rated import RATE, RatedJob



class Replicas(RatedJob):
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
        self.job.interrupt(RATE)
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
        self.speed_changed()

    def _on_rollback(self) -> None:
        """A failure of the whole job brings every replica back with it."""
        self.generation += 1
        self.down = [False] * len(self.down)
