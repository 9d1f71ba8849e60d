"""Validation against measured runs: read a table of published or vTrain runs, map every
row to a scenario, simulate it and report predicted against measured step time."""

from .core import (BREAKDOWN_COLUMNS, FORMATS, FRAMEWORKS, NOTE_SEP, OUTPUT_COLUMNS, PUBLISHED_COLUMNS, VTRAIN_COLUMNS,
                   InvalidRow, Unsupported, detect_format, edge_stage_split, load_runs, main, map_gpu, map_model,
                   map_precision, measured_step, model_from_dimensions, row_to_scenario, source_convention, summary,
                   validate, write_csv)

__all__ = ["FORMATS", "FRAMEWORKS", "NOTE_SEP", "BREAKDOWN_COLUMNS", "OUTPUT_COLUMNS", "PUBLISHED_COLUMNS",
           "VTRAIN_COLUMNS", "InvalidRow", "Unsupported", "detect_format", "edge_stage_split", "load_runs", "main",
           "map_gpu", "map_model", "map_precision", "measured_step", "model_from_dimensions", "row_to_scenario",
           "source_convention", "summary", "validate", "write_csv"]
