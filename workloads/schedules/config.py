"""Which (schedule, pp, num_microbatches, vpp) combinations are valid, and why.

Every rule names its source.  The field names in the errors are the user's
(``parallel.schedule``, ``parallel.pp``, ``parallel.vpp``); ``parallel.num_microbatches``
is derived as ``global_batch_size / (micro_batch_size * dp)``, so a user fixes it through
those three.
"""

from __future__ import annotations

from topologies import ConfigError

__all__ = ["SCHEDULE_NAMES", "default_vpp", "min_microbatches", "validate_schedule_config"]

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "dualpipe", "zb_v")
"""Registry keys, the scenario's ``parallel.schedule`` values (docs/scenarios.md)."""



def default_vpp(name: str) -> int:
    """Model chunks per stage when the scenario (or ``--vpp``) gives none: 2 for a V schedule
    (``zb_v``; the two chunks are what makes the V), 1 for every other one (DualPipe's two
    chunks are its own bidirectional placement, vpp 1)."""
    return 2 if name == "zb_v" else 1


_MB_HINT = " (num_microbatches = global_batch_size / (micro_batch_size * dp))"


def _check_name(name: object, where: str) -> None:
    if name not in SCHEDULE_NAMES:
        raise ConfigError(f"{where}.schedule", name,
                          f"unknown schedule; valid names: {', '.join(SCHEDULE_NAMES)}")


def _check_positive_int(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(field, value, "must be a positive integer")


def min_microbatches(name: str, pp: int, vpp: int = 1, *, where: str = "parallel") -> int:
    """Smallest number of micro-batches per step the schedule accepts.

    ==================  ========  ==================================================================
    schedule            minimum   rule and source
    ==================  ========  ==================================================================
    ``gpipe``           1         any m (GPipe, Huang et al. 2019)
    ``1f1b``            1         any m: Megatron-Core ``forward_backward_pipelining_without_
                                  interleaving`` clips the warm-up to ``min(pp - rank - 1, m)``
    ``interleaved_1f1b`` ``pp``   Megatron-Core ``forward_backward_pipelining_with_interleaving``
                                  requires ``pp <= microbatch_group_size_per_vp_stage <= m``
                                  and ``m % group`` to be 0 or ``>= pp``; the group size defaults
                                  to ``pp`` (``ModelParallelConfig.__post_init__``), so by default
                                  m must be a multiple of pp (checked by
                                  :func:`validate_schedule_config`)
    ``zb_h1``           ``pp``    the handcrafted ZB-H1 schedule (Qi et al. 2023, §2.1, Fig. 3)
                                  delays the ``W`` passes of stage s by s micro-batches behind a
                                  1F1B warm-up of ``pp - s - 1``; its closed-form bubble
                                  ``(p-1)(T_F + T_B - T_W)`` assumes every stage reaches the
                                  steady state, i.e. m >= p
    ``dualpipe``        ``2*pp``  deepseek-ai/DualPipe ``dualpipe.py`` ``step()`` asserts
                                  ``num_chunks % 2 == 0 and num_chunks >= num_ranks * 2`` (half the
                                  micro-batches enter from each end) and ``num_ranks % 2 == 0``
    ``zb_v``            ``pp``    PyTorch's ``ScheduleZBVZeroBubble`` builds its table for
                                  ``max(m, 2*pp - 1)`` micro-batches and drops the extra ones, so
                                  any m runs; below ``pp`` the V's warm-up is not even full and
                                  the schedule is pointless, as ZB-H1's is.  Zero bubble needs
                                  ``m >= 2*pp - 1``
    ==================  ========  ==================================================================

    ``vpp`` is accepted for symmetry with the other functions; no current rule depends on it.
    ``where`` prefixes the field names in errors.
    """
    _check_name(name, where)
    _check_positive_int(f"{where}.pp", pp)
    _check_positive_int(f"{where}.vpp", vpp)
    if name in ("gpipe", "1f1b"):
        return 1
    if name == "dualpipe":
        return 2 * pp
    return pp


def validate_schedule_config(name: str, pp: int, num_microbatches: int, vpp: int = 1, *,
                             microbatch_group_size: int | None = None, where: str = "parallel") -> None:
    """Raise ``ConfigError(field, value, rule)`` if the schedule cannot run this configuration.

    Parameters
    ----------
    name : str
        Schedule name, one of :data:`SCHEDULE_NAMES`.
    pp : int
        Pipeline-parallel degree.
    num_microbatches : int
        Micro-batches per step.
    vpp : int
        Model chunks per stage; must be 1 except for ``interleaved_1f1b``, which needs >= 2.
    microbatch_group_size : int, optional
        Interleaved only: Megatron-Core's ``microbatch_group_size_per_vp_stage``
        (micro-batches run back to back on one chunk); default ``pp``.
    where : str
        Prefix of the field names in errors (``"parallel"`` -> ``parallel.pp``, ...).

    Notes
    -----
    Rules beyond :func:`min_microbatches`:

    * ``vpp > 1`` needs ``interleaved_1f1b`` or ``zb_v``; ``interleaved_1f1b`` needs ``vpp >= 2``;
      ``zb_v`` needs ``vpp = 2`` (its two chunks per stage form the V)
      (Megatron-Core runs the non-interleaved schedule when no virtual size is set).
    * ``interleaved_1f1b`` needs ``pp >= 2`` (Megatron-Core uses the interleaved schedule
      only when ``pp > 1``; Megatron-LM's ``arguments.py`` further asks for ``pp > 2``
      when p2p overlap is disabled, a communication-batching limit we do not model).
    * ``dualpipe`` needs an even ``pp`` and an even number of micro-batches (DualPipe's
      ``step()`` asserts both).
    """
    _check_name(name, where)
    _check_positive_int(f"{where}.pp", pp)
    _check_positive_int(f"{where}.vpp", vpp)
    _check_positive_int(f"{where}.num_microbatches", num_microbatches)
    if name == "interleaved_1f1b":
        _check_interleaved(pp, num_microbatches, vpp, microbatch_group_size, where)
        return
    if name == "zb_v":
        _check_v(vpp, microbatch_group_size, where)
    else:
        _check_one_chunk(name, vpp, microbatch_group_size, where)
    if name == "dualpipe":
        _check_dualpipe(pp, num_microbatches, where)
    need = min_microbatches(name, pp, vpp, where=where)
    if num_microbatches < need:
        raise ConfigError(f"{where}.num_microbatches", num_microbatches,
                          f"schedule '{name}' with pp = {pp} needs num_microbatches >= {need}{_MB_HINT}")


def _check_one_chunk(name: str, vpp: int, microbatch_group_size: int | None, where: str) -> None:
    """A schedule other than ``interleaved_1f1b`` runs one model chunk per stage and has no
    micro-batch groups."""
    if vpp != 1:
        raise ConfigError(f"{where}.vpp", vpp,
                          "virtual pipeline stages (vpp > 1) need schedule 'interleaved_1f1b'; "
                          f"'{name}' runs vpp = 1")
    if microbatch_group_size is not None:
        raise ConfigError(f"{where}.microbatch_group_size", microbatch_group_size,
                          "applies to schedule 'interleaved_1f1b' only")


def _check_v(vpp: int, microbatch_group_size: int | None, where: str) -> None:
    """ZB-V holds exactly two model chunks per stage (PyTorch's ``ScheduleZBVZeroBubble``
    raises "ZBV requires exactly 2 stages per rank") and has no micro-batch groups."""
    if vpp != 2:
        raise ConfigError(f"{where}.vpp", vpp,
                          "schedule 'zb_v' runs exactly 2 model chunks per stage (the V); set vpp = 2 "
                          "or leave vpp out (it defaults to 2 for zb_v)")
    if microbatch_group_size is not None:
        raise ConfigError(f"{where}.microbatch_group_size", microbatch_group_size,
                          "applies to schedule 'interleaved_1f1b' only")


def _check_interleaved(pp: int, m: int, vpp: int, microbatch_group_size: int | None, where: str) -> None:
    """Megatron-Core's rules for the interleaved schedule (see :func:`min_microbatches` and
    :func:`validate_schedule_config`)."""
    mb_field = f"{where}.num_microbatches"
    if vpp < 2:
        raise ConfigError(f"{where}.vpp", vpp,
                          "schedule 'interleaved_1f1b' needs vpp >= 2 model chunks per stage; "
                          "use '1f1b' for vpp = 1")
    if pp < 2:
        raise ConfigError(f"{where}.pp", pp, "schedule 'interleaved_1f1b' needs pp >= 2")
    group = pp if microbatch_group_size is None else microbatch_group_size
    if microbatch_group_size is not None:
        _check_positive_int(f"{where}.microbatch_group_size", microbatch_group_size)
        if group < pp:
            raise ConfigError(f"{where}.microbatch_group_size", group,
                              f"must be >= pp = {pp} (Megatron-Core interleaved schedule)")
    if m < group:
        raise ConfigError(mb_field, m,
                          f"schedule 'interleaved_1f1b' needs at least {group} micro-batches "
                          f"(Megatron-Core: pp = {pp} <= microbatch_group_size_per_vp_stage = {group} "
                          f"<= num_microbatches){_MB_HINT}")
    if 0 < m % group < pp:
        rule = (f"must be a multiple of pp = {pp}" if group == pp else
                f"m % microbatch_group_size = {m % group} must be 0 or >= pp = {pp}")
        raise ConfigError(mb_field, m,
                          f"schedule 'interleaved_1f1b' (Megatron-Core, microbatch_group_size_per_vp_stage "
                          f"= {group}): {rule}{_MB_HINT}")


def _check_dualpipe(pp: int, m: int, where: str) -> None:
    """DualPipe's ``step()`` asserts an even ``pp`` and an even number of micro-batches."""
    if pp % 2:
        raise ConfigError(f"{where}.pp", pp,
                          "schedule 'dualpipe' needs an even pp (ranks pair up from both ends)")
    if m % 2:
        raise ConfigError(f"{where}.num_microbatches", m,
                          f"schedule 'dualpipe' needs an even number of micro-batches "
                          f"(half enter from each end){_MB_HINT}")
