"""Model specs, parallel configurations, schedules, cost and memory models (issues 3-4).

Empty until the workloads issues land; it may import only from ``topologies``.
"""

__all__: list[str] = []
