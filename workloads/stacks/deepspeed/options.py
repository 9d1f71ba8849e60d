"""The scenario's ``deepspeed`` section: the ZeRO settings of the DeepSpeed config that change
a step's time, with DeepSpeed's defaults.

Defaults from ``deepspeed/runtime/zero/config.py@v0.16.4`` (``DeepSpeedZeroConfig``):
``reduce_bucket_size`` 5e8 elements, ``stage3_prefetch_bucket_size`` 5e7,
``stage3_param_persistence_threshold`` 1e5, ``stage3_max_live_parameters`` 1e9,
``stage3_max_reuse_distance`` 1e9, ``overlap_comm`` None -> True only at stage 3
(validator ``overlap_comm_valid``).  ``communication_data_type`` (``deepspeed/runtime/
engine.py@v0.16.4`` ``DeepSpeedEngine.communication_data_type``): unset, the training dtype
(FP16 or BF16), so a BF16 run reduces its gradients in BF16.

Not an option here: ``allgather_bucket_size``.  ZeRO-1/2 gathers the updated parameters with
``all_gather_dp_groups`` (``deepspeed/runtime/utils.py@v0.16.4``), which takes the
``all_gather_into_tensor`` path -- one all-gather per parameter group, the bucket size unused --
whenever the backend has it (NCCL with any PyTorch clustersim models).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from topologies import ConfigError

__all__ = ["DeepSpeedOptions", "deepspeed_options"]

_DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class DeepSpeedOptions:
    """The ZeRO settings clustersim reads (see the module docstring)."""

    overlap_comm: bool | None = None
    reduce_bucket_size: int = 500_000_000
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_param_persistence_threshold: int = 100_000
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_max_reuse_distance: int = 1_000_000_000
    communication_data_type: str = "bf16"

    def overlap(self, zero_stage: int) -> bool:
        """``overlap_comm`` as DeepSpeed resolves it: unset, True only at stage 3."""
        return self.overlap_comm if self.overlap_comm is not None else zero_stage == 3

    @property
    def grad_bytes(self) -> float:
        """Bytes per element of the gradient reductions."""
        return {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0}[self.communication_data_type]


_MINIMUM = {"reduce_bucket_size": 1, "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0,
            "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0}


def deepspeed_options(raw) -> DeepSpeedOptions:
    """The scenario's ``deepspeed`` mapping as :class:`DeepSpeedOptions`; a ConfigError names
    the field, the value and the rule for an unknown key or a bad value."""
    if raw is None:
        return DeepSpeedOptions()
    if isinstance(raw, DeepSpeedOptions):
        return raw
    known = [f.name for f in fields(DeepSpeedOptions)]
    if not isinstance(raw, dict):
        raise ConfigError("scenario.deepspeed", raw, f"expected a mapping of {', '.join(known)}")
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"deepspeed.{key}", value, f"unknown option; known: {', '.join(known)}")
        if key == "overlap_comm":
            if value is not None and not isinstance(value, bool):
                raise ConfigError("deepspeed.overlap_comm", value, "must be true or false")
        elif key == "communication_data_type":
            if value not in _DTYPES:
                raise ConfigError("deepspeed.communication_data_type", value, f"must be one of {', '.join(_DTYPES)}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) \
                or value < _MINIMUM[key]:
            raise ConfigError(f"deepspeed.{key}", value, f"must be a whole number of elements >= {_MINIMUM[key]}")
    return DeepSpeedOptions(**{k: (int(v) if k in _MINIMUM else v) for k, v in raw.items()})
