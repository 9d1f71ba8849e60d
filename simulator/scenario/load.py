"""`Scenario`: model + cluster + parallel layout + precision + options, validated together.

A scenario (docs/scenarios.md) is a YAML file (or a mapping) with the
sections ``model``, ``cluster``, ``parallel``, ``precision`` (and ``precision_options``), ``overlap``, ``whatif``,
``num_steps``, ``seed``, ``moe_routing``, ``host`` and ``approximations``, and the accounting keys
``flop_convention``, ``memory_accounting`` and ``hbm_headroom``.  :func:`load_scenario` resolves presets,
fills ``dp: -1``, and applies every rule that needs two sections at once (world size vs
GPU count, heads vs tp, experts vs ep, the schedule's micro-batch minimum, the precision
recipe vs the GPU).  YAML is loaded with :class:`~.yaml_input.UniqueKeyLoader` (``yaml.SafeLoader``: no
object-building tags; a key given twice is refused).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from topologies import Cluster, ConfigError, build_cluster
from topologies.cluster import checked_spec
from topologies.errors import check_keys
from workloads import ModelSpec, ParallelConfig, get_recipe, load_model, memory_estimates
from workloads.costs import DEFAULT_FLOP_CONVENTION, get_flop_convention
from workloads.costs.compute import host_costs
from workloads.blocks import layer_blocks
from workloads.memory import get_static_accounting
from workloads.stacks import DEFAULT_STACK, get_stack

from .whatif import WhatIf
from .yaml_input import read_text, read_yaml

__all__ = ["Scenario", "load_scenario", "read_yaml", "OVERLAP_DEFAULTS", "APPROXIMATIONS"]

#: Megatron-Core defaults for the overlap switches (docs/design.md, "Streams and overlap").
OVERLAP_DEFAULTS = {"grad_reduce": True, "param_gather": True, "tp_comm": False, "p2p": False, "cp_comm": True,
                    "fsdp_prefetch": True, "comm_slowdown": True, "fb_overlap": True}
# Megatron-Core's overlap_moe_expert_parallel_comm (with delay_wgrad_compute): the combined
# 1F1B schedule's F&B pairs (workloads.program)
OVERLAP_DEFAULTS["moe_ep_comm"] = False
#: Keys of ``precision_options``: overrides of the named precision recipe
#: (:func:`workloads.costs.precision.get_recipe`).
PRECISION_OPTIONS = ("bf16_first_layers", "bf16_last_layers", "fp8_param_gather", "fp4_param_gather", "fp8_attention")

_KEYS = {"name", "description", "model", "cluster", "parallel", "precision", "precision_options", "grad_reduce_dtype",
         "overlap", "whatif",
         "num_steps", "seed", "moe_routing", "host", "approximations", "framework", "deepspeed",
         "flop_convention", "memory_accounting", "hbm_headroom", "offload"}

#: Keys of the ``offload`` section and the ParallelConfig field each sets (workloads.offload).
OFFLOAD_KEYS = {"activations": "offload_activation_layers", "modules": "offload_modules",
                "optimizer": "optimizer_offload_fraction",
                "overlap_optimizer_copies": "overlap_optimizer_copies"}

#: Largest ``hbm_headroom`` accepted: keeping more than half the HBM free is a typo, not a policy.
MAX_HBM_HEADROOM = 0.5

#: Opt-in approximations, by name, with what each gives up (docs/performance.md measures each
#: against the exact path).  None is on unless a scenario names it.
APPROXIMATIONS = {
    "coupled_all_to_all": "an all-to-all moves as one coupled flow per source rank instead of one flow per "
                          "(source, destination) pair, so a source's bytes finish together",
}


@dataclass
class Scenario:
    """A validated scenario (the engine's input)."""

    model: ModelSpec
    cluster: Cluster
    parallel: ParallelConfig
    precision: str = "bf16"
    overlap: dict = field(default_factory=lambda: dict(OVERLAP_DEFAULTS))
    whatif: WhatIf = field(default_factory=WhatIf)
    """What-ifs (:mod:`simulator.scenario.whatif`); empty: none."""
    num_steps: int = 2
    seed: int = 0
    moe_routing: str = "balanced"
    name: str = "scenario"
    grad_reduce_dtype: str | None = None
    """Gradient-reduction dtype; None: the recipe's (fp32 for Megatron's bf16)."""
    source: dict = field(default_factory=dict)
    """The mapping the scenario was loaded from (echoed in results)."""
    host: "str | dict" = "eager"
    """How the host issues the work: ``eager`` (PyTorch eager: the GPU waits when the host
    issues kernels slower than they run), ``cuda_graphs``, ``none`` (an infinitely fast
    host), or a mapping of a measured host's ``kernel_us``, ``call_us``, ``checkpoint_us``,
    ``expert_launch_us``;
    see :data:`workloads.costs.host.HOST_COSTS`."""
    framework: str = DEFAULT_STACK
    """The kernel stack that runs the model's blocks (:mod:`workloads.stacks`): which
    collectives sit between the kernels and how each op is issued relative to compute."""
    stack_options: object = None
    """The kernel stack's own settings, parsed (the ``deepspeed`` section for ``framework:
    deepspeed``: :mod:`workloads.stacks.deepspeed.options`); None: none given."""
    approximations: tuple[str, ...] = ()
    """Opt-in approximations in force (names of :data:`APPROXIMATIONS`); empty: exact."""
    precision_options: dict = field(default_factory=dict)
    """Overrides of the precision recipe (:data:`PRECISION_OPTIONS`): ``bf16_first_layers``,
    ``bf16_last_layers``, ``fp8_param_gather``, ``fp4_param_gather``, ``fp8_attention``; empty: the
    recipe as named."""
    flop_convention: str = DEFAULT_FLOP_CONVENTION
    """Which model-FLOP count MFU and TFLOP/s use: a key of :data:`workloads.FLOP_CONVENTIONS`."""
    memory_accounting: str = "megatron"
    """Bytes per parameter of the memory model: a key of :data:`workloads.memory.STATIC_ACCOUNTINGS`."""
    hbm_headroom: float = 0.0
    """Fraction of each GPU's HBM the memory verdict keeps free: a stage fits when its total
    is at most ``(1 - hbm_headroom) x HBM``.  0 by default: the memory model already holds
    3 GiB per GPU for the CUDA context, NCCL buffers and fragmentation."""

    @property
    def recipe_or_name(self):
        """What the program builders take as ``precision``: the recipe's name, or the
        recipe with :attr:`precision_options` applied when there are any."""
        if not self.precision_options:
            return self.precision
        return get_recipe(self.precision, **self.precision_options)

    @property
    def usable_hbm_bytes(self) -> float:
        """HBM per GPU the memory verdict may fill: ``(1 - hbm_headroom) x HBM``."""
        return self.cluster.gpu.hbm_bytes * (1.0 - self.hbm_headroom)

    def memory_estimates(self, parallel: ParallelConfig | None = None) -> list:
        """Per-stage :class:`workloads.memory.MemoryEstimate` of this scenario (or of
        ``parallel`` on it): the scenario's accounting, the precision recipe's FP8 weight
        copies, judged against :attr:`usable_hbm_bytes`.  ``run``, the estimator, the search
        and ``clustersim memory`` all take their memory from here."""
        recipe = get_recipe(self.precision, gpu=self.cluster.gpu, **self.precision_options)
        # Transformer Engine saves a quantised GEMM's input for the weight gradient in the
        # quantised format (the same bytes per element, scales included, as its sequence-
        # parallel gather), not in BF16
        quantised = recipe.fprop_format != "BF16"
        return memory_estimates(self.model, parallel or self.parallel, gpu_hbm_bytes=self.usable_hbm_bytes,
                                accounting=self.memory_accounting, moe_routing=self.moe_routing, seed=self.seed,
                                fp8_weight_copy_bytes_per_param=recipe.extra_weight_bytes_per_param,
                                linear_input_bytes=recipe.tp_gather_bytes_per_element if quantised else None,
                                # the combined 1F1B's extra warm-up forward (workloads.schedules.interleaved)
                                extra_warmup_microbatches=int(bool(self.overlap.get("moe_ep_comm", False))))


def _relative_to(data: dict, folder: Path) -> dict:
    """A model's ``hf_config`` path that does not exist from the current directory but does
    from the scenario file's folder is read from there."""
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str):
        p = Path(model["hf_config"])
        if not p.is_absolute() and not p.exists() and (folder / p).exists():
            data = {**data, "model": {**model, "hf_config": str(folder / p)}}
    return data


def load_scenario(spec: "str | Path | dict", *, cluster=None) -> Scenario:
    """Load and validate a scenario from a YAML path or a mapping.

    ``cluster``: an already built :class:`~topologies.Cluster` to use instead of building
    the ``cluster`` section again (a search screens thousands of layouts on one cluster).

    >>> sc = load_scenario({"model": "tiny-dense", "cluster": {"preset": "dgx-h100", "num_nodes": 1},
    ...                     "parallel": {"tp": 2, "pp": 2, "dp": -1, "global_batch_size": 8}})
    >>> sc.parallel.describe(), sc.parallel.num_microbatches
    ('tp=2 cp=1 dp=2 pp=2', 4)
    >>> load_scenario({"model": "tiny-dense", "cluster": "dgx-h100", "parallel": {"tp": 3}})
    Traceback (most recent call last):
    ...
    topologies.errors.ConfigError: parallel = 'tp=3 cp=1 dp=1 pp=1': tp*cp*dp*pp = 3 must equal the number of GPUs, 8
    """
    if isinstance(spec, (str, Path)):
        data, name = read_yaml(spec, "scenario", "a mapping of sections"), Path(spec).stem
        data = _relative_to(data, Path(spec).parent)
    else:
        data, name = spec, "scenario"
    if not isinstance(data, dict):
        raise ConfigError("scenario", type(data).__name__, "expected a mapping of sections")
    check_keys(data, _KEYS, "scenario")
    for key in ("model", "cluster", "parallel"):
        if key not in data:
            raise ConfigError(f"scenario.{key}", None, "required")
    _check_model_file(data["model"])
    model = load_model(data["model"])
    # every rule that needs no graph first: a job whose degrees cannot match its GPUs is
    # refused before a large cluster's graph is built
    cspec = checked_spec(data["cluster"]) if cluster is None else cluster.spec
    _check_batch(data["parallel"])
    par = ParallelConfig.from_dict(_with_offload(data, model)).resolve(cspec.num_gpus)
    par.check_model(model)
    par.check_schedule()
    precision = data.get("precision", "bf16")
    grad_dtype = data.get("grad_reduce_dtype")
    popts = data.get("precision_options") or {}
    if not isinstance(popts, dict):
        raise ConfigError("scenario.precision_options", popts, "expected a mapping of "
                                                               f"{', '.join(PRECISION_OPTIONS)}")
    check_keys(popts, PRECISION_OPTIONS, "precision_options")
    get_recipe(precision, gpu=cspec.gpu, grad_reduce_dtype=grad_dtype, **popts)
    overlap = dict(OVERLAP_DEFAULTS)
    ov = data.get("overlap") or {}
    if not isinstance(ov, dict):
        raise ConfigError("scenario.overlap", ov, "expected a mapping of switches")
    check_keys(ov, OVERLAP_DEFAULTS, "overlap")
    for k, v in ov.items():
        if not isinstance(v, bool):
            raise ConfigError(f"overlap.{k}", v, "must be true or false")
    overlap.update(ov)
    num_steps = data.get("num_steps", 2)
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ConfigError("scenario.num_steps", num_steps, "must be an integer >= 1")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError("scenario.seed", seed, "must be an integer >= 0")
    whatif = WhatIf.from_dict(data.get("whatif"))
    cluster = build_cluster(cspec) if cluster is None else cluster
    whatif.check(cluster, par.world_size, num_steps)
    if whatif.cp_mla_latent:
        from workloads.stacks.megatron_te.context_parallel import check_cp_mla_latent
        check_cp_mla_latent(model, par)
    from workloads.moe_routing import parse_routing
    routing = data.get("moe_routing", "balanced")
    parse_routing(routing, "scenario.moe_routing")
    host = data.get("host", "eager")
    host_costs(host, "scenario.host")
    framework = _framework(data.get("framework", DEFAULT_STACK), model)
    stack_options = _stack_options(data, framework)
    approx = _approximations(data.get("approximations", []))
    accounting = _accounting(data)
    return Scenario(model=model, cluster=cluster, parallel=par, precision=precision, overlap=overlap, whatif=whatif,
                    num_steps=num_steps, seed=seed, moe_routing=routing, name=str(data.get("name", name)),
                    grad_reduce_dtype=grad_dtype, source=data, host=host, framework=framework, stack_options=stack_options,
                    approximations=approx,
                    precision_options=dict(popts), **accounting)


def _with_offload(data: dict, model: ModelSpec) -> dict:
    """The ``parallel`` section with the ``offload`` section's knobs (:data:`OFFLOAD_KEYS`):
    ``activations`` (leading layers whose activations go to the host; ``all``: every layer but
    the last, Megatron-Core's most), ``modules`` (fine-grained: modules whose inputs every
    layer sends there), ``optimizer`` (share of the optimizer state stepped on the CPU),
    ``overlap_optimizer_copies``."""
    off = data.get("offload") or {}
    if not isinstance(off, dict):
        raise ConfigError("scenario.offload", off, f"expected a mapping of {', '.join(OFFLOAD_KEYS)}")
    check_keys(off, OFFLOAD_KEYS, "offload")
    if "overlap_optimizer_copies" in off and not isinstance(off["overlap_optimizer_copies"], bool):
        raise ConfigError("offload.overlap_optimizer_copies", off["overlap_optimizer_copies"], "must be true or false")
    par = data["parallel"]
    if not isinstance(par, dict):
        return par
    par = {**par, **{OFFLOAD_KEYS[k]: v for k, v in off.items()}}
    if par.get("offload_activation_layers") == "all":
        par["offload_activation_layers"] = model.num_layers - 1
    return par


def _framework(name, model: ModelSpec) -> str:
    """The ``framework`` key: a registered kernel stack that lowers every block of ``model``."""
    try:
        stack = get_stack(name)
        stack.check_blocks(sorted({b.kind for i in range(model.num_layers) for b in layer_blocks(model, i)}))
    except ConfigError as e:
        raise ConfigError("scenario.framework", e.value, e.rule) from None
    return stack.name


def _stack_options(data: dict, framework: str):
    """The section of the stack's own settings (only ``deepspeed`` has one), parsed by the stack."""
    if "deepspeed" not in data:
        return None
    if framework != "deepspeed":
        raise ConfigError("scenario.deepspeed", data["deepspeed"], f"applies only with framework: deepspeed "
                                                                   f"(framework is {framework})")
    return get_stack(framework).options(data["deepspeed"])


def _check_model_file(model) -> None:
    """A Hugging Face config the model names must be a text file: a binary one would reach
    the JSON reader as undecodable bytes (a missing one is the importer's to report)."""
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str):
        p = Path(model["hf_config"])
        p = p / "config.json" if p.is_dir() else p
        if p.is_file():
            read_text(p, "model.hf_config", "a Hugging Face config.json")


def _check_batch(parallel) -> None:
    """A ``global_batch_size`` the scenario writes must be a batch: ParallelConfig reads 0
    as "one micro-batch per replica", which a user who writes 0 cannot have meant."""
    gbs = parallel.get("global_batch_size") if isinstance(parallel, dict) else None
    if type(gbs) is int and gbs < 1:
        raise ConfigError("parallel.global_batch_size", gbs, "must be an integer >= 1, sequences per step "
                                                             "(leave it out for one micro-batch per replica)")


def _accounting(data: dict) -> dict:
    """``flop_convention``, ``memory_accounting`` and ``hbm_headroom``, checked."""
    out = {}
    for key, check in (("flop_convention", get_flop_convention), ("memory_accounting", get_static_accounting)):
        if key in data:
            try:
                check(data[key])
            except ConfigError as err:
                raise ConfigError(f"scenario.{key}", data[key], err.rule) from None
            out[key] = data[key]
    if "hbm_headroom" in data:
        h = data["hbm_headroom"]
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h <= MAX_HBM_HEADROOM:
            raise ConfigError("scenario.hbm_headroom", h,
                              f"must be a fraction of HBM between 0 and {MAX_HBM_HEADROOM} (e.g. 0.05 keeps 5 % free)")
        out["hbm_headroom"] = float(h)
    return out


def _approximations(value) -> tuple[str, ...]:
    """The ``approximations`` list: known names, each once, in the order given."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError("scenario.approximations", value, "expected a list of names")
    for name in value:
        if not isinstance(name, str) or name not in APPROXIMATIONS:
            raise ConfigError("scenario.approximations", name, f"unknown; known: {', '.join(sorted(APPROXIMATIONS))}")
    return tuple(dict.fromkeys(value))
