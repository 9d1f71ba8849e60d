"""The schedule registry: ``SCHEDULES[name](pp, num_microbatches, vpp) -> Schedule``."""

from __future__ import annotations

from collections.abc import Callable

from topologies import ConfigError

from .actions import Schedule
from .config import SCHEDULE_NAMES
from .dualpipe import dualpipe
from .gpipe import gpipe
from .interleaved import interleaved_1f1b
from .one_f_one_b import one_f_one_b
from .zero_bubble import zb_h1, zb_v

__all__ = ["SCHEDULES", "get_schedule"]

SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved_1f1b": interleaved_1f1b,
    "zb_h1": zb_h1,
    "dualpipe": dualpipe,
    "zb_v": zb_v,
}
"""Schedule generators by ``parallel.schedule`` name; each is a pure function
``(pp, num_microbatches, vpp=1) -> Schedule`` that validates its arguments."""

assert tuple(SCHEDULES) == SCHEDULE_NAMES  # one list of names: config.py's


def get_schedule(name: str) -> Callable[..., Schedule]:
    """The generator registered as ``name``.

    Raises
    ------
    ConfigError
        ``parallel.schedule`` is not a registered name; the message lists the valid ones.
    """
    try:
        return SCHEDULES[name]
    except (KeyError, TypeError):
        raise ConfigError("parallel.schedule", name,
                          f"unknown schedule; valid names: {', '.join(SCHEDULES)}") from None
