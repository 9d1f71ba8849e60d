"""Parse human quantities into SI floats at the edges; format them for reports.

Inside clustersim everything is SI: seconds, bytes, bytes/s, FLOP, FLOP/s.
Bandwidth strings say bits or bytes explicitly: ``"400 Gb/s"`` is 400e9 bits/s
= 50e9 bytes/s, ``"450 GB/s"`` is 450e9 bytes/s.  Decimal prefixes (k, M, G, T)
are powers of 1000; binary prefixes (Ki, Mi, Gi, Ti) are powers of 1024.
"""

from __future__ import annotations

import re

from .errors import ConfigError

__all__ = ["parse_bandwidth", "parse_time", "parse_size", "fmt_bytes", "fmt_time", "fmt_bw"]

_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_BW_RE = re.compile(_NUM + r"\s*(Ki|Mi|Gi|Ti|[kKMGTP]?)(B|b)(?:/s|ps)$")
_SIZE_RE = re.compile(_NUM + r"\s*(Ki|Mi|Gi|Ti|[kKMGTP]?)B?$")
_TIME_RE = re.compile(_NUM + r"\s*(ns|us|µs|ms|s|min|h)$")
_TIME_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def _number(value, field: str) -> float | None:
    if isinstance(value, bool):
        raise ConfigError(field, value, "expected a number or a quantity string")
    if isinstance(value, (int, float)):
        return float(value)
    return None


def parse_bandwidth(value, field: str = "bandwidth") -> float:
    """Bandwidth in bytes/s from a number (already bytes/s) or a string.

    >>> parse_bandwidth("400 Gb/s")
    50000000000.0
    >>> parse_bandwidth("450 GB/s")
    450000000000.0
    """
    x = _number(value, field)
    if x is None:
        m = _BW_RE.match(str(value).strip())
        if not m:
            raise ConfigError(field, value, "expected bytes/s or a string like '400 Gb/s' or '450 GB/s'")
        x = float(m.group(1)) * _PREFIX[m.group(2)] / (8.0 if m.group(3) == "b" else 1.0)
    if not x > 0:
        raise ConfigError(field, value, "bandwidth must be positive")
    return x


def parse_size(value, field: str = "size") -> float:
    """Size in bytes from a number or a string like '80 GiB' or '64MiB'."""
    x = _number(value, field)
    if x is None:
        m = _SIZE_RE.match(str(value).strip())
        if not m:
            raise ConfigError(field, value, "expected bytes or a string like '80 GiB'")
        x = float(m.group(1)) * _PREFIX[m.group(2)]
    if x < 0:
        raise ConfigError(field, value, "size must be non-negative")
    return x


def parse_time(value, field: str = "time") -> float:
    """Time in seconds from a number (seconds) or a string like '5 us'."""
    x = _number(value, field)
    if x is None:
        m = _TIME_RE.match(str(value).strip())
        if not m:
            raise ConfigError(field, value, "expected seconds or a string like '5 us'")
        x = float(m.group(1)) * _TIME_UNIT[m.group(2)]
    if x < 0:
        raise ConfigError(field, value, "time must be non-negative")
    return x


def fmt_bytes(x: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def fmt_time(x: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if x >= scale:
            return f"{x / scale:.4g} {unit}"
    return f"{x / 1e-9:.4g} ns"


def fmt_bw(x: float) -> str:
    return f"{x / 1e9:.4g} GB/s"
