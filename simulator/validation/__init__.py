"""Validation against measured runs: read a table of published or vTrain runs, map every
row to a scenario, simulate it and report predicted against measured step time.

Four modules, each importing only the ones before it:

* :mod:`.ingest` -- the input formats and their columns, cell parsing, :func:`load_runs`,
  the :class:`Unsupported` / :class:`InvalidRow` row errors;
* :mod:`.mapping` -- a row -> a scenario (:func:`row_to_scenario`; its docstring is the
  column-by-column mapping and the framework defaults);
* :mod:`.evaluate` -- the measured step time and FLOP conventions of a row, the simulation
  of a row, :func:`validate` and :func:`write_csv`;
* :mod:`.report` -- :func:`summary` statistics and the ``clustersim validate`` command
  (:func:`main`).
"""

from .evaluate import (BREAKDOWN_COLUMNS, NOTE_SEP, OUTPUT_COLUMNS, measured_step, source_convention, validate,
                       write_csv)
from .ingest import FORMATS, PUBLISHED_COLUMNS, VTRAIN_COLUMNS, InvalidRow, Unsupported, detect_format, load_runs
from .mapping import (FRAMEWORKS, edge_stage_split, map_gpu, map_model, map_precision, model_from_dimensions,
                      row_to_scenario)
from .report import main, summary

__all__ = ["FORMATS", "FRAMEWORKS", "NOTE_SEP", "BREAKDOWN_COLUMNS", "OUTPUT_COLUMNS", "PUBLISHED_COLUMNS",
           "VTRAIN_COLUMNS", "InvalidRow", "Unsupported", "detect_format", "edge_stage_split", "load_runs", "main",
           "map_gpu", "map_model", "map_precision", "measured_step", "model_from_dimensions", "row_to_scenario",
           "source_convention", "summary", "validate", "write_csv"]
