"""`RankGrid`: ranks <-> mesh coordinates, the group of every collective, placement on GPUs.

Rank formula
------------
``mesh_order`` lists the axes innermost first (Megatron-Core's ``order``, default
``tp-cp-ep-dp-pp``).  With sizes ``n_a`` and coordinates ``c_a`` of the axes in that
order, ``rank = sum_a c_a * stride_a`` with ``stride_a`` the product of the sizes of the
axes before ``a``.  Dense layers use the sizes (tp, cp, ep=1, dp, pp); MoE layers use
(etp, cp=1, ep, edp, pp) over the same ranks (Megatron-Core's expert rank generator;
the two meshes agree on ``pp`` and on the product of the other axes).

Worked example (Megatron-Core's ``initialize_model_parallel`` docstring): 16 GPUs,
tp=2, pp=4, dp=2, order tp-cp-ep-dp-pp.  Strides are tp 1, dp 2, pp 4, so rank 13 has
tp=1, dp=0, pp=3 and

* TP groups  [0,1] [2,3] ... [14,15]
* DP groups  [0,2] [1,3] [4,6] [5,7] ... [13,15]
* PP groups  [0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15]

Ranks sit on GPUs in placement order: rank ``r`` on GPU ``placement[r]`` (identity by
default, i.e. TP neighbours share a host when tp divides the host size).

Groups
------
Every op kind's group is a mesh-axis expression in one table, :data:`GROUP_AXES`.
Two kinds are not axis products: ``embedding`` (the first and last pipeline stage of
each pipeline group, for tied-embedding gradients) and ``pp_next`` (a stage and the next
one, for pipeline send/recv), returned by :meth:`RankGrid.embedding_group` and
:meth:`RankGrid.pp_neighbour`.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from topologies import ConfigError

from .parallel import ParallelConfig

__all__ = ["RankGrid", "GROUP_AXES"]

#: op kind -> (mesh, axes).  "dense" mesh: (tp, cp, ep=1, dp, pp); "expert" mesh:
#: (etp, cp=1, ep, edp, pp).
GROUP_AXES: dict[str, tuple[str, tuple[str, ...]]] = {
    "tp": ("dense", ("tp",)),                 # tensor-parallel all-reduce / all-gather / reduce-scatter
    "sp": ("dense", ("tp",)),                 # sequence-parallel all-gather / reduce-scatter (TP group)
    "cp": ("dense", ("cp",)),                 # context-parallel K/V ring
    "pp": ("dense", ("pp",)),                 # the whole pipeline (neighbours via pp_neighbour)
    "dp": ("dense", ("dp",)),                 # data parallel replicas
    "dp_cp": ("dense", ("cp", "dp")),         # dense gradient reduction and parameter gather
    "tp_cp": ("dense", ("tp", "cp")),         # model-parallel ranks of one replica stage
    "etp": ("expert", ("tp",)),               # expert tensor parallel
    "ep": ("expert", ("ep",)),                # expert-parallel all-to-all dispatch / combine
    "edp": ("expert", ("dp",)),               # expert gradient reduction
    "world": ("dense", ("tp", "cp", "ep", "dp", "pp")),   # grad-norm and loss reductions
}


class RankGrid:
    """The device mesh of a resolved :class:`ParallelConfig`.

    Parameters
    ----------
    cfg : ParallelConfig
        Resolved (``dp != -1``).
    placement : sequence of int, optional
        GPU of each rank; default identity.
    """

    def __init__(self, cfg: ParallelConfig, placement: Sequence[int] | None = None):
        if cfg.dp < 1:
            raise ConfigError("parallel.dp", cfg.dp, "resolve dp against the GPU count first")
        self.cfg = cfg
        self.order = tuple(cfg.mesh_order.split("-"))
        self.world_size = cfg.world_size
        self.sizes = {
            "dense": {"tp": cfg.tp, "cp": cfg.cp, "ep": 1, "dp": cfg.dp, "pp": cfg.pp},
            "expert": {"tp": cfg.expert_tp, "cp": 1, "ep": cfg.ep, "dp": cfg.expert_dp, "pp": cfg.pp},
        }
        self.strides = {}
        for mesh, sizes in self.sizes.items():
            stride, acc = {}, 1
            for a in self.order:
                stride[a] = acc
                acc *= sizes[a]
            if acc != self.world_size:
                raise ConfigError("parallel", cfg.describe(),
                                  f"the {mesh} mesh has {acc} ranks, the dense mesh {self.world_size}")
            self.strides[mesh] = stride
        if placement is None:
            self.placement = tuple(range(self.world_size))
        else:
            placement = tuple(int(g) for g in placement)
            if len(placement) != self.world_size or len(set(placement)) != self.world_size:
                raise ConfigError("placement", f"{len(placement)} entries",
                                  f"must map each of the {self.world_size} ranks to a distinct GPU")
            self.placement = placement

    # -- coordinates -------------------------------------------------------------------------
    def coords(self, rank: int, mesh: str = "dense") -> dict[str, int]:
        """Coordinates of ``rank`` on every axis of ``mesh``."""
        if not 0 <= rank < self.world_size:
            raise ConfigError("rank", rank, f"must be in [0, {self.world_size})")
        sizes, strides = self.sizes[mesh], self.strides[mesh]
        return {a: (rank // strides[a]) % sizes[a] for a in self.order}

    def rank(self, mesh: str = "dense", **coords: int) -> int:
        """Rank at the given coordinates (missing axes: 0)."""
        strides = self.strides[mesh]
        return sum(coords.get(a, 0) * strides[a] for a in self.order)

    def stage_of(self, rank: int) -> int:
        return self.coords(rank)["pp"]

    def gpu_of(self, rank: int) -> int:
        return self.placement[rank]

    # -- groups ------------------------------------------------------------------------------
    def _axes(self, kind_or_axes) -> tuple[str, tuple[str, ...]]:
        if isinstance(kind_or_axes, str):
            if kind_or_axes not in GROUP_AXES:
                raise ConfigError("group", kind_or_axes, f"unknown group kind; known: {', '.join(GROUP_AXES)}")
            return GROUP_AXES[kind_or_axes]
        return "dense", tuple(kind_or_axes)

    def group(self, kind, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s group of kind ``kind`` (or an axis tuple), innermost axis fastest."""
        mesh, axes = self._axes(kind)
        c = self.coords(rank, mesh)
        return self._members(mesh, axes, c)

    def _members(self, mesh: str, axes, base: dict[str, int]) -> tuple[int, ...]:
        sizes, strides = self.sizes[mesh], self.strides[mesh]
        varying = [a for a in self.order if a in axes]
        start = sum(base[a] * strides[a] for a in self.order if a not in axes)
        out = []
        for combo in itertools.product(*(range(sizes[a]) for a in reversed(varying))):
            out.append(start + sum(i * strides[a] for i, a in zip(combo, reversed(varying))))
        return tuple(out)

    def groups(self, kind) -> list[tuple[int, ...]]:
        """Every group of kind ``kind``, in Megatron-Core's order (outer coordinates, innermost fastest)."""
        mesh, axes = self._axes(kind)
        starts = self._offsets(mesh, [a for a in self.order if a not in axes])
        members = self._offsets(mesh, [a for a in self.order if a in axes])
        return list(map(tuple, (starts[:, None] + members[None, :]).tolist()))

    def _offsets(self, mesh: str, axes: list[str]) -> np.ndarray:
        """Rank offsets of every combination of coordinates on ``axes`` (given inner first),
        the first axis fastest: :meth:`_members` for all groups at once."""
        sizes, strides = self.sizes[mesh], self.strides[mesh]
        off = np.zeros(1, dtype=np.int64)
        for a in reversed(axes):
            off = (off[:, None] + np.arange(sizes[a], dtype=np.int64) * strides[a]).ravel()
        return off

    def pp_neighbour(self, rank: int, step: int = 1) -> int | None:
        """The rank ``step`` stages downstream in the same pipeline (None past the end)."""
        c = self.coords(rank)
        s = c["pp"] + step
        if not 0 <= s < self.cfg.pp:
            return None
        c["pp"] = s
        return self.rank(**c)

    def embedding_group(self, rank: int) -> tuple[int, ...]:
        """First and last stage of ``rank``'s pipeline (tied embedding / output gradients)."""
        pipe = self.group("pp", rank)
        return (pipe[0],) if len(pipe) == 1 else (pipe[0], pipe[-1])

    def gpus(self, ranks: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.placement[r] for r in ranks)
