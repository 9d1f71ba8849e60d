"""clustersim: a discrete-event simulator of large-model training clusters.

The public API, for scripts and notebooks::

    >>> from simulator import run
    >>> res = run({"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    ...            "parallel": {"tp": 2, "pp": 2, "dp": 2, "global_batch_size": 8, "seq_len": 1024}})
    >>> round(res.metrics["step_time_s"], 6) > 0
    True

The package is built in rooms, each importing only the rooms below it (docs/design.md):

=============  ===========================================================================
room           what it holds
=============  ===========================================================================
scenario       the user's description, loaded and checked (:func:`load_scenario`, what-ifs)
network        flows sharing links max-min fairly on a simpy clock
collectives    NCCL's algorithms, protocols and costs as flows on the network
engine         the step simulated: actors per rank cell, folding, what-ifs applied, metrics
report         Gantt charts, breakdown bars, Perfetto traces
explore        the analytic estimator, configuration search, sweeps
validation     predicted against measured step times of published runs
cli            the ``clustersim`` command
=============  ===========================================================================
"""

import importlib

# name -> the module that defines it; imported on first use (PEP 562), so that
# ``import simulator.cli`` or ``import simulator.network`` does not pay for pandas, the
# estimator and the search
_API = {
    "run": "simulator.engine", "Result": "simulator.engine", "SimulationError": "simulator.engine",
    "DeadlockError": "simulator.engine", "JobStopped": "simulator.engine", "Folding": "simulator.engine",
    "load_scenario": "simulator.scenario", "Scenario": "simulator.scenario", "WhatIf": "simulator.scenario",
    "estimate": "simulator.explore", "search": "simulator.explore", "SearchSpec": "simulator.explore",
    "gantt": "simulator.report", "breakdown_bar": "simulator.report", "to_chrome_trace": "simulator.report",
    "FlowNetwork": "simulator.network", "CollectiveEngine": "simulator.collectives",
    "Calibration": "simulator.collectives", "get_calibration": "simulator.collectives",
    "ConfigError": "topologies",
}

__all__ = list(_API)


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API))
