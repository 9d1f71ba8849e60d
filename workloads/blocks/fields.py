"""Validation of a model's fields and of the block modules' sub-specifications (``moe``,
``mla``, ``mamba``, ``gated_deltanet``): every error is a :class:`~topologies.ConfigError`
naming the field, the value and the rule."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping

from topologies import ConfigError
from topologies.errors import check_keys

__all__ = ["bool_field", "build", "choice_field", "int_field", "relabel", "set_field", "sub_spec"]


def int_field(where: str, key: str, v, minimum: int = 1, optional: bool = False) -> int | None:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum:
        raise ConfigError(f"{where}.{key}", v, f"must be an integer >= {minimum}")
    return int(v)


def bool_field(where: str, key: str, v) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{where}.{key}", v, "must be true or false")
    return v


def choice_field(where: str, key: str, v, choices: tuple[str, ...]) -> str:
    if v not in choices:
        raise ConfigError(f"{where}.{key}", v, f"must be one of {', '.join(choices)}")
    return v


def set_field(obj, key: str, value) -> None:
    # frozen dataclass: __post_init__ normalises its own fields (defaults, int coercion)
    object.__setattr__(obj, key, value)


def relabel(err: ConfigError, old: str, new: str) -> ConfigError:
    """The same error with the field prefix ``old`` replaced by ``new``."""
    if old == new or not (err.field == old or err.field.startswith(old + ".")):
        return err
    return ConfigError(new + err.field[len(old):], err.value, err.rule)


def sub_spec(cls, d, required: tuple[str, ...], default_where: str, where: str):
    """A sub-specification (``moe``, ``mla``, ``mamba``) from its YAML mapping: a mapping,
    no unknown keys, the ``required`` ones present, then the dataclass's own checks with
    their field names under ``where``."""
    if not isinstance(d, Mapping):
        raise ConfigError(where, d, f"expected a mapping of {cls.__name__} fields")
    check_keys(d, [f.name for f in dataclasses.fields(cls)], where)
    for key in required:
        if key not in d:
            raise ConfigError(f"{where}.{key}", None, "required")
    return build(cls, dict(d), default_where, where)


def build(cls, kw: dict, default_where: str, where: str):
    try:
        return cls(**kw)
    except ConfigError as e:
        raise relabel(e, default_where, where) from None
