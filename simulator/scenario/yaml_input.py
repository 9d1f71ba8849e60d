"""Reading the YAML a user gives (scenarios, sweeps, searches, cluster files, model
mappings, ``--set`` values): safe tags only, and every way it can be unusable refused as a
:class:`~topologies.ConfigError` naming the file, never as a traceback.

PyYAML's ``safe_load`` keeps the last of two equal keys in a mapping without a word, so a
scenario that sets ``parallel:`` twice runs the second silently; the YAML 1.2 spec says a
mapping's keys are unique (section 3.2.1.1), and :class:`UniqueKeyLoader` refuses them.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from topologies import ConfigError

__all__ = ["UniqueKeyLoader", "DuplicateKeyError", "parse_yaml", "load_yaml_file", "read_yaml", "yaml_problem"]

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping names the same key twice."""


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (a merge key's
    ``<<: *base`` entries may still be overridden: that is what merging is for).

    >>> yaml.load("a: 1\\nb: 2\\n", Loader=UniqueKeyLoader)
    {'a': 1, 'b': 2}
    >>> yaml.load("a: 1\\na: 2\\n", Loader=UniqueKeyLoader)
    Traceback (most recent call last):
    ...
    simulator.scenario.yaml_input.DuplicateKeyError: while constructing a mapping
    ...
    """

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:           # an unhashable key: the base class says so
                    continue
                if first is not None:
                    raise DuplicateKeyError("while constructing a mapping", node.start_mark,
                                            f"duplicate key {key!r}", key_node.start_mark,
                                            note=f"first at line {first.line + 1}, column {first.column + 1}")
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def yaml_problem(e: yaml.YAMLError) -> str:
    """What PyYAML found wrong and where, 1-based: 'expected ..., line 3, column 9'."""
    mark = getattr(e, "problem_mark", None)
    what = getattr(e, "problem", None) or e.__class__.__name__
    if mark is None:
        return what
    return f"{what} at line {mark.line + 1}, column {mark.column + 1}"


def parse_yaml(text: str, where: str, value: object):
    """``text`` parsed with :class:`UniqueKeyLoader`; ConfigError(where, value, ...) when it
    is not valid YAML or repeats a key."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)      # noqa: S506 (a SafeLoader subclass)
    except DuplicateKeyError as e:
        raise ConfigError(where, value, f"{yaml_problem(e)} ({e.note}); YAML would silently keep the last, "
                                        "so it is refused") from None
    except yaml.YAMLError as e:
        raise ConfigError(where, value, f"not valid YAML: {yaml_problem(e)}") from None


def read_text(path: "str | Path", where: str, what: str) -> str:
    """The text of the file ``path``; ConfigError naming ``where`` when it is missing, a
    folder, unreadable or binary (``what``: what the file should have been)."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(where, str(path), f"is a folder, not a file (expected {what})")
    if not p.is_file():
        raise ConfigError(where, str(path), "file not found")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ConfigError(where, str(path), f"cannot be read ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        text, at = None, e.start
    if text is None or "\0" in text:
        at = at if text is None else data.index(b"\0")
        raise ConfigError(where, str(path), f"a binary file, not text (at byte {at}; expected {what})")
    return text


def load_yaml_file(path: "str | Path", where: str, what: str = "YAML text"):
    """Whatever the YAML file ``path`` holds (None when it is empty), read as
    :func:`read_text` and :func:`parse_yaml` do."""
    return parse_yaml(read_text(path, where, what), where, str(path))


def read_yaml(path: "str | Path", where: str, what: str = "a mapping") -> dict:
    """The mapping in the YAML file ``path``; ConfigError naming ``where`` when the file is
    missing, a folder, binary, empty, not valid YAML, repeats a key, or does not hold ``what``."""
    data = load_yaml_file(path, where, f"a YAML file of {what}")
    if data is None:
        raise ConfigError(where, str(path), f"the file is empty (expected {what})")
    if not isinstance(data, dict):
        raise ConfigError(where, str(path), f"holds a {_kind(data)}, expected {what}")
    return data


def _kind(data) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(data),
                                                                                           type(data).__name__)
