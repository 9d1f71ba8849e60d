"""What people look at: Gantt charts, breakdown bars and validation scatters
(:mod:`.plots`, matplotlib imported only when drawing), Perfetto traces and timeline files
(:mod:`.trace`)."""

from .plots import breakdown_bar, gantt, validation_scatter
from .trace import read_timeline, to_chrome_trace, write_chrome, write_timeline

__all__ = ["gantt", "breakdown_bar", "validation_scatter", "to_chrome_trace", "write_chrome", "write_timeline",
           "read_timeline"]
