"""The scenario: what the user describes (model, cluster, parallel layout, precision,
overlap switches, host, MoE routing, what-ifs), loaded from YAML or a mapping and checked
as a whole before anything runs."""

from .load import APPROXIMATIONS, OVERLAP_DEFAULTS, Scenario, load_scenario, read_yaml
from .whatif import WHATIF_KEYS, WhatIf

__all__ = ["Scenario", "load_scenario", "read_yaml", "OVERLAP_DEFAULTS", "APPROXIMATIONS", "WhatIf", "WHATIF_KEYS"]
