"""The layer-family blocks (workloads/blocks/): the modules that build a step ask them
instead of branching on a family, and a layer's blocks add up to the layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from workloads import ParallelConfig, load_model
from workloads.blocks import BLOCK_CLASSES, layer_blocks
from workloads.model import HYBRID_SYMBOLS
from workloads.model_loading import MODEL_PRESETS

ROOT = Path(__file__).resolve().parents[2]

FAMILY_FREE = ("workloads/costs/flops.py", "workloads/memory.py", "workloads/program.py")
"""Modules that must reach every layer family through the blocks (the kernel stack's
lowering, :mod:`workloads.stacks`, is where a framework's per-family rules live)."""

SUB_SPECS = {"moe", "mla", "mamba"}
SPEC_CLASSES = {"MoESpec", "MLASpec", "MambaSpec"}
FAMILY_NAMES = set(BLOCK_CLASSES) | {"transformer", "hybrid"}


def family_branches(path: Path) -> list[str]:
    """Where ``path`` touches a family directly: a sub-spec attribute (``model.moe``), an import
    of a sub-spec class, a comparison with a family name, or a call of ``is_moe_layer``."""
    tree = ast.parse(path.read_text(), str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in SUB_SPECS | {"is_moe_layer"}:
            bad.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and any(a.name in SPEC_CLASSES for a in node.names):
            bad.append(f"{path.name}:{node.lineno}: imports a family sub-spec")
        elif isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if isinstance(side, ast.Constant) and side.value in FAMILY_NAMES:
                    bad.append(f"{path.name}:{node.lineno}: compares with {side.value!r}")
    return bad


@pytest.mark.parametrize("module", FAMILY_FREE)
def test_module_asks_the_blocks_instead_of_branching_on_a_family(module):
    assert family_branches(ROOT / module) == []


def test_the_check_catches_each_kind_of_branch(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from x import MoESpec\n"
                   "def f(model, i):\n"
                   "    if model.layer_kind(i) == 'mamba' or model.mla is not None:\n"
                   "        return model.is_moe_layer(i)\n")
    assert len(family_branches(src)) == 4


def test_hybrid_symbols_name_registered_blocks():
    assert set(HYBRID_SYMBOLS.values()) <= set(BLOCK_CLASSES)


@pytest.mark.parametrize("name", MODEL_PRESETS)
def test_blocks_add_up_to_the_layer(name):
    """Each layer's parameters are its blocks' plus one pre-norm per block; a plain layer is a
    mixer and a feed-forward block, a hybrid layer one block of the kind its symbol names."""
    m = load_model(name)
    norm = (2 if m.norm == "layernorm" else 1) * m.hidden_size
    for i in sorted({0, m.num_layers - 1, *range(m.num_layers, m.num_layers + m.mtp_layers)}):
        blocks = layer_blocks(m, i)
        if m.is_hybrid and i < m.num_layers:
            assert [b.kind for b in blocks] == [HYBRID_SYMBOLS[m.hybrid_override_pattern[i]]]
        else:
            assert blocks[0].ffn_width() is None and blocks[1].ffn_width() is not None   # a mixer, then a feed-forward block
        total = sum(sum(b.params().values()) for b in blocks) + norm * len(blocks)
        assert total == m.layer_num_params(i)


def test_rank_params_of_one_rank_scale_with_tp():
    """GEMM weights split over TP: at tp 2 a dense MLP block holds half its weights."""
    m = load_model("llama3-8b")
    mlp = layer_blocks(m, 0)[1]
    one = mlp.rank_params(ParallelConfig(tp=1, pp=1, dp=1))
    two = mlp.rank_params(ParallelConfig(tp=2, pp=1, dp=1))
    assert two.gemm == one.gemm / 2 and one.gemm == mlp.params()["mlp"]


def test_kernels_have_typed_descriptors():
    """GEMMs, fused attention and memory-bound kernels as typed records; a windowed layer's
    attention says so."""
    from workloads.blocks.kernels import AttentionShape, Gemm, MemoryBound
    from workloads.costs.flops import layer_ops
    m = load_model("gpt-oss-20b")
    par = ParallelConfig(tp=2, pp=1, dp=1, ep=1, etp=1, sequence_parallel=True, micro_batch_size=2,
                         global_batch_size=2, seq_len=4096)
    ops = {(o.name, o.phase): o for o in layer_ops(m, par, 0)}
    assert ops[("qkv_proj", "F")].descriptor == Gemm(2 * 4096, (64 // 2 + 2 * 8 // 2) * 64, m.hidden_size)
    attn = ops[("core_attn", "F")].descriptor
    assert isinstance(attn, AttentionShape)
    assert (attn.batch, attn.heads, attn.kv_heads, attn.q_len, attn.mask, attn.window) == (2, 32, 4, 4096, "window", 128)
    assert layer_ops(m, par, 1)[0].descriptor == MemoryBound(ops[("attn_norm", "F")].mem_bytes, "attn_norm")
    assert next(o for o in layer_ops(m, par, 1) if o.name == "core_attn").descriptor.mask == "causal"


def test_layer_blocks_follow_the_model_asked_about():
    """layer_blocks keeps the last model's blocks by identity: asking about models in turn,
    or about an equal copy, gives each model's own blocks (those of the cached function)."""
    import copy

    from workloads.blocks.layers import _layer_blocks, layer_blocks
    from workloads.model_loading import load_model

    dense, moe = load_model("llama3.1-8b"), load_model("deepseek-v3")
    for model in (dense, moe, dense, copy.deepcopy(moe), moe):
        for i in (0, 3, model.num_layers - 1):
            assert layer_blocks(model, i) == _layer_blocks(model, i)
            assert [b.kind for b in layer_blocks(model, i)] == [b.kind for b in _layer_blocks(model, i)]
    assert layer_blocks(moe, 5)[-1].kind != layer_blocks(dense, 5)[-1].kind
