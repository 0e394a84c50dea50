"""The user's Megatron flags that change what a GPU holds, read once from the recipe.

Real jobs fit by recomputing activations, offloading them, keeping optimizer state in lower
precision or on the CPU; the memory model has to see the same flags the job runs with, so they
are read here from ``Recipe.megatron_args`` into one frozen :class:`MemorySettings` and passed to
every memory figure.  Defaults and the allowed values are megatron-core 0.16.1's
(``megatron/training/arguments.py``, ``transformer/transformer_config.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ray_layout.errors import ConfigError, quoted
from ray_layout.model.megatron_args import parse_flags, walk_flags

# transformer_config.py: the modules --recompute-modules and --offload-modules accept.
RECOMPUTE_MODULES = frozenset(
    {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"}
)
OFFLOAD_MODULES = frozenset(
    {"core_attn", "attn_proj", "expert_fc1", "moe_act", "attn_norm", "mlp_norm", "qkv_linear"}
)
# arguments.py maps these names to torch dtypes; fp8 states are uint8.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
SOURCE = "megatron_args"


@dataclass(frozen=True)
class MemorySettings:
    """What the job's flags do to memory; the defaults are a plain bf16 run with the
    distributed optimizer's fp32 state and flash attention (no recompute, no offload)."""

    recompute_granularity: str | None = None  # "full", "selective" or None
    recompute_method: str | None = None  # "uniform" or "block" (full only)
    recompute_num_layers: int = 0  # layers per checkpoint (uniform) or checkpointed (block)
    recompute_modules: frozenset[str] = frozenset({"core_attn"})  # selective only
    offload_modules: frozenset[str] = frozenset()  # fine-grained activation offloading
    precision_aware: bool = False  # --use-precision-aware-optimizer
    exp_avg_bytes: int = 4
    exp_avg_sq_bytes: int = 4
    main_params_dtype: str = "fp32"
    main_grad_bytes: int = 4
    fp8_param_gather: bool = False
    fp8_recipe: str | None = None  # --fp8-recipe under --fp8-format; None: no fp8 training
    optimizer_offload_fraction: float = 0.0  # of the optimizer state kept on the CPU
    optimizer_instances: int = 1  # --num-distributed-optimizer-instances
    cross_entropy: str = "unfused"  # the loss's kernel: "unfused", "native" or "te"
    grouped_gemm: bool = False  # --moe-grouped-gemm: moe_act recompute needs it
    shared_expert_overlap: bool = False  # --moe-shared-expert-overlap: no shared_experts recompute

    @property
    def selective(self) -> frozenset[str]:
        """The modules recomputed selectively (none unless the granularity is selective)."""
        return self.recompute_modules if self.recompute_granularity == "selective" else frozenset()

    @property
    def optimizer_bytes_per_param(self) -> float:
        """Adam's state per parameter, sharded by the distributed optimizer: the two moments and
        the main copy.  Under the precision-aware optimizer TE keeps the main copy, and with bf16
        parameters only the 16-bit remainder of an fp32 one (``store_param_remainders``, on by
        default: ``optimizer/distrib_optimizer.py``); an fp16 main copy is 2 bytes too.  Megatron
        keeps an fp32 main copy itself (4 bytes) for an fp8 recipe other than delayed scaling
        without CPU offload (``use_precision_aware_optimizer_no_fp8_or_ds_fp8``)."""
        if not self.precision_aware:
            return 12.0
        te_keeps_main = (
            self.main_params_dtype != "fp32"
            or self.fp8_recipe in (None, "delayed")
            or self.optimizer_offload_fraction > 0
        )
        return self.exp_avg_bytes + self.exp_avg_sq_bytes + (2 if te_keeps_main else 4)

    @property
    def grad_bytes_per_param(self) -> int:
        """The gradient buffer: fp32 unless --main-grads-dtype bf16 (or --grad-reduce-in-bf16)
        turns off fp32 accumulation (``arguments.py``)."""
        return self.main_grad_bytes

    def recompute_refusal(self, *, mla: bool, mtp: bool) -> str | None:
        """Why megatron-core 0.16.1 refuses this recomputation for a model with or without MLA
        and MTP (``transformer_config.py``, ``multi_token_prediction.py``), or None."""
        modules = self.selective
        if "moe_act" in modules and not self.grouped_gemm:
            return "--recompute-modules moe_act needs --moe-grouped-gemm (megatron-core)"
        if "mla_up_proj" in modules and not mla:
            return "--recompute-modules mla_up_proj needs multi-latent attention (megatron-core)"
        if "shared_experts" in modules and self.shared_expert_overlap:
            return "--recompute-modules shared_experts cannot go with --moe-shared-expert-overlap"
        if self.fp8_recipe == "delayed" and modules & {"moe_act", "layernorm"}:
            return "fp8 delayed scaling does not support moe_act and layernorm recompute"
        uniform = self.recompute_method == "uniform"
        if mtp and uniform and self.recompute_num_layers != 1:
            return (
                f"--recompute-num-layers {self.recompute_num_layers} with --recompute-method "
                "uniform and MTP: megatron-core asserts 'recompute_num_layers must be 1 for MTP "
                "recompute'"
            )
        return None

    def without_recompute(self) -> MemorySettings:
        """These settings with no recomputation (``--recompute-modules``' default kept)."""
        return replace(
            self,
            recompute_granularity=None,
            recompute_method=None,
            recompute_num_layers=0,
            recompute_modules=frozenset({"core_attn"}),
        )

    def recompute_flags(self) -> tuple[str, ...]:
        """The recompute part of these settings as Megatron flags."""
        words: list[str] = []
        if self.recompute_granularity:
            words += ["--recompute-granularity", self.recompute_granularity]
        if self.recompute_granularity == "full":
            words += ["--recompute-method", str(self.recompute_method)]
            words += ["--recompute-num-layers", str(self.recompute_num_layers)]
        if self.recompute_granularity == "selective":
            words += ["--recompute-modules", *sorted(self.recompute_modules)]
        return tuple(words)

    def optimizer_flags(self) -> tuple[str, ...]:
        """The optimizer part of these settings as Megatron flags."""
        words: list[str] = []
        if self.precision_aware:
            names = {v: k for k, v in DTYPE_BYTES.items() if k != "fp16"}
            words += ["--use-precision-aware-optimizer"]
            words += ["--exp-avg-dtype", names[self.exp_avg_bytes]]
            words += ["--exp-avg-sq-dtype", names[self.exp_avg_sq_bytes]]
        if self.optimizer_offload_fraction:
            words += ["--optimizer-cpu-offload", "--optimizer-offload-fraction"]
            words += [f"{self.optimizer_offload_fraction:g}"]
        return tuple(words)

    def flags(self) -> tuple[str, ...]:
        """These settings as Megatron flags, the way a what-if names them."""
        return self.recompute_flags() + self.optimizer_flags()


PLAIN = MemorySettings()  # no recompute, no offload, fp32 optimizer state on the GPU

_READ = frozenset(
    {
        "cross_entropy_loss_fusion",
        "fine_grained_activation_offloading",
        "fp8",
        "fp8_param_gather",
        "grad_reduce_in_bf16",
        "moe_layer_recompute",
        "offload_modules",
        "optimizer_cpu_offload",
        "recompute_activations",
        "recompute_granularity",
        "recompute_method",
        "recompute_modules",
        "recompute_num_layers",
        "use_precision_aware_optimizer",
        "main_grads_dtype",
        "main_params_dtype",
        "exp_avg_dtype",
        "exp_avg_sq_dtype",
        "cross_entropy_fusion_impl",
        "fp8_recipe",
        "moe_grouped_gemm",
        "moe_shared_expert_overlap",
        "num_distributed_optimizer_instances",
        "optimizer_offload_fraction",
    }
)  # the flags the memory model reads; a fork's other flags are not typed here


def memory_settings(args: Sequence[str], source: str = SOURCE) -> MemorySettings:
    """The settings a command line asks for; a one-line :class:`ConfigError` for a value
    Megatron would refuse (an unknown module, a full recompute without its method)."""
    parsed = parse_flags(args, source, only=_READ)
    granularity = parsed.get("recompute_granularity")
    if parsed.get("recompute_activations") and granularity is None:
        granularity = "selective"  # arguments.py: --recompute-activations means selective
    method = parsed.get("recompute_method")
    layers = parsed.get("recompute_num_layers")
    if granularity == "full":
        if method is None:
            raise ConfigError(
                f"{source}: --recompute-granularity full needs --recompute-method uniform|block"
            )
        if layers is None or layers < (0 if method == "block" else 1):
            raise ConfigError(
                f"{source}: --recompute-granularity full needs --recompute-num-layers "
                f"(at least {0 if method == 'block' else 1}), got {quoted(layers)}"
            )
    modules = _modules(
        parsed.get("recompute_modules"), RECOMPUTE_MODULES, "--recompute-modules", source
    )
    if parsed.get("moe_layer_recompute"):  # transformer_config.py: deprecated, selective + moe
        if granularity == "full":
            raise ConfigError(f"{source}: --moe-layer-recompute cannot go with full recompute")
        granularity = "selective"
        modules = (modules if modules is not None else frozenset({"core_attn"})) | {"moe"}
    offloading = bool(parsed.get("fine_grained_activation_offloading"))
    offload = _modules(parsed.get("offload_modules"), OFFLOAD_MODULES, "--offload-modules", source)
    fraction = float(parsed.get("optimizer_offload_fraction", 1.0))
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(
            f"{source}: --optimizer-offload-fraction must be in [0, 1], got {fraction}"
        )
    instances = int(parsed.get("num_distributed_optimizer_instances", 1))
    if instances < 1:
        raise ConfigError(
            f"{source}: --num-distributed-optimizer-instances must be >= 1, got {instances}"
        )
    precision_aware = bool(parsed.get("use_precision_aware_optimizer"))
    grads = parsed.get("main_grads_dtype", "fp32") if precision_aware else "fp32"
    if parsed.get("grad_reduce_in_bf16"):
        grads = "bf16"
    cross_entropy = "unfused"
    if parsed.get("cross_entropy_loss_fusion"):  # language_module.py picks the fused kernel
        cross_entropy = parsed.get("cross_entropy_fusion_impl", "native")
    return MemorySettings(
        recompute_granularity=granularity,
        recompute_method=method if granularity == "full" else None,
        recompute_num_layers=int(layers or 0) if granularity == "full" else 0,
        recompute_modules=frozenset({"core_attn"}) if modules is None else modules,
        offload_modules=(offload or frozenset()) if offloading else frozenset(),
        precision_aware=precision_aware,
        exp_avg_bytes=DTYPE_BYTES[parsed.get("exp_avg_dtype", "fp32")] if precision_aware else 4,
        exp_avg_sq_bytes=DTYPE_BYTES[parsed.get("exp_avg_sq_dtype", "fp32")]
        if precision_aware
        else 4,
        main_params_dtype=parsed.get("main_params_dtype", "fp32"),
        main_grad_bytes=DTYPE_BYTES[grads],
        fp8_param_gather=bool(parsed.get("fp8_param_gather")),
        fp8_recipe=parsed.get("fp8_recipe", "delayed") if parsed.get("fp8") else None,
        optimizer_offload_fraction=fraction if parsed.get("optimizer_cpu_offload") else 0.0,
        optimizer_instances=instances,
        cross_entropy=cross_entropy,
        grouped_gemm=bool(parsed.get("moe_grouped_gemm")),
        shared_expert_overlap=bool(parsed.get("moe_shared_expert_overlap")),
    )


_RECOMPUTE_DESTS = frozenset(
    {
        "moe_layer_recompute",
        "recompute_activations",
        "recompute_granularity",
        "recompute_method",
        "recompute_modules",
        "recompute_num_layers",
    }
)


def with_recompute(
    args: Sequence[str], settings: MemorySettings, source: str = SOURCE
) -> tuple[str, ...]:
    """``args`` running ``settings``' recomputation instead of their own: every recompute flag
    (the deprecated ``--recompute-activations`` and ``--moe-layer-recompute`` too) taken out,
    the settings' own flags appended."""
    dropped: set[int] = set()
    for use in walk_flags(args, source, strict=False, keep_unknown=True):
        if use.known and use.entry["dest"] in _RECOMPUTE_DESTS:
            dropped.update(use.span)
    kept = tuple(word for i, word in enumerate(args) if i not in dropped)
    return kept + settings.recompute_flags()


def _modules(
    given: object, allowed: frozenset[str], flag: str, source: str
) -> frozenset[str] | None:
    """A module list flag's words (None: not given), each one Megatron accepts."""
    if given is None:
        return None
    words = [given] if isinstance(given, str) else list(given)  # type: ignore[call-overload]
    unknown = sorted(set(words) - allowed)
    if unknown:
        raise ConfigError(
            f"{source}: {flag} does not know {', '.join(map(quoted, unknown))}; "
            f"Megatron accepts {', '.join(sorted(allowed))}"
        )
    return frozenset(words)
