"""Steady-state periodicity of a program: how much of each class's op list repeats.

In the steady phase of a pipeline schedule every rank runs the same pattern of ops again
and again, ``P`` micro-batches later each time: one forward and one backward per
micro-batch under 1F1B (``P = 1``), and under interleaved 1F1B a round of ``pp``
micro-batches through every model chunk (``P = pp``: the first and last stages' chunks
differ by the embedding and the loss, so a whole round is the smallest pattern that
repeats on every stage).  :func:`periodicity` finds, per rank class, the period ``L`` (ops
per ``P`` micro-batches) and the window of the op list over which op ``i + L`` is op ``i``
moved ``P`` micro-batches on (same kind, name, layer, chunk, phase, sizes, durations,
group, issue mode and host time; the micro-batch, the micro-batch in a transfer's or an
all-to-all's tag, and the per-group sequence number move with it).

That is what an engine that advances a steady run by whole periods needs of the program,
and a bound on what it could save: a period can be skipped only where every class is
inside its window, and the state of the whole run has to be seen to repeat first, which
takes at least one period after the window opens (``skippable_ops``).  The engine does not
skip periods; ``python benchmarks/bench_periodicity.py`` prints the bound for the pinned
scale cases (docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lcm

from .ops import Op

__all__ = ["ClassPeriod", "Periodicity", "periodicity", "shifted"]


def shifted(op: Op, p: int) -> Op:
    """``op`` moved ``p`` micro-batches on: its micro-batch, and the micro-batch in a
    pipeline transfer's tag (source, destination, chunk, micro-batch, phase) or an
    all-to-all's (layer, micro-batch); its sequence number is left for the caller."""
    if op.microbatch < 0:
        return op
    tag = op.tag
    if tag is not None:
        if len(tag) == 5:
            tag = (tag[0], tag[1], tag[2], tag[3] + p, tag[4])
        elif len(tag) == 2:
            tag = (tag[0], tag[1] + p)
    return op._replace(microbatch=op.microbatch + p, tag=tag)


def _same(a: Op, b: Op, p: int) -> bool:
    # b is a moved p micro-batches on, sequence numbers aside (Op's fields: microbatch at 4,
    # seq at 11, tag at 14; compared as slices: this runs once per op of a class)
    if a[:4] != b[:4] or a[5:11] != b[5:11] or a[12:14] != b[12:14] or a[15:] != b[15:]:
        return False
    if a.microbatch < 0:
        return b.microbatch < 0 and a.tag == b.tag
    return shifted(a, p)[4::10] == b[4::10]


@dataclass(frozen=True)
class ClassPeriod:
    """One class's period: op ``i + ops`` is op ``i`` moved ``microbatches`` on for
    ``first <= i < last - ops`` (``ops == 0``: no period found)."""

    ops: int
    microbatches: int
    first: int
    last: int
    total: int

    @property
    def periods(self) -> int:
        """Whole periods inside the window."""
        return (self.last - self.first) // self.ops if self.ops else 0


@dataclass(frozen=True)
class Periodicity:
    """The classes' periods, scaled to one common number of micro-batches."""

    microbatches: int
    classes: tuple[ClassPeriod, ...]

    @property
    def skippable_periods(self) -> int:
        """Periods an engine could advance over: all classes inside their windows, less the
        two periods over which the whole state must be seen to repeat first."""
        if not self.classes or any(c.ops == 0 for c in self.classes):
            return 0
        return max(0, min(c.periods for c in self.classes) - 2)

    @property
    def skippable_ops(self) -> int:
        """Ops per step of all classes (one cell each) those periods hold."""
        return self.skippable_periods * sum(c.ops for c in self.classes)

    @property
    def total_ops(self) -> int:
        return sum(c.total for c in self.classes)


def _class_period(ops: list[Op], max_p: int) -> ClassPeriod:
    """The micro-batch shift (up to ``max_p``) under which the longest stretch of ``ops``
    repeats, in micro-batches (ties: the smaller shift), found around the op in the middle
    of the list; a stretch counts if it holds at least one whole period."""
    n = len(ops)
    mid = next((i for i in range(n // 2, n) if ops[i].microbatch >= 0), None)
    best, best_mbs = ClassPeriod(0, 0, 0, 0, n), 0.0
    if mid is None:
        return best
    for p in range(1, max_p + 1):
        # (several ops may match: a recomputed forward repeats its layer's ops)
        target = shifted(ops[mid], p)[4::10]
        for j in [j for j in range(mid + 1, n) if ops[j][4::10] == target and _same(ops[mid], ops[j], p)]:
            L = j - mid
            lo = mid
            while lo > 0 and _same(ops[lo - 1], ops[lo - 1 + L], p):
                lo -= 1
            hi = mid
            while hi + L < n and _same(ops[hi], ops[hi + L], p):
                hi += 1
            mbs = (hi + L - lo) / L * p
            if hi - lo >= L and mbs > best_mbs:
                best, best_mbs = ClassPeriod(L, p, lo, hi + L, n), mbs
        if best.last - best.first >= n // 2:
            break               # most of the list repeats: a longer shift would find no more
    return best


def periodicity(prog, max_microbatches: int | None = None) -> Periodicity:
    """Each class's steady period (:class:`ClassPeriod`), all scaled to the least common
    number of micro-batches (a period of the whole run).  ``max_microbatches``: the largest
    shift tried (default: the micro-batches per pipeline, at most 64)."""
    max_p = max_microbatches or min(64, max(1, max((o.microbatch for c in prog.classes for o in c.ops), default=0)))
    found = [_class_period(list(c.ops), max_p) for c in prog.classes]
    if any(c.ops == 0 for c in found):
        return Periodicity(0, tuple(found))
    common = lcm(*(c.microbatches for c in found))
    scaled = tuple(ClassPeriod(c.ops * (common // c.microbatches), common, c.first, c.last, c.total) for c in found)
    return Periodicity(common, scaled)
