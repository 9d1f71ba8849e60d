"""Asynchronous checkpoint writes (``RunModel.async_write_s`` set).

At the end of each segment the job blocks only for ``checkpoint_s``, the copy of its state
from device to host memory; the write from host to storage then runs in the background for
``async_write_s`` while the next segment computes.  The checkpoint is usable only once its
write completes: a failure before then loses the write, and the job rolls back to the last
checkpoint whose write completed (the work of every segment since then is lost).

A checkpoint falls due while the previous write is still running (a write longer than the
interval): it is skipped (no copy, no write) and the job computes on; the next checkpoint due
after the write completes is taken.  The run ends once its last checkpoint's write completes
(the trained state is on storage); that wait counts as checkpoint time.

With ``async_write_s = 0`` every checkpoint is usable when its copy ends: the plain model with
``C`` the copy time, whose expected wall time is Daly's.
"""

from __future__ import annotations

import simpy

from .model import RunModel, RunOutcome, SparePool, _restart

__all__ = ["async_job"]


class _Pending:
    """Work since the last usable checkpoint: ``segs`` of (work, copy seconds) not yet
    usable, and the write in flight (its end time and the segments it makes usable)."""

    def __init__(self):
        self.segs: list = []
        self.write_end = None
        self.write_covers = 0

    def settle(self, now: float, out: RunOutcome) -> float:
        """The write done by ``now`` makes its segments usable; returns the work they add."""
        if self.write_end is None or self.write_end > now:
            return 0.0
        kept = self.segs[:self.write_covers]
        del self.segs[:self.write_covers]
        self.write_end, self.write_covers = None, 0
        for work, copy in kept:
            out.time_s["productive"] += work
            out.time_s["checkpoint"] += copy
        return sum(w for w, _ in kept)

    def lose(self, out: RunOutcome) -> float:
        """A failure: every segment not yet usable is lost; returns their work."""
        for work, copy in self.segs:
            out.time_s["lost_work"] += work
            out.time_s["lost_checkpoint"] += copy
        lost = sum(w for w, _ in self.segs)
        self.segs, self.write_end, self.write_covers = [], None, 0
        return lost


def _wait(env, out: RunOutcome, until: float):
    """Block until the write in flight ends (checkpoint time once it does)."""
    t0 = env.now
    yield env.timeout(until - env.now)
    out.time_s["checkpoint"] += env.now - t0


def async_job(env, model: RunModel, out: RunOutcome, interval_s: float, pool: SparePool):
    """Segments of work, each followed by a blocking copy and a background write (or none,
    while the previous write runs); a failure rolls back to the last completed write."""
    p = _Pending()
    saved = done = 0.0     # work covered by usable checkpoints; work computed, usable or not
    while True:
        saved += p.settle(env.now, out)
        if saved >= model.work_s:
            return
        t0, phase = env.now, "lost_work"
        try:
            if done < model.work_s:
                seg = min(interval_s, model.work_s - done)
                yield env.timeout(seg)
                p.segs.append([seg, 0.0])
                done += seg
                saved += p.settle(env.now, out)
                if done < model.work_s and p.write_end is not None:
                    continue                    # the previous write still runs: skip this checkpoint
            t0, phase = env.now, "lost_checkpoint"
            if p.write_end is not None:         # the last checkpoint waits for the write in flight
                yield from _wait(env, out, p.write_end)
                saved += p.settle(env.now, out)
                t0 = env.now
            yield env.timeout(model.checkpoint_s)
            p.segs[-1][1] += model.checkpoint_s
            p.write_end, p.write_covers = env.now + model.async_write_s, len(p.segs)
            if done >= model.work_s:
                t0 = env.now
                yield from _wait(env, out, p.write_end)
        except simpy.Interrupt as e:
            saved += p.settle(env.now, out)
            out.time_s[phase] += env.now - t0
            p.lose(out)
            done = saved
            yield from _restart(env, out, model, pool, e.cause)
