"""What people look at: Gantt charts (:mod:`.gantt_chart`), step-time breakdown bars and
validation scatters (:mod:`.charts`), both drawn with colours from :mod:`.style` and with
matplotlib imported only when drawing; Perfetto traces and timeline files (:mod:`.trace`)."""

from .charts import breakdown_bar, validation_scatter
from .gantt_chart import gantt
from .trace import read_timeline, to_chrome_trace, write_chrome, write_timeline

__all__ = ["gantt", "breakdown_bar", "validation_scatter", "to_chrome_trace", "write_chrome", "write_timeline",
           "read_timeline"]
