"""The constants a prediction reads, as one immutable object: :class:`Constants`.

The numbers that shape a step-time prediction (GEMM and attention efficiencies, HBM and
launch costs, NCCL's latency tables, link rates, the engine's overlap slowdown ...) are
defined, with their sources, as module attributes next to the code that uses them
(``workloads.costs.compute.HBM_EFFICIENCY``, ``topologies.specs.GPU_SPECS`` ...).  Those
attributes are the documented *defaults* and are never changed at run time.  A
:class:`Constants` object is a set of overrides on top of them, named as the registry in
:mod:`simulator.validation.constants` names them: ``package.module.ATTR``, or
``package.module.TABLE[*].field`` for one field of every value of a table (then the
override is a ``{key: field value}`` mapping over the whole table).  :data:`DEFAULT`
overrides nothing.  ``c.replace(name, value)`` and ``c.scaled(name, factor)`` return new
objects; a :class:`Constants` is picklable, so it can be handed to worker processes.

How a run's constants reach the code that reads them:

* explicitly where the path is short: ``simulator.engine.run(..., constants=c)`` hands
  ``c`` to the collective engine (``CollectiveEngine(..., constants=c)``: default
  calibration, NCCL tables, tiny-call threshold) and reads the engine's own
  ``COMM_SLOWDOWN`` from it; cost models take it at construction
  (``RooflineComputeModel(..., constants=c)``) and keep it;
* through a context variable everywhere else: ``run`` installs ``c`` as the *active*
  constants (:func:`using`) for the whole run, and the code that builds the program --
  kernels, edges, FLOP counts, precision recipes, host costs, topology specs and
  builders, memory accounting, and cost models built without an explicit ``constants``
  -- reads :func:`active` (or :func:`value`) when it builds something.  Threading an
  argument through every block and kernel function would change dozens of signatures
  for the sake of a perturbation study, hence the context variable there.

An object built under one set of constants keeps the values it read (a cost model, a
:class:`~topologies.GPUSpec` looked up by name); build inside the run, or inside
:func:`using`, to see an override.  Same constants, same output: nothing here is global
state that a run can change.

>>> c = DEFAULT.scaled("workloads.costs.compute.HBM_EFFICIENCY", 2.0)
>>> c.get("workloads.costs.compute.HBM_EFFICIENCY"), DEFAULT.get("workloads.costs.compute.HBM_EFFICIENCY")
(1.7, 0.85)
>>> with using(c):
...     value("workloads.costs.compute.HBM_EFFICIENCY", 0.85)
1.7
>>> value("workloads.costs.compute.HBM_EFFICIENCY", 0.85)
0.85
"""

from __future__ import annotations

import dataclasses
import importlib
import numbers
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

__all__ = ["Constants", "DEFAULT", "active", "using", "value", "table_field", "scale_value", "split_name",
           "default_value"]

_WILDCARD = "[*]."


def split_name(name: str) -> tuple[str, str, str | None]:
    """``(module, attribute, field or None)`` of a constant's name."""
    field = None
    if _WILDCARD in name:
        name, field = name.split(_WILDCARD, 1)
    module, _, attr = name.rpartition(".")
    if not module or not attr:
        raise ValueError(f"not a module attribute: {name!r}")
    return module, attr, field


def default_value(name: str) -> Any:
    """The documented default of ``name``: the module attribute (for ``TABLE[*].field``,
    ``{key: value.field}``).  AttributeError / ModuleNotFoundError if it does not exist."""
    module, attr, field = split_name(name)
    mod = sys.modules.get(module) or importlib.import_module(module)
    obj = getattr(mod, attr)
    if field is None:
        return obj
    return {k: getattr(v, field) for k, v in obj.items()}


def scale_value(value: Any, factor: float) -> Any:
    """A copy of ``value`` with every numeric leaf times ``factor``.

    Numbers (not booleans) are multiplied; dicts (values only), tuples, named tuples and
    dataclass instances are rebuilt with scaled contents; anything else is returned as is.

    >>> scale_value({"a": (1, 2.0), "b": True, "c": "x"}, 2)
    {'a': (2, 4.0), 'b': True, 'c': 'x'}
    """
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, numbers.Real):
        out = value * factor
        return int(out) if isinstance(value, int) and float(out).is_integer() else out
    if isinstance(value, dict):
        return {k: scale_value(v, factor) for k, v in value.items()}
    if isinstance(value, tuple):
        items = [scale_value(v, factor) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: scale_value(getattr(value, f.name), factor) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **changes)
    return value


class Constants:
    """An immutable set of overrides of the documented constants (module docstring).

    ``Constants({"workloads.costs.compute.HBM_EFFICIENCY": 0.9})``; every name must resolve
    to a module attribute (ValueError otherwise).  Equal when the overrides are equal.
    """

    __slots__ = ("_overrides",)

    def __init__(self, overrides: Mapping[str, Any] | None = None):
        ov = dict(overrides or {})
        for name in ov:
            try:
                default_value(name)
            except (AttributeError, ImportError, ValueError, TypeError) as exc:
                raise ValueError(f"constants: {name!r} names no module attribute ({exc})") from None
        object.__setattr__(self, "_overrides", ov)

    def __setattr__(self, name, value):
        raise AttributeError("Constants is immutable: use replace() or scaled()")

    def __reduce__(self):
        return (Constants, (self._overrides,))

    def __eq__(self, other) -> bool:
        return isinstance(other, Constants) and self._overrides == other._overrides

    __hash__ = None     # overrides hold dicts

    def __repr__(self) -> str:
        return f"Constants({self._overrides!r})" if self._overrides else "Constants()"

    @property
    def overrides(self) -> Mapping[str, Any]:
        """The overridden names and their values (read-only)."""
        return MappingProxyType(self._overrides)

    @property
    def is_default(self) -> bool:
        """True when nothing is overridden."""
        return not self._overrides

    def get(self, name: str) -> Any:
        """The value of ``name``: its override, else the documented default."""
        ov = self._overrides
        return ov[name] if name in ov else default_value(name)

    def replace(self, name: str, new: Any) -> Constants:
        """A copy with ``name`` set to ``new``."""
        return Constants({**self._overrides, name: new})

    def scaled(self, name: str, factor: float) -> Constants:
        """A copy with every numeric leaf of ``name`` times ``factor`` (:func:`scale_value`)."""
        return self.replace(name, scale_value(self.get(name), factor))


DEFAULT = Constants()
"""The documented values: no overrides."""

_ACTIVE: ContextVar[Constants] = ContextVar("clustersim_constants", default=DEFAULT)


def active() -> Constants:
    """The constants in effect (set by :func:`using`; :data:`DEFAULT` otherwise)."""
    return _ACTIVE.get()


@contextmanager
def using(constants: Constants | None) -> Iterator[Constants]:
    """Make ``constants`` the active constants inside the block (None: leave them as they
    are); the previous ones are back afterwards, also after an exception."""
    if constants is None:
        yield _ACTIVE.get()
        return
    if not isinstance(constants, Constants):
        raise TypeError(f"constants must be a Constants object, not {type(constants).__name__}")
    token = _ACTIVE.set(constants)
    try:
        yield constants
    finally:
        _ACTIVE.reset(token)


def value(name: str, default: Any) -> Any:
    """The active value of ``name``; ``default`` (the caller's module attribute of that
    name) when it is not overridden.  The fast path for code that reads a constant where
    it is used."""
    ov = _ACTIVE.get()._overrides
    return ov.get(name, default) if ov else default


def table_field(table: str, key: Any, field: str, default: Any) -> Any:
    """The active ``field`` of entry ``key`` of the table ``table`` (``package.module.TABLE``):
    the ``TABLE[*].field`` override's value for ``key``, else ``default``."""
    ov = _ACTIVE.get()._overrides
    if not ov:
        return default
    over = ov.get(f"{table}{_WILDCARD}{field}")
    return default if over is None or key not in over else over[key]
