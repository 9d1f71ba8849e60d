"""The kernel-stack interface: how one training framework runs the blocks' kernels.

A block (:mod:`workloads.blocks`) says what a layer family computes; a kernel stack says how
a framework runs it: which collectives sit between the kernels (the lowering of each block
kind, per parallel axis), how each op is issued relative to compute
(:class:`workloads.ops.Issue`: the framework's overlap rules), and how one pipeline stage's
program is assembled from the schedule.  :func:`workloads.program.build_program` takes a stack
by name (the scenario's ``framework``); the engine and the estimator read what it produced.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from topologies import ConfigError

from ..blocks.fusion import Fusion

__all__ = ["KernelStack"]


@dataclass(frozen=True)
class KernelStack:
    """One framework's way of running the blocks (see the module docstring)."""

    name: str
    """The scenario's ``framework`` value."""
    summary: str
    """One line for listings."""
    sources: str
    """Where the stack's rules are read from (framework repositories and versions)."""
    fusion: Fusion
    """The framework's kernel-level choices the blocks read (which kernels fuse, how many a
    step launches: :class:`workloads.blocks.fusion.Fusion`)."""
    lowering: Mapping[str, tuple[Callable, Callable]]
    """Block kind -> (forward, backward) lowering: the block's compute segments with the
    collectives around them."""
    stage_program: Callable
    """``(ctx, stage, tokens) -> list[Op]``: one pipeline stage's ops in program order."""
    assign_issue_modes: Callable
    """``(ops, overlap) -> ops``: the issue mode of every op under the overlap switches."""
    kernel_rows: Callable
    """``(ctx, layer, tokens_per_expert, recompute) -> rows``: one layer's kernels with the
    program segment each runs in (what ``clustersim run --per-kernel`` writes)."""
    segment_key: Callable
    """``(ctx, layer, tokens_per_expert, recompute) -> key``: equal keys, equal kernel rows."""
    check_layout: Callable
    """``(model, parallel, schedule, *, moe_ep_overlap) -> None``: what the framework refuses
    (or clustersim does not model for it) in a layout, as ConfigErrors, before any work."""
    options: Callable | None = None
    """``(raw mapping or None) -> options``: the stack's own scenario section (named after the
    stack, e.g. ``deepspeed``) parsed, ConfigErrors for bad entries; None: the stack has none."""

    def parse_options(self, raw):
        """The stack's own settings from ``raw`` (the scenario's section named after the stack;
        None: its defaults); a stack without :attr:`options` refuses any."""
        if self.options is not None:
            return self.options(raw)
        if raw:
            raise ConfigError("framework", self.name, "takes no options of its own")
        return None

    def check_blocks(self, kinds) -> None:
        """Refuse, before any work, a model with a block kind the stack does not lower."""
        for kind in kinds:
            if kind not in self.lowering:
                raise ConfigError("framework", self.name, f"does not run {kind!r} blocks (it lowers: "
                                                          f"{', '.join(self.lowering)})")
