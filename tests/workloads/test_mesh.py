"""RankGrid against a naive nested-loop oracle and Megatron-Core's rank-generation rule."""

import math

import pytest

from topologies import ConfigError
from workloads.mesh import GROUP_AXES, RankGrid
from workloads.parallel import ParallelConfig


def megatron_groups(world_size, sizes, mask):
    """Megatron-Core's generate_masked_orthogonal_rank_groups, written from its description:
    group ``g`` enumerates the masked axes (first axis fastest) at the unmasked coordinates
    given by the mixed-radix digits of ``g``."""
    def digits(index, shape):
        out = []
        for s in shape:
            out.append(index % s)
            index //= s
        return out

    strides = [math.prod(sizes[:i]) for i in range(len(sizes))]
    masked = [(s, st) for s, st, m in zip(sizes, strides, mask) if m]
    unmasked = [(s, st) for s, st, m in zip(sizes, strides, mask) if not m]
    group_size = math.prod(s for s, _ in masked)
    groups = []
    for g in range(world_size // group_size):
        base = sum(d * st for d, (_, st) in zip(digits(g, [s for s, _ in unmasked]), unmasked))
        groups.append(tuple(base + sum(d * st for d, (_, st) in zip(digits(r, [s for s, _ in masked]), masked))
                            for r in range(group_size)))
    return groups


def naive_groups(grid, mesh, axes):
    """Nested loops over all ranks: group = ranks equal on every axis not in ``axes``."""
    buckets = {}
    for r in range(grid.world_size):
        c = grid.coords(r, mesh)
        key = tuple(c[a] for a in grid.order if a not in axes)
        buckets.setdefault(key, []).append(r)
    return sorted(tuple(sorted(v)) for v in buckets.values())


CONFIGS = [
    ParallelConfig(tp=2, pp=4, dp=2),                                      # Megatron's docstring example
    ParallelConfig(tp=2, cp=2, dp=2, pp=2, mesh_order="tp-cp-ep-dp-pp"),
    ParallelConfig(tp=2, dp=4, pp=2, ep=4, etp=1),                         # MoE folding, etp != tp (edp = 2)
    ParallelConfig(tp=4, dp=2, pp=2, cp=2, ep=2, etp=2, mesh_order="tp-dp-ep-cp-pp"),
]


def test_megatron_docstring_example():
    g = RankGrid(CONFIGS[0])
    assert g.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15)]
    assert g.groups("dp") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert g.groups("pp") == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]
    assert g.coords(13) == {"tp": 1, "cp": 0, "ep": 0, "dp": 0, "pp": 3}
    assert g.embedding_group(5) == (1, 13) and g.pp_neighbour(5) == 9 and g.pp_neighbour(13) is None


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("kind", list(GROUP_AXES))
def test_groups_match_oracles(cfg, kind):
    grid = RankGrid(cfg)
    mesh, axes = GROUP_AXES[kind]
    mine = grid.groups(kind)
    assert sorted(tuple(sorted(x)) for x in mine) == naive_groups(grid, mesh, axes)
    sizes = [grid.sizes[mesh][a] for a in grid.order]
    assert mine == megatron_groups(grid.world_size, sizes, [a in axes for a in grid.order])
    for grp in mine:                       # group(kind, rank) agrees for every member
        for r in grp:
            assert grid.group(kind, r) == grp


def test_moe_folding_groups():
    grid = RankGrid(CONFIGS[2])            # tp 2, dp 4, pp 2; expert: etp 1, ep 4, edp 2
    assert CONFIGS[2].expert_dp == 2
    assert grid.groups("ep")[:2] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert grid.groups("edp")[:2] == [(0, 4), (1, 5)]
    assert grid.groups("dp_cp")[:2] == [(0, 2, 4, 6), (1, 3, 5, 7)]
    # the two meshes cover the same ranks and agree on the pipeline stage
    for r in range(16):
        assert grid.coords(r, "dense")["pp"] == grid.coords(r, "expert")["pp"]


def test_placement_and_bad_input():
    cfg = ParallelConfig(tp=2, dp=2)
    grid = RankGrid(cfg, placement=[3, 2, 1, 0])
    assert grid.gpus(grid.group("tp", 0)) == (3, 2)
    with pytest.raises(ConfigError, match="placement"):
        RankGrid(cfg, placement=[0, 0, 1, 2])
    with pytest.raises(ConfigError, match="unknown group kind"):
        grid.groups("xx")
