"""A streamed timeline: per-cell summaries while the run goes, full rows only for chosen cells.

A run records one timeline row per op of every simulated cell and step.  Where little folds
(per-GPU jitter or a slow GPU on thousands of GPUs: every rank its own cell) that is tens of
millions of rows, more than memory holds.  :class:`StreamRecorder` takes the same rows as the
full recorder but keeps only what the metrics and the per-rank summaries read:

* full rows for the cells that hold the ranks asked for (``run(..., timeline_ranks=...)``,
  ``clustersim run --ranks / --stages``);
* per cell, its compute-stream ops (start, end, recompute or not) that can still fall in the
  last step's window: when a cell ends a step other than the last, everything it recorded so
  far has ended by then, hence by the end of that step over all cells, where the window of
  the last step starts, and is dropped; so are its waits that ended by then;
* per cell, the latest end of its rows in the last step (which cell finishes last);
* the executed FLOPs of each row of the last step (op FLOPs x cell size), in recording order.

Waits are kept in arrays (:class:`CompactWaits`), and the collective engine keeps no record
per call (``CollectiveEngine.keep_records``): a streamed run's memory is then mostly what is
in flight, plus about 60 bytes per op of the last step.

The metrics are then the same functions of the same numbers, summed in the same order, as
from the full timeline: bit for bit equal (a test compares the two).
"""

from __future__ import annotations

from array import array

import numpy as np

from workloads.ops import STREAM_COMPUTE, Phase

from .metrics import breakdown_of

__all__ = ["StreamRecorder", "CompactWaits", "rank_summary"]


class CompactWaits:
    """One cell's waits, (start, end, axis) as the actor appends them, in arrays: 17 bytes a
    wait instead of a tuple's 120; iterated as the tuples."""

    __slots__ = ("starts", "ends", "codes", "names", "index")

    def __init__(self, names: list, index: dict):
        self.starts, self.ends, self.codes = array("d"), array("d"), bytearray()
        self.names, self.index = names, index        # axis names and their codes, shared by all cells

    def append(self, wait) -> None:
        s, e, axis = wait
        code = self.index.get(axis)
        if code is None:
            code = self.index[axis] = len(self.names)
            self.names.append(axis)
        self.starts.append(s)
        self.ends.append(e)
        self.codes.append(code)

    def __iter__(self):
        names = self.names
        return zip(self.starts, self.ends, (names[c] for c in self.codes))

    def __len__(self) -> int:
        return len(self.ends)

    def drop_ended(self, now: float) -> None:
        """Forget the waits that ended by ``now``."""
        keep = [i for i, e in enumerate(self.ends) if e > now]
        if len(keep) < len(self.ends):
            self.starts = array("d", (self.starts[i] for i in keep))
            self.codes = bytearray(self.codes[i] for i in keep)
            self.ends = array("d", (self.ends[i] for i in keep))


class StreamRecorder:
    """Records as :class:`~simulator.engine.simulate._Recorder` does, keeping full rows only
    for the cells in ``keep`` and the summaries of every cell (module docstring)."""

    def __init__(self, sizes, n_steps: int, keep, waits: dict):
        """``waits``: the run's cell -> waits, whose lists this replaces with :class:`CompactWaits`."""
        n = len(sizes)
        names, index = [], {}
        for c in waits:
            waits[c] = CompactWaits(names, index)
        self.rows: list[tuple] = []
        self.keep = np.zeros(n, dtype=bool)
        self.keep[list(keep)] = True
        self.keep = self.keep.tolist()
        self.sizes = [int(s) for s in sizes]
        self.last = n_steps - 1
        self.waits = waits
        self.n_rows = 0
        self.starts = [array("d") for _ in range(n)]
        self.ends = [array("d") for _ in range(n)]
        self.recompute = [bytearray() for _ in range(n)]
        self.end_max = [-np.inf] * n
        self.flops = array("d")

    def add(self, rank, node, stream, op, axis, start, end, step, cid):
        self.n_rows += 1
        if self.keep[cid]:
            self.rows.append((op, rank, node, stream, axis, start, end, step, cid))
        if step == self.last:
            self.flops.append(op.flops * self.sizes[cid])
            if end > self.end_max[cid]:
                self.end_max[cid] = end
        if stream == STREAM_COMPUTE:
            self.starts[cid].append(start)
            self.ends[cid].append(end)
            self.recompute[cid].append(op.phase == Phase.R)

    def step_done(self, cid: int, step: int, now: float) -> None:
        """Cell ``cid`` ended ``step`` at ``now``: unless it is the last, what it recorded
        that ended by ``now`` cannot fall in the last step's window (module docstring)."""
        if step >= self.last:
            return
        ends = self.ends[cid]
        if ends and max(ends) > now:
            keep = [i for i, e in enumerate(ends) if e > now]
            self.starts[cid] = array("d", (self.starts[cid][i] for i in keep))
            self.ends[cid] = array("d", (ends[i] for i in keep))
            self.recompute[cid] = bytearray(self.recompute[cid][i] for i in keep)
        else:
            self.starts[cid], self.ends[cid], self.recompute[cid] = array("d"), array("d"), bytearray()
        self.waits[cid].drop_ended(now)

    def frame(self):
        """The kept cells' full rows (:meth:`~simulator.engine.simulate._Recorder.frame`)."""
        from .simulate import _Recorder
        rec = _Recorder()
        rec.rows = self.rows
        return rec.frame()

    # -- what the metrics read (simulator.engine.metrics.summarize) ----------------------------

    def executed_flops(self) -> float:
        return float(np.frombuffer(self.flops, dtype=np.float64).sum()) if len(self.flops) else 0.0

    def last_cell(self) -> int:
        return int(np.argmax(np.asarray(self.end_max)))

    def breakdown(self, cell: int, waits, t0: float, t1: float) -> dict[str, float]:
        return breakdown_of(self.starts[cell], self.ends[cell], self.recompute[cell], waits, t0, t1)


def rank_summary(res, ranks=None):
    """Per rank (``ranks``: only these), over the last step's window: ``compute_s``,
    ``recompute_s``, ``exposed_<axis>_s``, ``host_issue_s`` and ``bubble_s`` of its compute
    stream (:func:`~simulator.engine.metrics.breakdown`: they sum to the step time), and
    ``end_s``, when its cell's last op of the step ended.  Ranks of one cell share their
    cell's figures.  The same from a streamed run as from a full one."""
    import pandas as pd
    t0, t1 = res.step_bounds[-1]
    st = res.stream
    if st is None:
        tl = res.timeline
        last = tl[tl["step"] == tl["step"].max()]
        end_max = last.groupby("cell")["end_s"].max().reindex(range(res.folding.num_cells)).to_numpy()
        comp = tl[tl["stream"] == STREAM_COMPUTE]
        at = comp.groupby("cell", sort=False).indices
        s_, e_, r_ = comp["start_s"].to_numpy(), comp["end_s"].to_numpy(), (comp["phase"].to_numpy() == Phase.R)
        empty = np.zeros(0, dtype=np.int64)
    else:
        end_max = np.asarray(st.end_max)
    wanted = None if ranks is None else set(int(r) for r in ranks)
    grid, rows = res.program.grid, []
    for cid, members in enumerate(res.folding.cells):
        chosen = [r for r in members if wanted is None or r in wanted]
        if not chosen:
            continue
        if st is None:
            i = at.get(cid, empty)
            bd = breakdown_of(s_[i], e_[i], r_[i].tolist(), res.waits[cid], t0, t1)
        else:
            bd = st.breakdown(cid, res.waits[cid], t0, t1)
        figures = {f"{k}_s": float(v) for k, v in bd.items()}
        for r in chosen:
            rows.append({"rank": r, "stage": grid.stage_of(r), "cell": cid, "end_s": float(end_max[cid]), **figures})
    df = pd.DataFrame(rows).fillna(0.0)
    lead = ["rank", "stage", "cell", "end_s", "compute_s", "recompute_s"]
    rest = sorted(c for c in df.columns if c not in lead)
    return df[[c for c in lead if c in df.columns] + rest].sort_values("rank", ignore_index=True)
