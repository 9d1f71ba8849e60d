"""Model specs, parallel configurations, device mesh and pipeline schedules.

Imports only from ``topologies`` (the lower layer).
"""

from .costs import (FLOP_CONVENTIONS, PRECISION_RECIPES, ComputeModel, ComputeOp, MeasuredComputeModel,
                    PrecisionRecipe, RooflineComputeModel, embedding_ops, get_recipe, layer_ops,
                    model_flops_per_step, model_flops_per_token, optimizer_ops, output_ops)
from .hf_config import model_from_hf_config
from .megatron_args import from_megatron_args
from .memory import (DEFAULT_RESERVE_BYTES, MemoryEstimate, MemoryOptions, bytes_per_param, check_fits,
                     layer_activation_bytes, memory_estimate, memory_estimates)
from .mesh import GROUP_AXES, RankGrid
from .model import MLASpec, ModelSpec, MoESpec
from .model_loading import MODEL_PRESETS, load_model
from .parallel import ParallelConfig, split_layers
from .ops import Coll, Group, Issue, Op, OpKind, OpName, Phase, Stream
from .program import Program, RankClass, build_program
from .schedules import (SCHEDULES, Action, ActionCosts, ActionKind, Schedule, ScheduleError, ScheduleTiming,
                        format_table, get_schedule, min_microbatches, parse_action, peak_in_flight,
                        schedule_timing, validate_schedule_config)
from .schedules import validate as validate_schedule

__all__ = ["ModelSpec", "MoESpec", "MLASpec", "MODEL_PRESETS", "load_model", "model_from_hf_config",
           "from_megatron_args", "ParallelConfig", "split_layers", "RankGrid", "GROUP_AXES",
           "SCHEDULES", "Action", "ActionCosts", "ActionKind", "Schedule", "ScheduleError", "ScheduleTiming",
           "format_table", "get_schedule", "min_microbatches", "parse_action", "peak_in_flight", "schedule_timing",
           "validate_schedule", "validate_schedule_config",
           "ComputeOp", "layer_ops", "embedding_ops", "output_ops", "optimizer_ops", "model_flops_per_step",
           "model_flops_per_token", "FLOP_CONVENTIONS", "ComputeModel", "RooflineComputeModel",
           "MeasuredComputeModel", "PrecisionRecipe", "PRECISION_RECIPES", "get_recipe",
           "MemoryEstimate", "MemoryOptions", "memory_estimate", "memory_estimates", "layer_activation_bytes",
           "check_fits", "bytes_per_param", "DEFAULT_RESERVE_BYTES", "Op", "OpKind", "OpName", "Stream", "Coll", "Group", "Phase", "Program",
           "RankClass", "build_program"]
