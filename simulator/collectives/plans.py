"""Flow templates of collective algorithms: which coupled flows a call puts on which links.

A :class:`Plan` is the list of channel flows one collective call starts, each with its
route (link ids and coefficients) and its wire bytes per payload byte, plus the shape
NCCL's latency model needs (ranks, nodes).  "Node" means NVLink domain here: what
NCCL's rings and trees treat as one node (a DGX host, or a whole NVL72 rack).

Algorithms (payload ``S`` bytes; ``n`` ranks; ``N`` nodes of ``ppn`` ranks; ``C``
channels = rails the members of a node can use):

``ring``       C coupled ring channels; channel ``c`` enters every node at its member on
               rail ``c`` and leaves it through the same rail (PXN relay for the last
               member), as NCCL's rail-aligned rings do.  Each carries
               ``S/C x 2(n-1)/n`` (all-reduce), ``S/C x (n-1)/n`` (all-gather,
               reduce-scatter) or ``S/C`` (broadcast, a chain from the root).
``tree``       all-reduce across nodes: per channel, two complementary binary trees over
               the nodes (double binary tree), each reducing up and broadcasting down
               ``S/(2C)``; inside a node a chain through the members.
``nvls``       NVLink SHARP inside one NVSwitch node: one coupled flow over every
               member's NVLink port, ``S (1 + 1/ppn)`` each way (in-switch reduce of each
               slice, then multicast of the reduced slice).
``nvls_tree``  NVLS inside each node plus, per rail, a double binary tree across nodes on
               the node's ``S/ppn`` slice.
``collnet_direct``  all-reduce with SHARP (cluster declares it): inside each node every
               member reduce-scatters and later all-gathers over NVLink
               (``2 (ppn-1)/ppn x S`` each way), and member ``i`` of every node sends slice
               ``i`` (``S/ppn``) through its NIC into the switches' aggregation tree and
               gets the reduced slice back.  ``nvls`` across nodes is the same with the
               NVLS in-switch reduction inside the nodes.
``direct``     all-to-all: one independent flow per (source, destination) pair, routed
               with PXN; send/recv: one flow.

Full-mesh domains (AMD xGMI: a link per GPU pair, no switch).  RCCL runs many channels
whose rings together use every link of the mesh, not one ring on one link per pair (on
MI300-class GPUs it allows up to ``MAXCHANNELS`` = 128 channels, "Only use full MAXCHANNELS
for gfx94x": ROCm/rccl@0cbce2a7 ``src/graph/connect.cc``, ``src/include/device.h``; its
README: fewer than 8 MI300X GPUs reach "only a fraction" of the node's bandwidth, and RCCL
presets 32 channels for 2 GPUs and 24 for 4).  A
ring channel's part inside a mesh domain of ``k`` members is therefore spread evenly over
the ``k (k-1)`` directed links among them, ``1/(k-1)`` of its bytes on each
(:func:`domain_spread`): the uniform mixture of all directed Hamiltonian rings over the
members loads every directed link alike, and for ``k`` other than 4 and 6 the complete
digraph even splits into ``k-1`` link-disjoint rings (Tillson, 1980).  An 8-GPU all-reduce
then moves ``2 (n-1)/n x S / 7`` over each link and reaches a bus bandwidth of 7 links.
Across nodes the channel leaves each domain through its entry GPU's NIC, as on NVLink
systems.  A tree channel's chain inside a mesh domain (up and back down) is spread the same
way, ``2/k`` of its bytes on each link; all-to-all and send/recv take the direct link of each
pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topologies import Cluster

__all__ = ["ChannelFlow", "Plan", "node_blocks", "domain_spread", "ring_plan", "tree_plan", "nvls_plan", "nvls_tree_plan", "collnet_plan",
           "alltoall_plan", "p2p_plan", "binary_tree", "double_binary_tree"]


@dataclass(slots=True)
class ChannelFlow:
    """One flow of a plan: route, and wire bytes per payload byte of the call."""

    links: np.ndarray
    coefs: np.ndarray
    bytes_per_byte: float
    inter_node: bool = False


@dataclass(slots=True)
class Plan:
    algo: str
    flows: list[ChannelFlow]
    n_ranks: int
    n_nodes: int
    n_channels: int
    latency_inter_s: float = 0.0
    """Largest physical latency among the plan's inter-node routes."""
    intra_hw: str = "nvlink"


def node_blocks(cluster: Cluster, members) -> list[list[int]]:
    """Members grouped by NVLink domain, domains in order of first appearance."""
    # (a member per domain is cached per member tuple: a data-parallel group of 10^3 nodes is
    # blocked for each of its plans and predictions; callers only read the lists)
    key = tuple(members)
    cache = cluster.router.__dict__.setdefault("_blocks_cache", {})
    hit = cache.get(key)
    if hit is not None:
        return hit
    D = cluster.nvlink_domain_size          # cluster.domain_of, inline: groups of 10^3 GPUs
    m = np.asarray(key, dtype=np.int64)
    if m.size > 1 and np.unique(m // D).size == m.size:
        out = cache[key] = [[g] for g in m.tolist()]     # a member per domain (data parallelism across nodes)
        return out
    blocks: dict[int, list[int]] = {}
    for g in key:
        blocks.setdefault(g // D, []).append(g)
    return list(blocks.values())


def _concat(cluster: Cluster, edges, pxn: bool = True):
    """The edges' routes end to end, and the largest inter-node route latency (cached: a
    ring's all-gather, reduce-scatter and all-reduce plans walk the same edges)."""
    edges = tuple(edges)
    cache = cluster.router.__dict__.setdefault("_concat_cache", {})
    hit = cache.get((edges, pxn))
    if hit is not None:
        return hit
    if edges:
        ends = np.array(edges, dtype=np.int64)
        links, coefs, lens = cluster.router.routes_flat(ends[:, 0], ends[:, 1], pxn=pxn)
        D = cluster.nvlink_domain_size
        inter = ends[:, 0] // D != ends[:, 1] // D
        lat = max(cluster.router.path_latencies(links, coefs, lens)[inter].max(initial=0.0), 0.0)
        out = (links, coefs, float(lat))
    else:
        out = (np.empty(0, dtype=np.int64), np.empty(0), 0.0)
    cache[(edges, pxn)] = out
    return out


def prefetch_rings(cluster: Cluster, gpus: np.ndarray) -> None:
    """Route the ring edges of many groups of one GPU per NVLink domain (a row of GPUs
    each; other rows are left alone) in one batch, and keep each group's in :func:`_concat`'s
    cache: what :func:`ring_plan` of an all-reduce, all-gather or reduce-scatter asks for
    (one channel, the members in order and back to the first), the same arrays and latency
    bit for bit (routes and latencies are per edge), without routing 10^3 groups one by one."""
    g = np.asarray(gpus, dtype=np.int64)
    if g.ndim != 2 or g.shape[0] == 0 or g.shape[1] < 2:
        return
    D = cluster.nvlink_domain_size
    dom = np.sort(g // D, axis=1)
    g = g[(dom[:, 1:] != dom[:, :-1]).all(axis=1)]
    cache = cluster.router.__dict__.setdefault("_concat_cache", {})
    keys, rows = [], []
    for i, row in enumerate(g.tolist()):
        key = (tuple(zip(row, row[1:] + row[:1])), True)
        if key not in cache:
            keys.append(key)
            rows.append(i)
    if not rows:
        return
    src = g[rows]
    dst = np.roll(src, -1, axis=1)
    links, coefs, lens = cluster.router.routes_flat(src.ravel(), dst.ravel(), pxn=True)
    lat = cluster.router.path_latencies(links, coefs, lens).reshape(src.shape)
    inter = (src // D != dst // D)
    row_len = lens.reshape(src.shape).sum(axis=1)
    ends = np.cumsum(row_len)
    for key, a, b, lt, it in zip(keys, (ends - row_len).tolist(), ends.tolist(), lat, inter):
        cache[key] = (links[a:b], coefs[a:b], float(max(lt[it].max(initial=0.0), 0.0)))


MAX_RING_CHANNELS = 32
"""NCCL's cap on channels per communicator (``MAXCHANNELS``, 32 in NCCL 2.x,
``src/include/device.h``)."""


def _channels(cluster: Cluster, blocks, max_channels: int = MAX_RING_CHANNELS) -> list[list[int]]:
    """The channels of a ring or tree whose group spans NVLink domains: per channel, the
    GPU of each block (domain) where it enters the block.

    A channel crosses between domains on one rail, through its own NIC in every block
    (PXN relays the leaving hop onto the rail, NCCL's rail-matching): on rail ``r`` a
    block offers as many channels as its members have distinct rail-``r`` NICs -- one
    per rail in an 8-GPU server, one per compute tray in an NVL72 rack -- and the group
    gets the fewest any block offers.  Channels take the rails in turn, at most
    ``max_channels`` (default :data:`MAX_RING_CHANNELS`).  One block, blocks of one GPU, or hosts without NICs: one channel.
    """
    # (blocks are never empty: all of length one <=> their lengths sum to their number)
    if len(blocks) == 1 or cluster.nics_per_host == 0 or sum(map(len, blocks)) == len(blocks):
        return [[b[0] for b in blocks]]     # a block of one offers its member, the channel that follows
    offers = []                 # per block: rail -> entry GPUs, one per distinct NIC
    for b in blocks:
        by_rail: dict[int, list[int]] = {}
        seen: set[int] = set()
        for g in b:
            nic = cluster.nic_of(g)
            if nic not in seen:
                seen.add(nic)
                by_rail.setdefault(cluster.rail_of(g), []).append(g)
        offers.append(by_rail)
    common = sorted(set(offers[0]).intersection(*offers[1:]))
    if not common:              # no rail shared by every block: one channel, as the first GPU's rail
        rail = cluster.rail_of(blocks[0][0])
        return [[o[rail][0] if rail in o else b[0] for o, b in zip(offers, blocks)]]
    depth = {r: min(len(o[r]) for o in offers) for r in common}
    out = [[o[r][k] for o in offers] for k in range(max(depth.values())) for r in common if k < depth[r]]
    return out[:int(max_channels)]


def domain_spread(cluster: Cluster, block) -> tuple[np.ndarray, np.ndarray]:
    """Links and coefficients of traffic in which every member of ``block`` (GPUs of one
    scale-up domain) sends a byte spread evenly over its links to the other members: its
    switch port and the switch's port to it (coefficient 1), or, in a mesh, its links to each
    other member (``1/(k-1)`` each, see the module docstring)."""
    r = cluster.router
    if not r.mesh:
        links = np.concatenate([r.nvl_up[block], r.nvl_down[block]])
        return links, np.ones(links.size)
    b = np.asarray(block, dtype=np.int64)
    src, dst = np.repeat(b, b.size), np.tile(b, b.size)
    keep = src != dst
    links = r.mesh_out[src[keep], dst[keep] % cluster.nvlink_domain_size]
    return links, np.full(links.size, 1.0 / max(b.size - 1, 1))


def _mesh_ring(cluster: Cluster, blocks, entries, kind: str, root: int | None):
    """One ring channel over full-mesh domains: spread inside each domain of more than one
    member (:func:`domain_spread`), and from each domain's entry GPU to the next's across
    nodes (a chain from the root's domain for broadcast and reduce)."""
    parts = [domain_spread(cluster, b) for b in blocks if len(b) > 1]
    lat = 0.0
    if len(blocks) > 1:
        entries = list(entries)
        if kind in ("broadcast", "reduce"):
            first = next((i for i, b in enumerate(blocks) if root in b), 0)
            order = entries[first:] + entries[:first]
            edges = list(zip(order[:-1], order[1:]))
        else:
            edges = list(zip(entries, entries[1:] + entries[:1]))
        links, coefs, lat = _concat(cluster, edges)
        parts.append((links, coefs))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), lat


def _rotate(block: list[int], entry: int) -> list[int]:
    i = block.index(entry)
    return block[i:] + block[:i]


def ring_plan(cluster: Cluster, members, kind: str, root: int | None = None,
              max_channels: int = MAX_RING_CHANNELS) -> Plan:
    members = list(members)
    n = len(members)
    blocks = node_blocks(cluster, members)
    channels = _channels(cluster, blocks, max_channels)
    C = len(channels)
    per = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
           "broadcast": 1.0, "reduce": 1.0}[kind]
    flows, lat = [], 0.0
    mesh = cluster.router.mesh and len(blocks) < n
    for entries in channels:
        if mesh:                            # full-mesh domains: the channel spreads over their links
            links, coefs, l = _mesh_ring(cluster, blocks, entries, kind, root if root is not None else members[0])
            lat = max(lat, l)
            flows.append(ChannelFlow(links, coefs, per / C, inter_node=len(blocks) > 1))
            continue
        if len(blocks) == n:                # blocks of one: the ring visits the entries
            order = list(entries)
        else:
            order = [g for b, e in zip(blocks, entries) for g in (_rotate(b, e) if len(blocks) > 1 else b)]
        if kind in ("broadcast", "reduce"):
            r = order.index(root if root is not None else members[0])
            order = order[r:] + order[:r]
            edges = list(zip(order[:-1], order[1:]))
        else:
            edges = list(zip(order, order[1:] + order[:1]))
        links, coefs, l = _concat(cluster, edges)
        lat = max(lat, l)
        flows.append(ChannelFlow(links, coefs, per / C, inter_node=len(blocks) > 1))
    return Plan("ring", flows, n, len(blocks), C, lat)


def binary_tree(n: int) -> list[int]:
    """Parent of each rank 0..n-1 in an in-order binary tree whose interior ranks are odd.

    Rank ``r`` sits at position ``p = r + 1`` of the complete in-order tree over
    positions 1, 2, 3, ...; its height is the number of trailing zero bits of ``p``, so
    every odd position (even rank) is a leaf.  Positions beyond ``n`` are dropped and
    their surviving child is attached to the nearest surviving ancestor.
    """
    def up(p: int) -> int:
        h = (p & -p).bit_length() - 1
        return p + (1 << h) if (p >> h) & 3 == 1 else p - (1 << h)

    top = 1 << (n.bit_length() - 1)           # root position: largest power of two <= n
    parent = [-1] * n
    for r in range(n):
        p = r + 1
        if p == top:
            continue
        q = up(p)
        while q > n:
            q = up(q)
        parent[r] = q - 1
    return parent


def double_binary_tree(n: int) -> tuple[list[int], list[int]]:
    """Two binary trees over ranks 0..n-1; a rank is interior in at most one of them.

    Tree A has odd interior ranks (:func:`binary_tree`); tree B is the same tree over
    ranks shifted by one, so its interior ranks are even: every rank is a leaf in at
    least one tree, and each tree carries half the data (Sanders, Speck and Traeff,
    "Two-tree algorithms for full bandwidth broadcast, reduction and scan", 2009; the
    scheme NCCL 2.4 adopted).
    """
    a = binary_tree(n)
    b = [-1] * n
    for r in range(n):                          # rank r takes position (r + 1) % n of tree A
        pa = a[(r + 1) % n]
        b[r] = -1 if pa < 0 else (pa - 1) % n
    return a, b


def _tree_flows(cluster: Cluster, reps: list[int], chains: list[list[int]], share: float):
    """Two coupled flows (trees A and B) over node representatives plus intra-node chains."""
    flows, lat = [], 0.0
    spread = []
    if cluster.router.mesh:             # a chain up and down moves 2(k-1) link-bytes: 2/k on each mesh link
        spread = [(lk, cf * 2 * (len(ch) - 1) / len(ch)) for ch in chains if len(ch) > 1
                  for lk, cf in [domain_spread(cluster, ch)]]
        chains = []
    chain_edges = [e for ch in chains for i in range(len(ch) - 1) for e in ((ch[i + 1], ch[i]), (ch[i], ch[i + 1]))]
    for parent in double_binary_tree(len(reps)):
        edges = list(chain_edges)
        for child, par in enumerate(parent):
            if par >= 0:
                edges += [(reps[child], reps[par]), (reps[par], reps[child])]
        links, coefs, l = _concat(cluster, edges)
        if spread:
            links = np.concatenate([*(p[0] for p in spread), links])
            coefs = np.concatenate([*(p[1] for p in spread), coefs])
        lat = max(lat, l)
        flows.append(ChannelFlow(links, coefs, share, inter_node=True))
    return flows, lat


def tree_plan(cluster: Cluster, members, max_channels: int = MAX_RING_CHANNELS) -> Plan:
    members = list(members)
    blocks = node_blocks(cluster, members)
    channels = _channels(cluster, blocks, max_channels)
    C = len(channels)
    flows, lat = [], 0.0
    for entries in channels:
        chains = [_rotate(b, e) for b, e in zip(blocks, entries)]
        f, l = _tree_flows(cluster, [ch[0] for ch in chains], chains, 1.0 / (2 * C))
        flows += f
        lat = max(lat, l)
    return Plan("tree", flows, len(members), len(blocks), C, lat)


def _nvls_flow(cluster: Cluster, block: list[int]) -> ChannelFlow:
    r = cluster.router
    links = np.concatenate([r.nvl_up[block], r.nvl_down[block]])
    return ChannelFlow(links, np.ones(links.size), 1.0 + 1.0 / len(block))


def nvls_plan(cluster: Cluster, members) -> Plan:
    members = list(members)
    return Plan("nvls", [_nvls_flow(cluster, members)], len(members), 1, 1)


def nvls_tree_plan(cluster: Cluster, members) -> Plan:
    members = list(members)
    blocks = node_blocks(cluster, members)
    ppn = len(blocks[0])
    flows = [_nvls_flow(cluster, b) for b in blocks]
    lat = 0.0
    for i in range(ppn):
        reps = [b[i] for b in blocks]
        f, l = _tree_flows(cluster, reps, [], 1.0 / (2 * ppn))
        flows += f
        lat = max(lat, l)
    return Plan("nvls_tree", flows, len(members), len(blocks), ppn, lat)


def collnet_plan(cluster: Cluster, members, nvls: bool) -> Plan:
    """SHARP all-reduce across nodes (``collnet_direct``, or ``nvls`` when ``nvls``)."""
    members = list(members)
    blocks = node_blocks(cluster, members)
    ppn = len(blocks[0])
    r = cluster.router
    flows = []
    for b in blocks:
        if nvls:
            flows.append(_nvls_flow(cluster, b))
        elif ppn > 1:
            links, coefs = domain_spread(cluster, b)
            flows.append(ChannelFlow(links, coefs, 2.0 * (ppn - 1) / ppn))
    lat = 0.0
    for i in range(ppn):
        heads = [b[i] for b in blocks]
        nics = [cluster.nic_of(g) for g in heads]
        tree, depth = r.reduction_tree(nics, plane=i)
        links = [int(x) for g, n in zip(heads, nics)
                 for x in (r.pcie_up[g], r.nic_up[n], r.nic_down[n], r.pcie_down[g])] + tree
        lat = max(lat, 2 * (depth + cluster.link_latency[r.nic_up[nics[0]]]))
        flows.append(ChannelFlow(np.array(links, dtype=np.int64), np.ones(len(links)), 1.0 / ppn, inter_node=True))
    return Plan("nvls" if nvls else "collnet_direct", flows, len(members), len(blocks), ppn, lat)


def alltoall_plan(cluster: Cluster, members, sizes: np.ndarray) -> Plan:
    """``sizes[i, j]``: bytes member i sends to member j (bytes_per_byte holds them)."""
    members = list(members)
    blocks = node_blocks(cluster, members)
    m = np.asarray(members, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=float)
    off = ~np.eye(len(members), dtype=bool) & (sizes > 0)
    ii, jj = np.nonzero(off)                                  # row-major: (0, 1), (0, 2), ...
    routes = cluster.router.routes(m[ii], m[jj], pxn=True)
    D = cluster.nvlink_domain_size
    inter_a = m[ii] // D != m[jj] // D
    inter = inter_a.tolist()
    flows = [ChannelFlow(r.links, r.coefs, k, inter_node=x) for r, x, k in zip(routes, inter, sizes[ii, jj].tolist())]
    lat = 0.0
    if inter_a.any():           # the largest inter-node route latency (path_latency per route, batched)
        xr = [r for r, x in zip(routes, inter) if x]
        lat = max(lat, float(cluster.router.path_latencies(
            np.concatenate([r.links for r in xr]), np.concatenate([r.coefs for r in xr]),
            np.array([r.links.size for r in xr], dtype=np.int64)).max()))
    return Plan("direct", flows, len(members), len(blocks), 1, lat)


def p2p_plan(cluster: Cluster, src: int, dst: int) -> Plan:
    r = cluster.route(src, dst, pxn=True)
    inter = cluster.domain_of(src) != cluster.domain_of(dst)
    lat = cluster.router.path_latency(r) if inter else 0.0
    return Plan("direct", [ChannelFlow(r.links, r.coefs, 1.0, inter_node=inter)], 2, 2 if inter else 1, 1, lat)
