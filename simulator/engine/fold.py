"""Symmetry folding: simulate each class of interchangeable ranks, groups and flows once.

Why it is exact
---------------
Build the bipartite structure of one run: ranks (coloured by their program), the
collective groups they belong to (coloured by kind, size and the algorithm, protocol and
latency NCCL would pick for each call they make), the flows those calls and the pipeline
transfers put on the network (coloured by their wire bytes per payload byte and latency),
and the links (coloured by effective capacity).  Colour refinement (1-dimensional
Weisfeiler-Leman) splits colours until the partition is *equitable*: every member of a
cell sees the same number of neighbours of every other cell -- every link of a link cell
carries the same coefficient-weighted count of every flow cell, every flow of a flow
cell crosses the same weighted count of links of every link cell, every group of a group
cell has the same number of members of every rank cell, and so on.

By induction over simulated time every cell then behaves as one:

* the ranks of a cell run the same program, so they issue the same calls at the same
  instants; every group of a group cell gets its last member at the same instant;
* max-min fair rates are constant on flow cells: progressive filling raises all flows
  together, a link saturates when its load reaches capacity, and on an equitable
  partition all links of a cell carry the same load and saturate together, freezing the
  same flow cells;
* so all flows of a cell finish together, every call of a group cell completes at the
  same instant, and every rank of a cell resumes at the same instant.

The quotient network has one link per link cell ``L`` (the capacity of its members) and,
for a group cell ``G`` with representative group ``g``, each flow ``f`` of ``g``'s call
crosses cell ``L`` with coefficient ``a(f, L) |G| / |L|``, where ``a(f, L)`` sums its
route coefficients over links of ``L``: by double counting that is exactly the load one
member link of ``L`` carries per unit rate.  A p2p flow cell works the same with its
member count.  Bytes carried by a quotient link are the bytes each member link carries.

Anything that breaks a symmetry -- ECMP hashing, a straggler, a degraded link, skewed
expert routing -- only adds colours, so refinement unfolds exactly the cells it touches
(one straggler in DP=128 leaves a few cells per stage, not 128).  The partition is
checked for equitability on the flow/link incidence before it is used (a guard against
hash collisions); a failure raises rather than returning a silently wrong answer.

``Folding.identity`` is the unfolded reference: one actor per rank, one call per group,
one flow per transfer on the physical links (``--no-fold``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from workloads.ops import Coll, OpKind, ep_a2a_matrix, is_p2p

from ..collectives.engine import PORT_ALGOS
from ..collectives.plans import Plan, node_blocks, p2p_plan, prefetch_rings

__all__ = ["Folding", "GroupCell", "P2PCell", "FoldError", "fold"]


class FoldError(RuntimeError):
    """The computed partition is not equitable (an internal error: please report it)."""


@dataclass(slots=True)
class GroupCell:
    """Groups of one kind that behave as one: ``groups`` (rank tuples), the first is the
    representative whose GPUs the calls are planned on."""

    kind: str
    groups: list[tuple[int, ...]]
    rep_gpus: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.groups)


@dataclass(slots=True)
class P2PCell:
    """Pipeline transfers (src rank, dst rank) that behave as one; the first is planned."""

    pairs: list[tuple[int, int]]
    src_gpu: int
    dst_gpu: int

    @property
    def size(self) -> int:
        return len(self.pairs)


@dataclass
class Folding:
    """A partition of ranks, groups, transfers and links into cells that behave as one.

    ``cells[c]`` are the ranks of rank cell ``c`` (one actor each) running program class
    ``cell_class[c]``; ``groups_of[(c, kind)]`` the group cells its members' groups of that
    kind fall in, with how many of its members are in them; ``p2p_of[(c, peer_stage, side)]``
    the same for its pipeline transfers (``side``: 'send' or 'recv'; keyed by the other stage).
    ``rank_cell`` maps a rank to its cell.  ``link_cell`` maps a physical link to its quotient
    link (None: no quotient), ``link_cell_size`` counts each quotient link's members and
    ``link_rep`` names its representative (lowest-numbered) member.  ``folded`` is False for
    :meth:`identity`.  ``stats``: sizes of the partition, refinement rounds and wall time.
    """

    cells: list[tuple[int, ...]]
    cell_class: list[int]
    rank_cell: np.ndarray
    group_cells: list[GroupCell]
    groups_of: dict[tuple[int, str], list[tuple[int, int]]]
    p2p_cells: list[P2PCell]
    p2p_of: dict[tuple[int, int, str], list[tuple[int, int]]]
    link_cell: np.ndarray | None = None
    link_cell_size: np.ndarray | None = None
    link_rep: np.ndarray | None = None
    folded: bool = True
    stats: dict = field(default_factory=dict)

    @property
    def num_cells(self) -> int:
        return len(self.cells)

    @property
    def num_link_cells(self) -> int:
        return 0 if self.link_rep is None else int(self.link_rep.size)

    # -- the quotient network ------------------------------------------------------------------
    def capacity(self, link_capacity: np.ndarray) -> np.ndarray:
        """Capacity of each quotient link (the physical array when there is no quotient)."""
        return link_capacity if self.link_cell is None else link_capacity[self.link_rep]

    def quotient_routes(self, routes, multiplicity: int) -> list:
        """Routes ``(links, coefs)`` of representative flows, each standing for
        ``multiplicity`` flows, on the quotient links (vectorised; the routes as given when
        there is no quotient).  Coefficients are rounded to 12 significant digits, so that
        flows of one cell, whose quotient routes are equal up to the order of summation, get
        bitwise equal routes (and merge)."""
        if self.link_cell is None:
            return list(routes)
        if not routes:
            return []
        lens = np.array([len(r[0]) for r in routes], dtype=np.int64)
        links = np.concatenate([np.asarray(r[0], dtype=np.int64) for r in routes])
        coefs = np.concatenate([np.asarray(r[1], dtype=float) for r in routes])
        cells = self.link_cell[links]
        w = coefs * (multiplicity / self.link_cell_size[cells])
        flow = np.repeat(np.arange(len(routes)), lens)
        n_cells = self.link_rep.size
        u, inv = np.unique(flow * n_cells + cells, return_inverse=True)
        agg = _round12(np.bincount(inv.ravel(), weights=w, minlength=u.size))
        uf, uc = u // n_cells, u % n_cells
        bounds = np.searchsorted(uf, np.arange(len(routes) + 1))
        return [(uc[a:b], agg[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]

    def expand_links(self, per_cell: np.ndarray) -> np.ndarray:
        """A per-quotient-link array as a per-physical-link array (each member the same)."""
        return per_cell if self.link_cell is None else per_cell[self.link_cell]

    # -- the unfolded reference ----------------------------------------------------------------
    @classmethod
    def identity(cls, prog, cluster) -> "Folding":
        """No folding: every rank, group, transfer and link on its own."""
        grid = prog.grid
        n = grid.world_size
        cells = [(r,) for r in range(n)]
        cell_class = [int(c) for c in prog.class_of_rank]
        group_cells: list[GroupCell] = []
        gindex: dict = {}
        groups_of: dict = {}
        p2p_cells: list[P2PCell] = []
        pindex: dict = {}
        p2p_of: dict = {}
        for pc_ in prog.classes:
            kinds = _kinds(pc_)
            peers = _peers(pc_)
            for r in pc_.members:
                for kind in kinds:
                    g = prog.group_members(kind, r)
                    gc = gindex.get((kind, g))
                    if gc is None:
                        gc = gindex[(kind, g)] = len(group_cells)
                        group_cells.append(GroupCell(kind, [g], grid.gpus(g)))
                    groups_of[(r, kind)] = [(gc, 1)]
                for peer, side in peers:
                    other = grid.pp_neighbour(r, peer - pc_.stage)
                    pair = (r, other) if side == "send" else (other, r)
                    pc = pindex.get(pair)
                    if pc is None:
                        pc = pindex[pair] = len(p2p_cells)
                        p2p_cells.append(P2PCell([pair], grid.gpu_of(pair[0]), grid.gpu_of(pair[1])))
                    p2p_of[(r, peer, side)] = [(pc, 1)]
        return cls(cells, cell_class, np.arange(n), group_cells, groups_of, p2p_cells, p2p_of, folded=False,
                   stats={"rank_cells": n, "group_cells": len(group_cells), "p2p_cells": len(p2p_cells),
                          "link_cells": cluster.num_links})


def _round12(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to 12 significant digits (positive finite values)."""
    out = x.copy()
    pos = x > 0
    if pos.any():
        scale = 10.0 ** (np.floor(np.log10(x[pos])) - 11)
        out[pos] = np.round(x[pos] / scale) * scale
    return out


def _kinds(cls) -> list[str]:
    """The group kinds a program class makes collective calls on, in order of first call."""
    seen: dict[str, None] = {}
    for op in cls.ops:
        if op.kind == OpKind.COLLECTIVE:
            seen.setdefault(op.group)
    return list(seen)


def _peers(cls) -> list[tuple[int, str]]:
    """The (peer stage, 'send' or 'recv') a program class transfers with, in order of first op."""
    seen: dict[tuple, None] = {}
    for op in cls.ops:
        if is_p2p(op):
            seen.setdefault((op.peer, op.kind))
    return list(seen)


# -- hashing for colour refinement (splitmix64; arrays wrap modulo 2**64) ----------------------
_K1 = np.uint64(0x9E3779B97F4A7C15)
_K2 = np.uint64(0xBF58476D1CE4E5B9)
_K3 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    x = np.atleast_1d(np.asarray(x, dtype=np.uint64))
    x = (x ^ (x >> np.uint64(30))) * _K2
    x = (x ^ (x >> np.uint64(27))) * _K3
    return x ^ (x >> np.uint64(31))


def _pair(a, b) -> np.ndarray:
    """A 64-bit hash of the pair (arrays broadcast; arithmetic wraps modulo 2**64)."""
    return _mix(_mix(np.asarray(a, dtype=np.uint64) + _K1) * _K1 + np.atleast_1d(np.asarray(b, dtype=np.uint64)))


def _pair_table(n_colours: int, offset: int, n: int) -> np.ndarray:
    """``_pair(c + offset, j)`` at ``[c, j]`` for colours ``c < n_colours`` and ``j < n``:
    gathering from it gives each incidence's hash bit for bit, hashing every (colour,
    coefficient) once instead of every one of millions of incidences."""
    return _pair(np.arange(n_colours)[:, None] + offset, np.arange(n)[None, :])


def _gather_pairs(table: np.ndarray, colour: np.ndarray, coef_id: np.ndarray, n_coef: int) -> np.ndarray:
    """``table[colour, coef_id]`` (a :func:`_pair_table`), gathered from its flat form."""
    flat = table.ravel()
    return flat[colour] if n_coef == 1 else flat[colour * n_coef + coef_id]


def _sum_into(n: int, idx: np.ndarray, vals: np.ndarray) -> np.ndarray:
    acc = np.zeros(n, dtype=np.uint64)
    np.add.at(acc, idx, vals)
    return acc


def _relabel(old: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Colours that split ``old`` by ``h``, numbered in order of first occurrence.

    The distinct keys come from a table indexed by their top bits (:func:`_distinct_keys`:
    few keys, one per colour), which is cheaper than sorting the elements."""
    if old.size == 0:
        return old
    key = _pair(old, h)
    u, inv = _distinct_keys(key)
    first = np.full(u.size, key.size, dtype=np.int64)
    np.minimum.at(first, inv, np.arange(key.size))
    rank = np.empty(u.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(u.size)
    # a refinement never merges two old colours (only a 64-bit hash collision could)
    if (old[first[inv]] != old).any():
        raise FoldError("colour refinement merged two colours (hash collision)")
    return rank[inv]


#: bits of a key that index :func:`_distinct_keys`'s table (2^20 slots: 1 MiB of flags)
_TABLE_BITS = 20


def _distinct_keys(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``key`` (well-mixed 64-bit hashes), ascending, and the index of
    each element's value among them: what ``np.unique(key, return_inverse=True)`` gives.

    Each key goes to the slot of its top :data:`_TABLE_BITS` bits; when no two distinct keys
    share a slot, the occupied slots in order are the distinct keys in order, found without
    sorting the elements (10^6 keys of a few hundred values); otherwise it sorts."""
    if key.size >= 1 << 12:
        slot = (key >> np.uint64(64 - _TABLE_BITS)).astype(np.intp)
        rep = np.empty(1 << _TABLE_BITS, dtype=np.uint64)
        rep[slot] = key
        if np.array_equal(rep[slot], key):
            return _occupied(rep, slot)
    u, inv = np.unique(key, return_inverse=True)        # a short array, or two keys in one slot
    return u, inv.ravel()


def _occupied(rep: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_distinct_keys` from its table: the keys of the occupied slots, and each
    element's index among them."""
    used = np.zeros(1 << _TABLE_BITS, dtype=bool)
    used[slot] = True
    occupied = np.flatnonzero(used)
    pos = np.empty(1 << _TABLE_BITS, dtype=np.int64)
    pos[occupied] = np.arange(occupied.size)
    return rep[occupied], pos[slot]


def _labels(keys: list) -> np.ndarray:
    """Integer ids of hashable keys, in order of first occurrence."""
    ids: dict = {}
    return np.array([ids.setdefault(k, len(ids)) for k in keys], dtype=np.int64)


def _first_ids(x: np.ndarray) -> np.ndarray:
    """:func:`_labels` of an array's values (ints, or floats that are not NaN): ids of the
    distinct values in order of first occurrence."""
    if x.size == 0:
        return np.empty(0, dtype=np.int64)
    _, first, inv = np.unique(x, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[inv.ravel()]


def _count(c: np.ndarray) -> int:
    return int(c.max()) + 1 if c.size else 0


def fold(prog, coll, *, network: bool = True, rank_colors=None, link_colors=None) -> Folding:
    """The coarsest equitable partition of ``prog``'s ranks, groups, transfers and links.

    ``coll`` is the (unfolded) :class:`~simulator.collectives.CollectiveEngine` whose
    algorithm choice, plans and latencies the run will use.  ``network=False`` (free
    communication) partitions ranks and groups only.  ``rank_colors`` (one hashable per
    rank) splits ranks a perturbation treats differently; ``link_colors`` (one hashable per
    physical link) splits links beyond their capacity (what-ifs: latency, failure).
    """
    t0 = time.perf_counter()
    gr, group_label, flow_label = _structure(prog, coll, network)
    colours = _initial_colours(prog, coll, network, group_label, flow_label, rank_colors, link_colors)
    rank_c, group_c, flow_c, link_c, iters = _refine(gr, *colours)
    if network and gr.nf:
        _check_equitable(gr.inc_f, gr.inc_l, gr.inc_w, flow_c, link_c)

    cells = _rank_cells(rank_c)
    cell_class = [int(prog.class_of_rank[m[0]]) for m in cells]
    group_cells, groups_of = _group_cells(prog.grid, gr, rank_c, group_c)
    p2p_cells, p2p_of = _p2p_cells(prog.grid, gr, rank_c, flow_c)
    out = Folding([tuple(m) for m in cells], cell_class, rank_c, group_cells, groups_of, p2p_cells, p2p_of)
    if network:
        out.link_cell, out.link_cell_size, out.link_rep = _link_quotient(link_c, gr.nl)
    out.stats = {"rank_cells": len(cells), "group_cells": len(group_cells), "p2p_cells": len(p2p_cells),
                 "link_cells": out.num_link_cells, "flows": gr.nf, "groups": gr.ng, "iterations": iters,
                 "wall_s": time.perf_counter() - t0}
    return out


# -- the structure colour refinement runs on ---------------------------------------------------
@dataclass
class _Flows:
    """The flows on the network, in order: the route of each (links and coefficients, in
    chunks of routes laid end to end, ``lens`` links each), its initial label (as the id of
    the label among the distinct ones, in order of first occurrence: ``index``), and the
    group it belongs to (-1 for a pipeline transfer)."""

    links: list = field(default_factory=list)
    coefs: list = field(default_factory=list)
    lens: list = field(default_factory=list)
    ids: list = field(default_factory=list)
    owner: list = field(default_factory=list)
    index: dict = field(default_factory=dict)
    n: int = 0

    def __len__(self) -> int:
        return self.n

    def label_id(self, label) -> int:
        return self.index.setdefault(label, len(self.index))

    def add(self, links: np.ndarray, coefs: np.ndarray, label, owner: int) -> None:
        self.add_many(links, coefs, np.array([links.size]), [label], owner)

    def add_many(self, links: np.ndarray, coefs: np.ndarray, lens: np.ndarray, labels: list, owner: int) -> None:
        """Flows whose routes lie end to end in ``links``/``coefs`` (``lens`` links each)."""
        self.add_ids(links, coefs, lens, np.array([self.label_id(lb) for lb in labels], dtype=np.int64),
                     np.full(len(labels), owner, dtype=np.int64))

    def add_ids(self, links: np.ndarray, coefs: np.ndarray, lens: np.ndarray, ids: np.ndarray,
                owner: np.ndarray) -> None:
        """The same with the label ids given (from :meth:`label_id`, in the flows' order)."""
        self.links.append(links)
        self.coefs.append(coefs)
        self.lens.append(lens)
        self.ids.append(ids)
        self.owner.append(owner)
        self.n += ids.size

    @property
    def label(self) -> np.ndarray:
        return np.concatenate(self.ids) if self.ids else np.empty(0, dtype=np.int64)


@dataclass
class _Graph:
    """Ranks, collective groups, pipeline transfers, flows and links, and who touches whom.

    Group ``i`` is ``groups[i]`` of kind ``gkind[i]``; its memberships are the entries of
    ``mem_g`` (group), ``mem_r`` (rank) and ``mem_kind`` (kind id).  Transfer ``i`` runs from
    rank ``p_src[i]`` to ``p_dst[i]``.  Flows ``gflow`` (the first ``n_gflows``) belong to group
    ``owner[f]``; flows ``pflow`` carry transfer ``p_of_flow`` (none without the network).
    Entry ``k`` of the flow/link incidence (flow by flow: ``inc_f`` ascending): flow ``inc_f[k]`` crosses link ``inc_l[k]`` with
    coefficient ``inc_w[k]`` (``coef_id[k]``: its rank among the distinct coefficients).
    """

    n: int
    nl: int
    pipes: list
    groups: list
    gkind: list
    mem_g: np.ndarray
    mem_r: np.ndarray
    mem_kind: np.ndarray
    pairs: list
    p_src: np.ndarray
    p_dst: np.ndarray
    nf: int
    n_gflows: int
    owner: np.ndarray
    inc_f: np.ndarray
    inc_l: np.ndarray
    inc_w: np.ndarray
    coef_id: np.ndarray

    @property
    def ng(self) -> int:
        return len(self.groups)

    @property
    def gflow(self) -> np.ndarray:
        return np.arange(self.n_gflows)

    @property
    def pflow(self) -> np.ndarray:
        return np.arange(self.n_gflows, self.nf)


def _structure(prog, coll, network: bool) -> tuple[_Graph, list, list]:
    """The graph of one run, with the initial labels of its groups and of its flows."""
    grid = prog.grid
    pipes = grid.groups("pp")
    variants, sizes_mat = _call_variants(prog)
    groups, gkind, kinds = _collective_groups(prog, variants, pipes)
    sizes = np.array([len(g) for g in groups], dtype=np.int64)
    mem_g = np.repeat(np.arange(len(groups)), sizes)
    mem_r = np.fromiter((r for g in groups for r in g), dtype=np.int64, count=int(sizes.sum()))
    kind_id = {k: i for i, k in enumerate(kinds)}
    mem_kind = np.repeat(np.array([kind_id[k] for k in gkind], dtype=np.int64), sizes)

    flows = _Flows()
    group_label = _group_flows(prog, coll, network, groups, gkind, variants, sizes_mat, flows)
    n_gflows = len(flows)
    p_src, p_dst = _pipeline_pairs(prog, pipes)
    pairs = list(zip(p_src.tolist(), p_dst.tolist()))
    if network and pairs:
        _p2p_flows(coll, grid, p_src, p_dst, flows)
    nf = len(flows)
    lens = np.concatenate(flows.lens) if nf else np.empty(0, dtype=np.int64)
    inc_w = np.concatenate(flows.coefs) if nf else np.empty(0)
    coef_id = np.searchsorted(np.sort(np.unique(inc_w)), inc_w)     # rank among the few distinct coefficients
    gr = _Graph(n=grid.world_size, nl=coll.cluster.num_links if network else 0, pipes=pipes,
                groups=groups, gkind=gkind, mem_g=mem_g, mem_r=mem_r, mem_kind=mem_kind, pairs=pairs,
                p_src=p_src, p_dst=p_dst,
                nf=nf, n_gflows=n_gflows,
                owner=np.concatenate(flows.owner) if nf else np.empty(0, dtype=np.int64),
                inc_f=np.repeat(np.arange(nf), lens),
                inc_l=np.concatenate(flows.links) if nf else np.empty(0, dtype=np.int64),
                inc_w=inc_w, coef_id=coef_id)
    return gr, group_label, flows.label


def _call_variants(prog) -> tuple[dict[tuple[int, str], set], list[np.ndarray]]:
    """The distinct collective calls each program class makes on each group kind, as
    ``(collective, bytes, sizes key)``, and the all-to-all sizes matrices the keys index
    (-1: an even split)."""
    variants: dict[tuple[int, str], set] = {}
    sizes_id: dict[bytes, int] = {}
    sizes_mat: list[np.ndarray] = []
    for cls in prog.classes:
        for op in cls.ops:
            if op.kind != OpKind.COLLECTIVE or op.size_bytes <= 0:
                continue
            skey = -1
            if op.coll == Coll.ALL_TO_ALL and op.tag in prog.a2a_sizes:
                m = prog.a2a_sizes[op.tag]
                m = ep_a2a_matrix(op, m)
                m = np.ascontiguousarray(m, dtype=float)
                skey = sizes_id.setdefault(m.tobytes() + bytes(str(m.shape), "ascii"), len(sizes_mat))
                if skey == len(sizes_mat):
                    sizes_mat.append(m)
            variants.setdefault((cls.class_id, op.group), set()).add((op.coll, float(op.size_bytes), skey))
        for kind in _kinds(cls):
            variants.setdefault((cls.class_id, kind), set())
    return variants, sizes_mat


def _collective_groups(prog, variants: dict, pipes: list) -> tuple[list[tuple[int, ...]], list[str], list[str]]:
    """Every group some class makes a call on, with its kind, and the sorted kinds."""
    grid = prog.grid
    cls_of = prog.class_of_rank
    kinds = sorted({k for _, k in variants})
    groups: list[tuple[int, ...]] = []
    gkind: list[str] = []
    seen: set = set()
    for kind in kinds:
        users = {c for c, k in variants if k == kind}
        if kind == "world":
            cand = [tuple(range(grid.world_size))]
        elif kind == "embedding":
            cand = [(p[0],) if len(p) == 1 else (p[0], p[-1]) for p in pipes]
        else:
            cand = grid.groups(kind)
        # the candidates with a member of a class that calls on this kind (groups of one
        # size in arrays)
        used = np.zeros(int(cls_of.max()) + 1 if cls_of.size else 0, dtype=bool)
        used[[c for c in users if 0 <= c < used.size]] = True
        if cand and len({len(g) for g in cand}) == 1:
            keep = used[cls_of[np.array(cand, dtype=np.int64)]].any(axis=1).tolist()
        else:
            keep = [any(int(cls_of[r]) in users for r in g) for g in cand]
        for g, k in zip(cand, keep):
            if k and (kind, g) not in seen:
                seen.add((kind, g))
                groups.append(g)
                gkind.append(kind)
    return groups, gkind, kinds


def _group_flows(prog, coll, network: bool, groups: list, gkind: list, variants: dict,
                 sizes_mat: list, flows: _Flows) -> list:
    """The initial label of every group -- kind, size, and each call it makes (on the network:
    with the algorithm, protocol and latency NCCL would pick) -- with the flows of its calls
    appended to ``flows`` (one set per collective and algorithm).

    Groups of one kind and size inside NVLink domains (a TP group on every node) go in one
    batch (:func:`_domain_batch`); the rest one at a time (:func:`_one_group`)."""
    group_label: list = []
    union_cache: dict = {}
    form_calls: dict = {}       # (calls made, group form) -> their labels
    cls_of = prog.class_of_rank
    gi = 0
    while gi < len(groups):
        # a run of groups of one kind and size
        end = gi + 1
        while end < len(groups) and gkind[end] == gkind[gi] and len(groups[end]) == len(groups[gi]):
            end += 1
        if network and len(groups[gi]) > 1 and end - gi > 1:
            _domain_batch(prog, coll, groups, gkind, variants, sizes_mat, flows, gi, end, group_label, union_cache,
                          form_calls)
        else:
            for i in range(gi, end):
                ucls = tuple(sorted({int(cls_of[r]) for r in groups[i]}))
                _one_group(prog, coll, network, groups, gkind, _variants(variants, union_cache, gkind[i], ucls),
                           sizes_mat, flows, i, group_label, form_calls)
        gi = end
    return group_label


def _variants(variants: dict, union_cache: dict, kind: str, ucls: tuple) -> list:
    """The distinct calls of a group of ``kind`` whose members are of classes ``ucls``."""
    vs = union_cache.get((kind, ucls))
    if vs is None:
        vs = union_cache[(kind, ucls)] = sorted(set().union(*(variants.get((c, kind), set()) for c in ucls)))
    return vs


def _one_group(prog, coll, network: bool, groups: list, gkind: list, vs: list, sizes_mat: list, flows: _Flows,
               gi: int, group_label: list, form_calls: dict) -> None:
    """Group ``gi``'s label (appended to ``group_label``) and flows (to ``flows``)."""
    g = groups[gi]
    kind = gkind[gi]
    if not network or len(g) == 1:
        group_label.append((kind, len(g), tuple(vs)))
        return
    gpus = prog.grid.gpus(g)
    calls = []
    a2a = [(size, skey) for coll_kind, size, skey in vs if coll_kind == "all_to_all"]
    if a2a:
        calls += _a2a_flows(coll, gi, gpus, a2a, sizes_mat, flows)
    planned = _planned_calls(coll, gpus, vs, form_calls)
    calls += planned
    group_label.append((kind, len(g), tuple(calls)))
    for tkey, plan in _templates(coll, gpus, planned).items():
        for f in plan.flows:
            flows.add(f.links, f.coefs, (tkey, f.bytes_per_byte, f.inter_node), gi)


def _domain_batch(prog, coll, groups: list, gkind: list, variants: dict, sizes_mat: list, flows: _Flows,
                  lo: int, hi: int, group_label: list, union_cache: dict, form_calls: dict) -> None:
    """Groups ``lo:hi`` (one kind, one size), as :func:`_one_group` would do them one by one.

    The first group of each (calls made, NVLink-domain form) goes through :func:`_one_group`;
    the others of that pair, when its calls are kept per form, get its labels and its
    template plans moved onto their own ports -- the engine's order-preserving map between
    sorted ports (:meth:`~simulator.collectives.CollectiveEngine.plan`), for all of them in
    arrays.  Groups without a form, or making all-to-alls, go one by one."""
    kind = gkind[lo]
    rows = np.array(groups[lo:hi], dtype=np.int64)
    m = rows.shape[0]
    # the classes of each group's members (sorted, distinct), as an id per group
    cls = np.sort(prog.class_of_rank[rows], axis=1)
    ucls_rows, cls_first, cls_inv = np.unique(cls, axis=0, return_index=True, return_inverse=True)
    vs_of = [_variants(variants, union_cache, kind, tuple(sorted(set(r)))) for r in ucls_rows.tolist()]
    cls_inv = cls_inv.ravel()
    placement = np.asarray(prog.grid.placement, dtype=np.int64)
    forms, form_of, sorted_ports = coll.domain_forms(placement[rows])
    if (form_of < 0).sum() > 1:
        # groups across NVLink domains (data parallelism at scale): their rings routed at once
        prefetch_rings(coll.cluster, placement[rows[form_of < 0]])
    # one id per (classes, form): groups sharing it share labels and (moved) templates
    key = cls_inv * (len(forms) + 1) + (form_of + 1)
    done: dict[int, tuple] = {}          # key -> (label, [(link index, coefs, label id) per flow]) or None
    out_links, out_coefs, out_lens, out_ids, out_owner = [], [], [], [], []
    pend: list[int] = []                  # groups waiting to be emitted in one chunk (same key)

    def flush():
        if not pend:
            return
        _, tmpl = done[int(key[pend[0]])]
        sel = np.array(pend, dtype=np.int64)
        idx = np.concatenate([t[0] for t in tmpl])
        out_links.append(sorted_ports[sel][:, idx].ravel())
        out_coefs.append(np.tile(np.concatenate([t[1] for t in tmpl]), sel.size))
        out_lens.append(np.tile(np.array([t[0].size for t in tmpl], dtype=np.int64), sel.size))
        out_ids.append(np.tile(np.array([t[2] for t in tmpl], dtype=np.int64), sel.size))
        out_owner.append(np.repeat(sel + lo, len(tmpl)))
        pend.clear()

    def emit_pending():
        flush()
        for lk, cf, ln, ids, ow in zip(out_links, out_coefs, out_lens, out_ids, out_owner):
            flows.add_ids(lk, cf, ln, ids, ow)
        for lst in (out_links, out_coefs, out_lens, out_ids, out_owner):
            lst.clear()

    for i in range(m):
        k = int(key[i])
        hit = done.get(k, False)
        if hit is False:
            emit_pending()
            hit = done[k] = _first_of_form(prog, coll, groups, gkind, vs_of[cls_inv[i]], sizes_mat, flows, lo + i,
                                           group_label, form_calls, forms, int(form_of[i]), sorted_ports[i])
            continue
        if hit is None:
            emit_pending()
            _one_group(prog, coll, True, groups, gkind, vs_of[cls_inv[i]], sizes_mat, flows, lo + i, group_label,
                       form_calls)
            continue
        group_label.append(hit[0])
        if pend and int(key[pend[0]]) != k:
            flush()
        pend.append(i)
    emit_pending()


def _first_of_form(prog, coll, groups, gkind, vs, sizes_mat, flows, gi, group_label, form_calls, forms, form,
                   ports):
    """:func:`_one_group` for the first group of its (calls, form); returns what the others
    of that pair reuse -- its label and, per template flow, the flow's links as positions
    among the sorted ports, its coefficients and its label id -- or None when they must go
    one by one (no form, all-to-alls, calls not kept per form)."""
    n_label = len(group_label)
    n_flows = len(flows)
    _one_group(prog, coll, True, groups, gkind, vs, sizes_mat, flows, gi, group_label, form_calls)
    if form < 0 or any(c == "all_to_all" for c, _, _ in vs):
        return None
    f = forms[form]
    calls = form_calls.get((tuple(vs), f))
    if calls is None:
        return None
    tmpl = []
    for coll_kind, size, _, algo, *_ in calls:
        if size > coll.tiny_call_bytes and all(t[0] != (coll_kind, algo) for t in tmpl):
            ref = coll.form_plan(f, coll_kind, algo)
            if ref is None:
                return None
            tmpl.append(((coll_kind, algo), ref))
    out = []
    for tkey, (plan, _, ref_ports) in tmpl:
        for fl in plan.flows:
            out.append((np.searchsorted(ref_ports, fl.links), fl.coefs,
                        flows.label_id((tkey, fl.bytes_per_byte, fl.inter_node))))
    if len(group_label) != n_label + 1 or len(flows) != n_flows + len(out):
        return None         # not the flows the templates stand for: the others go one by one too
    return group_label[-1], out


def _a2a_flows(coll, gi: int, gpus: tuple, a2a: list, sizes_mat: list, flows: _Flows) -> list:
    """Group ``gi``'s all-to-all calls (``(bytes, sizes key)`` each) as labelled, with their
    flows appended to ``flows``."""
    # one flow per (source, destination) pair for all the group's all-to-alls, labelled
    # by the bytes it carries in each of them (skewed routing: per layer and micro-batch).
    # The pairs' routes and latency are those of the engine's all-to-all plan
    # (CollectiveEngine.alltoall_routes: every pair, row-major, routed with PXN), batch-routed
    # here without a plan per group.
    cluster = coll.cluster
    n_m = len(gpus)
    mats = np.stack([sizes_mat[k] if k >= 0 else np.full((n_m, n_m), sz / n_m) for sz, k in a2a])
    m = np.asarray(gpus, dtype=np.int64)
    ii, jj = np.nonzero(~np.eye(n_m, dtype=bool))
    links, coefs, lens = cluster.router.routes_flat(m[ii], m[jj], pxn=True)
    D = cluster.nvlink_domain_size
    inter = m[ii] // D != m[jj] // D
    lat = 0.0
    if inter.any():
        lat = max(lat, float(cluster.router.path_latencies(links, coefs, lens)[inter].max()))
    shell = Plan("direct", [], n_m, len(node_blocks(cluster, gpus)), 1, lat)
    lat = coll.latency_s("all_to_all", shell, "Simple", 0.0)
    calls = [("all_to_all", sz, k, "direct", "Simple", lat, shell.n_nodes) for sz, k in a2a]
    bits = np.ascontiguousarray(mats[:, ii, jj]).view(np.uint64)
    lab = np.zeros(ii.size, dtype=np.uint64)
    for v in range(bits.shape[0]):
        lab += _pair(np.uint64(v), bits[v])
    # label ids of the distinct (label, inter-node), in order of first occurrence
    _, lab_inv = np.unique(lab, return_inverse=True)
    _, first, inv = np.unique(lab_inv.ravel() * 2 + inter, return_index=True, return_inverse=True)
    ids = np.empty(first.size, dtype=np.int64)
    for k in np.argsort(first, kind="stable").tolist():
        i = int(first[k])
        ids[k] = flows.label_id(("a2a", int(lab[i]), bool(inter[i])))
    flows.add_ids(links, coefs, lens, ids[inv.ravel()], np.full(ii.size, gi, dtype=np.int64))
    return calls


def _planned_calls(coll, gpus: tuple, vs: list, form_calls: dict) -> list:
    """A group's calls other than all-to-alls as labelled: algorithm, protocol and latency
    (and nodes, for calls with flows).  Groups of one NVLink-domain form
    (:meth:`~simulator.collectives.CollectiveEngine.domain_form`) get the same labels -- the
    same predictions and choices, and latencies of plans that differ only in their ports --
    so they are worked out once per form (``form_calls``), when every algorithm chosen is
    one whose plans follow the form."""
    form = coll.domain_form(gpus)
    key = None if form is None else (tuple(vs), form)
    calls = form_calls.get(key) if key is not None else None
    if calls is not None:
        return calls
    calls = []
    for coll_kind, size, skey in vs:
        if coll_kind == "all_to_all":
            continue
        algo, proto = coll.choose(gpus, coll_kind, size)
        if size <= coll.tiny_call_bytes:          # no flows: its predicted time
            calls.append((coll_kind, size, skey, algo, proto, coll.predict(gpus, coll_kind, size)[(algo, proto)]))
            continue
        plan = coll.plan(gpus, coll_kind, algo)[0]
        calls.append((coll_kind, size, skey, algo, proto, coll.latency_s(coll_kind, plan, proto, size),
                      plan.n_nodes))
    if key is not None and all(c[3] in PORT_ALGOS for c in calls):
        form_calls[key] = calls
    return calls


def _templates(coll, gpus: tuple, calls: list) -> dict:
    """The plan whose flows stand for each (collective, algorithm) of ``calls`` that puts
    flows on the network."""
    templates: dict = {}
    for coll_kind, size, _, algo, *_ in calls:
        if size > coll.tiny_call_bytes and (coll_kind, algo) not in templates:
            templates[(coll_kind, algo)] = coll.plan(gpus, coll_kind, algo)[0]
    return templates


def _pipeline_pairs(prog, pipes: list) -> tuple[np.ndarray, np.ndarray]:
    """Every pipeline transfer (src rank, dst rank), in order of first appearance (classes in
    order, each one's send peers in order of first op, its members in order), as two arrays."""
    if not pipes:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    parr = np.array(pipes, dtype=np.int64)
    pipe_of = np.empty(prog.grid.world_size, dtype=np.int64)
    pipe_of[parr] = np.arange(parr.shape[0])[:, None]
    src, dst = [], []
    for cls in prog.classes:
        members = np.array(cls.members, dtype=np.int64)
        for peer, side in _peers(cls):
            if side == "send":
                src.append(members)
                dst.append(parr[pipe_of[members], peer])
    if not src:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    src, dst = np.concatenate(src), np.concatenate(dst)
    # the first of each distinct pair, in order
    _, first = np.unique(src * prog.grid.world_size + dst, return_index=True)
    first.sort()
    return src[first], dst[first]


def _p2p_flows(coll, grid, p_src: np.ndarray, p_dst: np.ndarray, flows: _Flows) -> None:
    """One flow per pipeline transfer, appended to ``flows``."""
    cluster = coll.cluster
    # the route of every transfer (batch-routed), labelled by the latency its call waits
    placement = np.asarray(grid.placement, dtype=np.int64)
    gs, gd = placement[p_src], placement[p_dst]
    inter = gs // cluster.nvlink_domain_size != gd // cluster.nvlink_domain_size    # domain_of
    links, coefs, lens = cluster.router.routes_flat(gs, gd, pxn=True)
    path_lat = np.where(inter, cluster.router.path_latencies(links, coefs, lens), 0.0)
    # the latency of each distinct (inter-node, path latency), worked out on its first transfer;
    # a path latency is a non-negative sum (+0.0 at least), so its bits are its float value
    key = path_lat.view(np.uint64) | (inter.astype(np.uint64) << np.uint64(63))
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    ids = np.empty(first.size, dtype=np.int64)
    for k in np.argsort(first, kind="stable").tolist():
        i = int(first[k])
        a, b = int(gs[i]), int(gd[i])
        lat = coll.latency_s("send_recv", p2p_plan(cluster, a, b), "Simple", 1.0)
        ids[k] = flows.label_id(("p2p", lat, bool(inter[i])))
    flows.add_ids(links, coefs, lens, ids[inv.ravel()], np.full(gs.size, -1, dtype=np.int64))


# -- colour refinement -------------------------------------------------------------------------
def _initial_colours(prog, coll, network: bool, group_label: list, flow_label: list, rank_colors,
                     link_colors) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The colours of ranks (program class, and ``rank_colors``), groups and flows (their
    labels) and links (effective capacity, and ``link_colors``) that refinement starts from."""
    cls_of = prog.class_of_rank
    rank_c = _first_ids(np.asarray(cls_of, dtype=np.int64)) if rank_colors is None else \
        _labels(list(zip(cls_of.tolist(), rank_colors)))
    group_c = _labels(group_label)
    flow_c = flow_label if isinstance(flow_label, np.ndarray) else _labels(flow_label)
    if not network:
        link_c = np.empty(0, dtype=np.int64)
    elif link_colors is None:
        link_c = _first_ids(np.asarray(coll.capacity, dtype=float))
    else:
        link_c = _labels([(float(x), c) for x, c in zip(coll.capacity.tolist(), link_colors)])
    return rank_c, group_c, flow_c, link_c


def _refine(gr: _Graph, rank_c, group_c, flow_c, link_c):
    """Colour refinement to its fixed point: every round splits each colour by the hashed
    multiset of its neighbours' colours, until no colour splits.  Returns the colours of
    ranks, groups, flows and links and the number of rounds.

    Each hash is a wrapping sum of parts, each part a function of one kind's colours
    (:func:`_hash_parts`); a part whose colours did not change in the last round is kept,
    and a kind none of whose parts changed keeps its colours (refining colours by the hash
    they were refined by last time splits nothing and renumbers nothing)."""
    parts, uses = _hash_parts(gr)
    colours = {"l": link_c, "f": flow_c, "g": group_c, "r": rank_c}
    sizes = {"l": gr.nl, "f": gr.nf, "g": gr.ng, "r": gr.n}
    kept: dict = {}
    changed = set(colours)
    iters = 0
    counts = None
    while True:
        iters += 1
        fresh = {name for name, (dep, _) in parts.items() if dep in changed}
        for name in fresh:
            kept[name] = parts[name][1](colours)
        changed = set()
        # every hash from the colours of the round's start, then every relabelling
        hashes = {x: _wrapping_sum(sizes[x], [kept[name] for name in uses[x]])
                  for x in colours if fresh.intersection(uses[x])}
        for x, h in hashes.items():
            new = _relabel(colours[x], h)
            if not np.array_equal(new, colours[x]):
                changed.add(x)
            colours[x] = new
        new_counts = tuple(_count(colours[x]) for x in "lfgr")
        if new_counts == counts:
            break
        counts = new_counts
    return colours["r"], colours["g"], colours["f"], colours["l"], iters


def _wrapping_sum(n: int, arrays: list) -> np.ndarray:
    """The elementwise sum of ``arrays`` modulo 2**64 (zeros of length ``n`` when none)."""
    out = np.zeros(n, dtype=np.uint64)
    for x in arrays:
        out += x
    return out


def _hash_parts(gr: _Graph) -> tuple[dict, dict]:
    """The parts of colour refinement's hashes: name -> (the kind whose colours it reads, a
    function of the colours ``{"l", "f", "g", "r"}: array`` giving its hash of every member of
    the kind it hashes), and per kind the names of its parts."""
    n, nl, nf, ng = gr.n, gr.nl, gr.nf, gr.ng
    inc_f, inc_l, coef_id, owner = gr.inc_f, gr.inc_l, gr.coef_id, gr.owner
    mem_g, mem_r, mem_kind, p_src, p_dst = gr.mem_g, gr.mem_r, gr.mem_kind, gr.p_src, gr.p_dst
    n_gflows, gflow, pflow = gr.n_gflows, gr.gflow, gr.pflow
    p_of_flow = pflow - n_gflows
    n_coef = _count(coef_id)
    # the incidences lie flow by flow (inc_f ascending): a flow's sum is one np.add.reduceat
    # over its run (integer sums wrap alike in any order), from each non-empty flow's start
    f_lens = np.bincount(inc_f, minlength=nf) if nf else np.zeros(0, dtype=np.int64)
    f_some = np.flatnonzero(f_lens)
    f_start = (np.cumsum(f_lens) - f_lens)[f_some]

    def on(size, idx, vals):
        out = np.zeros(size, dtype=np.uint64)
        out[idx] = vals
        return out

    parts: dict = {}
    uses: dict = {"l": [], "f": [], "g": [], "r": []}

    def part(kind, name, dep, fn):
        parts[name] = (dep, fn)
        uses[kind].append(name)

    if nl:      # links by the flow colours (and coefficients) that cross them
        part("l", "l<f", "f", lambda c: _sum_into(nl, inc_l, _gather_pairs(
            _pair_table(_count(c["f"]), 0, n_coef), c["f"][inc_f], coef_id, n_coef)))
    if f_some.size:     # flows by their links, their group, or their endpoints
        part("f", "f<l", "l", lambda c: on(nf, f_some, np.add.reduceat(_gather_pairs(
            _pair_table(_count(c["l"]), 1, n_coef), c["l"][inc_l], coef_id, n_coef), f_start)))
    if n_gflows:
        part("f", "f<g", "g", lambda c: on(nf, gflow, _pair(c["g"][owner[gflow]], 7)))
    if pflow.size:
        part("f", "f<r", "r", lambda c: on(nf, pflow, _pair(c["r"][p_src[p_of_flow]], 11)
                                           + _pair(c["r"][p_dst[p_of_flow]], 13)))
    # groups by their members and their flows
    part("g", "g<r", "r", lambda c: _sum_into(ng, mem_g, _pair(c["r"][mem_r], 3)))
    if n_gflows:
        part("g", "g<f", "f", lambda c: _sum_into(ng, owner[gflow], _pair(c["f"][gflow], 5)))
    # ranks by their groups (per kind) and their transfers
    part("r", "r<g", "g", lambda c: _sum_into(n, mem_r, _pair(c["g"][mem_g], mem_kind)))
    if gr.pairs and pflow.size:     # transfers coloured by their endpoints already
        part("r", "r<f", "f", lambda c: _sum_into(n, p_src, _pair(c["f"][pflow], 17))
             + _sum_into(n, p_dst, _pair(c["f"][pflow], 19)))
    elif gr.pairs:
        part("r", "r<r", "r", lambda c: _sum_into(n, p_src, _pair(c["r"][p_dst], 23))
             + _sum_into(n, p_dst, _pair(c["r"][p_src], 29)))
    return parts, uses


# -- the quotient --------------------------------------------------------------------------------
def _rank_cells(rank_c: np.ndarray) -> list[list[int]]:
    """The ranks of each rank colour, in rank order."""
    cells: list[list[int]] = [[] for _ in range(_count(rank_c))]
    for r, c in enumerate(rank_c.tolist()):
        cells[c].append(r)
    return cells


def _group_cells(grid, gr: _Graph, rank_c: np.ndarray, group_c: np.ndarray) -> tuple[list[GroupCell], dict]:
    """The group cells, and for each (rank cell, kind) the group cells its members' groups
    fall in with how many of its members are in them (see :class:`Folding`)."""
    gmembers: list[list[int]] = [[] for _ in range(_count(group_c))]
    for gi, c in enumerate(group_c.tolist()):
        gmembers[c].append(gi)
    groups, gkind = gr.groups, gr.gkind
    group_cells = [GroupCell(gkind[m[0]], [groups[i] for i in m], grid.gpus(groups[m[0]])) for m in gmembers]
    # per (rank cell, kind) -- in order of first occurrence over the memberships, group by
    # group -- the group cells of its members' groups, ascending, with how many members
    groups_of: dict = {}
    if gr.mem_g.size:
        n_kinds = _count(gr.mem_kind)
        n_gc = len(gmembers)
        key = rank_c[gr.mem_r] * n_kinds + gr.mem_kind
        ukey, first = np.unique(key, return_index=True)
        kind_name = {}
        for gi, k in zip(gr.mem_g[first].tolist(), gr.mem_kind[first].tolist()):
            kind_name[k] = gkind[gi]
        pk, cnt = np.unique(key * n_gc + group_c[gr.mem_g], return_counts=True)
        bounds = np.searchsorted(pk // n_gc, ukey)
        bounds = np.append(bounds, pk.size)
        items = list(zip((pk % n_gc).tolist(), cnt.tolist()))
        for j in np.argsort(first, kind="stable").tolist():
            k = int(ukey[j])
            groups_of[(k // n_kinds, kind_name[k % n_kinds])] = items[bounds[j]:bounds[j + 1]]
    return group_cells, groups_of


def _p2p_cells(grid, gr: _Graph, rank_c: np.ndarray, flow_c: np.ndarray) -> tuple[list[P2PCell], dict]:
    """The cells of pipeline transfers, and for each (rank cell, other stage, side) the cells
    its members' transfers fall in with how many of its members are in them."""
    pairs, pflow = gr.pairs, gr.pflow
    # pipeline transfers: cells by flow colour (refined by both endpoints)
    pc = flow_c[pflow] if pflow.size else _labels([(int(rank_c[s]), int(rank_c[d])) for s, d in pairs])
    pc = _relabel(np.zeros(len(pairs), dtype=np.int64), pc.astype(np.uint64)) if len(pairs) else pc
    pmembers: list[list[int]] = [[] for _ in range(_count(pc))]
    for i, c in enumerate(pc.tolist()):
        pmembers[c].append(i)
    p2p_cells = [P2PCell([pairs[i] for i in m], grid.gpu_of(pairs[m[0]][0]), grid.gpu_of(pairs[m[0]][1]))
                 for m in pmembers]
    return p2p_cells, _p2p_of(gr, rank_c, pc)


def _p2p_of(gr: _Graph, rank_c: np.ndarray, pc: np.ndarray) -> dict:
    """For each (rank cell, other stage, side) -- keys in order of first occurrence over
    the transfers, each one's send side before its recv side -- the transfer cells ``pc``
    its members' transfers fall in, with how many (counted in arrays: 10^5 transfers)."""
    if not gr.pairs:
        return {}
    pipes = np.array(gr.pipes, dtype=np.int64)
    stage = np.empty(gr.n, dtype=np.int64)
    stage[pipes] = np.arange(pipes.shape[1])
    # entry 2i: transfer i seen by its source (send), 2i + 1: by its destination (recv)
    cell = np.stack([rank_c[gr.p_src], rank_c[gr.p_dst]], axis=1).ravel()
    other = np.stack([stage[gr.p_dst], stage[gr.p_src]], axis=1).ravel()
    side = np.tile(np.array([0, 1]), len(gr.pairs))
    key = (cell * pipes.shape[1] + other) * 2 + side
    ukey, first, kinv = np.unique(key, return_index=True, return_inverse=True)
    n_pc = _count(pc)
    ucount, count = np.unique(kinv.ravel() * n_pc + np.repeat(pc, 2), return_counts=True)
    bounds = np.searchsorted(ucount // n_pc, np.arange(ukey.size + 1))
    items = list(zip((ucount % n_pc).tolist(), count.tolist()))
    out = {}
    for k in np.argsort(first).tolist():
        out[(int(cell[first[k]]), int(other[first[k]]), ("send", "recv")[int(side[first[k]])])] = \
            items[bounds[k]:bounds[k + 1]]
    return out


def _link_quotient(link_c: np.ndarray, nl: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The quotient link of every physical link, each quotient link's member count, and its
    representative (lowest-numbered member)."""
    nlc = _count(link_c)
    size = np.bincount(link_c, minlength=nlc).astype(float)
    rep = np.full(nlc, -1, dtype=np.int64)
    rep[link_c[::-1]] = np.arange(nl)[::-1]
    return link_c, size, rep


def _check_equitable(inc_f, inc_l, inc_w, flow_c, link_c, rtol: float = 1e-9) -> None:
    """Every flow of a cell has the same weighted count of links in every link cell, and
    every link of a cell the same weighted count of flows of every flow cell."""
    for a, b, ca, cb, what in ((inc_f, inc_l, flow_c, link_c, "flow"), (inc_l, inc_f, link_c, flow_c, "link")):
        # per (member a, cell of b): summed coefficient (in the incidences' order, as a
        # bincount over the sorted distinct keys; a stable sort: the flow side comes sorted by flow)
        ncb = _count(cb)
        key = a.astype(np.int64) * ncb + cb[b]
        order = np.argsort(key, kind="stable")
        ks = key[order]
        new = np.empty(ks.size, dtype=bool)
        new[:1] = True
        np.not_equal(ks[1:], ks[:-1], out=new[1:])
        starts = np.flatnonzero(new)
        u = ks[starts]
        inv = np.empty(ks.size, dtype=np.int64)
        inv[order] = np.cumsum(new) - 1         # each incidence's key among the distinct ones
        s = np.bincount(inv, weights=inc_w)
        # per (cell of a, cell of b): how many members touch it, and the least and largest sum
        nca = _count(ca)
        pk = ca[u // ncb] * ncb + u % ncb
        if nca * ncb <= max(4 * u.size, 1 << 20):       # a dense table (few cells)
            pinv = pk
            cnt = np.bincount(pinv, minlength=nca * ncb)
            present = np.flatnonzero(cnt)
            n_p = nca * ncb
        else:
            present, pinv = np.unique(pk, return_inverse=True)
            pinv = pinv.ravel()
            cnt = np.bincount(pinv, minlength=present.size)
            n_p = present.size
        hi = np.full(n_p, -np.inf)
        lo = np.full(n_p, np.inf)
        np.maximum.at(hi, pinv, s)
        np.minimum.at(lo, pinv, s)
        if n_p != present.size:
            hi, lo, cnt = hi[present], lo[present], cnt[present]
        pu = np.stack([present // ncb, present % ncb], axis=1)
        size = np.bincount(ca)
        bad = (cnt != size[pu[:, 0]]) | (hi - lo > rtol * np.abs(hi))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise FoldError(f"{what} cell {int(pu[i, 0])} is not equitable towards cell {int(pu[i, 1])}: "
                            f"{int(cnt[i])} of {int(size[pu[i, 0]])} members touch it, sums {lo[i]:g}..{hi[i]:g}")
