"""Errors for bad user input.

`ConfigError` lives in the lowest layer so that every package can raise it; the
CLI prints it on one line and exits 2.
"""

from __future__ import annotations

import difflib

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """Bad input: names the field, the offending value and the rule it breaks.

    >>> str(ConfigError("cluster.num_nodes", 0, "must be a positive integer"))
    'cluster.num_nodes = 0: must be a positive integer'
    """

    def __init__(self, field: str, value: object, rule: str):
        self.field = field
        self.value = value
        self.rule = rule
        super().__init__(f"{field} = {value!r}: {rule}")


def check_keys(mapping: dict, allowed, where: str) -> None:
    """Raise ConfigError for the first key of `mapping` not in `allowed`."""
    allowed = set(allowed)
    for key in mapping:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), sorted(map(str, allowed)), n=1, cutoff=0.6)
            hint = f"did you mean '{near[0]}'? " if near else ""
            raise ConfigError(f"{where}.{key}" if where else str(key), mapping[key],
                              f"unknown key; {hint}valid keys: {', '.join(sorted(allowed))}")
