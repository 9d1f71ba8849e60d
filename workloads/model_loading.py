"""Where a :class:`~workloads.model.ModelSpec` comes from: a preset, a Hugging Face config,
Megatron-LM arguments or a mapping of fields, each with overrides (:func:`load_model`).

The importers (:mod:`.hf_config`, :mod:`.megatron_args`) build on :mod:`.model`; this module
sits above all three, so none of them imports another that imports it back.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from pathlib import Path

import yaml

from topologies import ConfigError

from .hf_config import model_from_hf_config
from .megatron_args import model_from_megatron_args
from .model import ModelSpec

__all__ = ["MODEL_PRESETS", "PRESET_DIR", "load_model", "load_preset_mapping"]

PRESET_DIR = Path(__file__).parent / "presets" / "models"


def _preset_names() -> list[str]:
    return sorted(p.name[:-len(".yaml")] for p in PRESET_DIR.glob("*.yaml"))


#: Names of the model presets in ``workloads/presets/models/`` (each YAML cites its source).
MODEL_PRESETS: tuple[str, ...] = tuple(_preset_names())


def load_preset_mapping(name: str, where: str = "model") -> dict:
    """The mapping stored in ``presets/models/<name>.yaml`` (with ``name`` set)."""
    if not isinstance(name, str) or "/" in name or not (PRESET_DIR / f"{name}.yaml").is_file():
        raise ConfigError(where, name, f"unknown model preset; known: {', '.join(_preset_names())}")
    data = copy.deepcopy(_read_preset(PRESET_DIR / f"{name}.yaml"))
    if not isinstance(data, dict):
        raise ConfigError(where, name, f"preset file {name}.yaml does not hold a mapping")
    data.setdefault("name", name)
    return data


@functools.lru_cache(maxsize=None)
def _read_preset(path: Path):
    # presets are package data: parsed once per process (a search loads the model per candidate),
    # with libyaml's parser where PyYAML has it (the same mappings, several times faster)
    with path.open() as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 (safe)


def _base_mapping(kind: str, value, where: str) -> dict:
    """The fields a ``preset``, ``hf_config`` or ``megatron_args`` entry stands for."""
    if kind == "preset":
        return load_preset_mapping(value, where)
    if kind == "hf_config":
        if not isinstance(value, (str, Path)):
            raise ConfigError(where, value, "expected the path of a Hugging Face config.json (or its folder)")
        return model_from_hf_config(value, where=where).to_dict()
    if not isinstance(value, (str, list)):
        raise ConfigError(where, value, "expected Megatron-LM arguments as one string or a list")
    return model_from_megatron_args(value).to_dict()


def load_model(spec: str | Mapping | ModelSpec, where: str = "model") -> ModelSpec:
    """A ModelSpec from a preset name, a preset plus overrides, or a mapping of fields.

    Parameters
    ----------
    spec
        ``"llama3-70b"`` (a name in :data:`MODEL_PRESETS`); ``{"preset": "llama3-70b",
        "seq_len": 4096, ...}`` (the preset with fields replaced; ``moe`` and ``mla``
        mappings are merged key by key into the preset's, ``moe: null`` removes it);
        ``{"hf_config": "path/config.json", ...}`` (a Hugging Face config through
        :func:`workloads.model_from_hf_config`) or ``{"megatron_args": "--num-layers ..."}``
        (Megatron-LM arguments), each with fields replaced in the same way; a full mapping of
        ModelSpec fields; or a ModelSpec, returned as is.
    where
        Field prefix for error messages.

    Returns
    -------
    ModelSpec

    Raises
    ------
    ConfigError
        Unknown preset (the message lists the valid names), unknown key or bad value.
    """
    if isinstance(spec, ModelSpec):
        return spec
    if isinstance(spec, str):
        return ModelSpec.from_dict(load_preset_mapping(spec, where), where)
    if not isinstance(spec, Mapping):
        raise ConfigError(where, spec, "expected a preset name or a mapping of ModelSpec fields")
    sources = [k for k in ("preset", "hf_config", "megatron_args") if k in spec]
    if len(sources) > 1:
        raise ConfigError(f"{where}.{sources[1]}", spec[sources[1]], f"give one of preset, hf_config, megatron_args, "
                                                                    f"not both {sources[0]} and {sources[1]}")
    if not sources:
        return ModelSpec.from_dict(spec, where)
    src = sources[0]
    base = _base_mapping(src, spec[src], f"{where}.{src}")
    merged = dict(base)
    for key, value in spec.items():
        if key == src:
            continue
        if key in ("moe", "mla", "mamba", "gated_deltanet") and isinstance(value, Mapping) and isinstance(base.get(key), Mapping):
            merged[key] = {**base[key], **value}
        else:
            merged[key] = value
    return ModelSpec.from_dict(merged, where)
