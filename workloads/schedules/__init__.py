"""Pipeline schedules as data: per-stage action tables, their text form, validation and timing.

``get_schedule(name)(pp, num_microbatches, vpp)`` returns a :class:`Schedule`; ``validate``
checks it; ``schedule_timing`` gives the longest-path times and the bubble under given
per-action costs; ``peak_in_flight`` counts held activations; ``format_table`` prints it.
"""

from .actions import (
    Action,
    ActionKind,
    Schedule,
    ScheduleError,
    format_action,
    model_chunk,
    parse_action,
    route,
)
from .config import SCHEDULE_NAMES, default_vpp, min_microbatches, validate_schedule_config
from .registry import SCHEDULES, get_schedule
from .table import format_legend, format_table
from .timing import ActionCosts, ScheduleTiming, peak_in_flight, schedule_timing
from .validate import validate

__all__ = [
    "SCHEDULES",
    "SCHEDULE_NAMES",
    "Action",
    "ActionCosts",
    "ActionKind",
    "Schedule",
    "ScheduleError",
    "ScheduleTiming",
    "default_vpp",
    "format_action",
    "format_legend",
    "format_table",
    "get_schedule",
    "min_microbatches",
    "model_chunk",
    "parse_action",
    "peak_in_flight",
    "route",
    "schedule_timing",
    "validate",
    "validate_schedule_config",
]
