"""Beyond one step: time to train and goodput under failures, checkpoints and restarts
(:mod:`.model`), with interruption rates per component (:mod:`.rates`)."""

from .model import (FailureCause, GoodputResult, RunModel, RunOutcome, daly_expected_wall_s, daly_optimal_interval_s,
                    monte_carlo, no_spares_expected_wall_s, simulate_run, young_interval_s)
from .rates import LLAMA3_CAUSES

__all__ = ["FailureCause", "GoodputResult", "RunModel", "RunOutcome", "LLAMA3_CAUSES", "daly_expected_wall_s",
           "daly_optimal_interval_s", "monte_carlo", "no_spares_expected_wall_s", "simulate_run", "young_interval_s"]
