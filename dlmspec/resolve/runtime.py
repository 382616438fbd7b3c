"""Values of the runtime and the launch scripts: what train.py passes to megatron-core and the
runtime beyond the spec's own values, decided here, once, so the templates only print them."""

from __future__ import annotations

import math
import posixpath
from typing import TYPE_CHECKING, Any

from dlmspec import objectives
from dlmspec.layout import data_parallel_size
from dlmspec.names import CART_P_DEFAULT
from dlmspec.resolve.stage import default_loss_normalization
from dlmspec.data.repetition import train_caps
from dlmspec.resolve.values import RuntimeValues
from dlmspec.spec.fast import section_defaults

if TYPE_CHECKING:
    from dlmspec.resolve.resolved import Resolved
    from dlmspec.spec.models import SlurmSpec, Spec


def run_dir(resolved: Resolved) -> str:
    """The runtime's ``LoggingConfig.run_dir`` (metrics.jsonl, exit_status.json, tensorboard/):
    ``logging.run_dir`` (``{name}`` already expanded, :mod:`dlmspec.spec.names`), default
    ``runs/<name>``."""
    return resolved.spec.logging.run_dir or f"runs/{resolved.spec.name}"


def slurm_settings(resolved: Resolved) -> SlurmSpec:
    """``[cluster.slurm]`` of the spec, or its defaults when the table is absent (a
    :class:`~dlmspec.spec.fast.SpecTable` for a spec loaded with ``fast=True``: no pydantic)."""
    slurm = resolved.spec.cluster.slurm
    if slurm:
        return slurm
    return section_defaults(resolved.spec, "SlurmSpec")


def job_name(resolved: Resolved) -> str:
    """``cluster.slurm.job_name`` when written in the spec, else the spec's ``name``."""
    slurm = resolved.spec.cluster.slurm
    if slurm is not None and "job_name" in slurm.model_fields_set:
        return slurm.job_name
    return resolved.spec.name


# --------------------------------------------------------------------------------------------
# What train.py passes to megatron-core and the runtime beyond the spec's own values: decided
# here, once, so the templates only print them.


def schedule(resolved: Resolved) -> dict[str, Any]:
    """Learning-rate schedule lengths in optimizer steps, as Megatron-LM derives them
    (megatron/training/training.py ``get_optimizer_param_scheduler``): decay over
    ``lr_decay_iters`` (default ``train_iters``); warmup ``lr_warmup_fraction * lr_decay_iters``
    when the fraction is set, else ``lr_warmup_iters``; WSD's decay phase ``lr_wsd_decay_iters``
    (default: the whole decay, i.e. ``lr_decay_iters``)."""
    tr = resolved.spec.train
    decay = tr.lr_decay_iters or resolved.train_iters
    warmup = int(tr.lr_warmup_fraction * decay) if tr.lr_warmup_fraction is not None else tr.lr_warmup_iters
    wsd = tr.lr_wsd_decay_iters or decay
    return {"lr_decay_iters": decay, "lr_warmup_iters": warmup, "lr_wsd_decay_iters": wsd}


#: Keys ``spec.lock.toml`` writes in from resolved values (:func:`lock_filled`): what
#: :func:`locked_spec` may change, and what the loader may unset again in a lock it reads
#: (:func:`dlmspec.spec.load.load`'s round trip), so that both use one list.
LOCK_FILLED_KEYS: tuple[str, ...] = (
    "model.num_query_groups",
    "model.kv_channels",
    "model.moe_ffn_hidden_size",
    "parallel.expert_tensor_parallel_size",
    "objective.attention_mask",
    "objective.mask_token_id",
    "train.train_iters",
    "train.lr_decay_iters",
    "checkpoint.load",
    "logging.run_dir",
    "data.train",
    "data.valid",
)


def lock_filled(resolved: Resolved) -> dict[str, Any]:
    """Dotted key (of :data:`LOCK_FILLED_KEYS`) -> the value ``spec.lock.toml`` writes for it:
    the defaults :func:`resolve` fills (query groups, head dimension, expert TP, MoE FFN size,
    attention mask, mask token, train_iters) and the runtime's (lr_decay_iters from
    :func:`schedule`, ``checkpoint.load`` following ``checkpoint.save``, :func:`run_dir`).
    ``data.train`` / ``data.valid`` are written as their resolved shards (:func:`resolve_blend`)
    when they name a glob or a manifest, so the lock compiles to the same blend when the files
    have changed since. Keys whose value is unknown (no MoE FFN, no mask token, no steps,
    nothing saved) are left out."""
    filled: dict[str, Any] = {
        "model.num_query_groups": resolved.num_query_groups,
        "model.kv_channels": resolved.kv_channels,
        "parallel.expert_tensor_parallel_size": resolved.etp,
        "objective.attention_mask": resolved.attention_mask,
    }
    if resolved.moe_ffn_hidden_size is not None:
        filled["model.moe_ffn_hidden_size"] = resolved.moe_ffn_hidden_size
    if resolved.mask_token_id is not None:
        filled["objective.mask_token_id"] = resolved.mask_token_id
    if resolved.train_iters > 0:
        filled["train.train_iters"] = resolved.train_iters
        filled["train.lr_decay_iters"] = schedule(resolved)["lr_decay_iters"]
    if resolved.spec.checkpoint.load is None and resolved.spec.checkpoint.save is not None:
        filled["checkpoint.load"] = resolved.spec.checkpoint.save
    filled["logging.run_dir"] = run_dir(resolved)
    for key, blend in (("data.train", resolved.train_blend), ("data.valid", resolved.valid_blend)):
        if blend.expanded and blend.shards and not blend.problems:
            filled[key] = [{"prefix": prefix, "weight": weight} for prefix, weight in blend.pairs()]
    return filled


def locked_spec(resolved: Resolved) -> Spec:
    """The spec with every value of :func:`lock_filled` written in, without any ``[lock]``
    table. The end-of-document id is not filled in (it may be read from tokenizer files,
    :func:`eod_choice`); ``[lock.derived]`` records it. Loading its TOML gives back the same
    :class:`Resolved`. :func:`dlmspec.render.compile.content_hash` hashes it."""
    return resolved.spec.replace(lock=None, **lock_filled(resolved))


def init_cache_dir(resolved: Resolved) -> str | None:
    """Where the runtime converts ``checkpoint.init_from = "hf:PATH"`` weights once
    (``CheckpointConfig.init_cache_dir``): ``<checkpoint.save>/init_from_hf``, or
    ``<run_dir>/init_from_hf`` for a run that saves nothing
    (``dlmspec.backends.megatron.init_from.default_cache_dir``); None unless ``init_from`` is ``hf:``."""
    init = resolved.spec.checkpoint.init_from
    if init is None or not init.startswith("hf:"):
        return None
    return posixpath.join(resolved.spec.checkpoint.save or run_dir(resolved), "init_from_hf")


def runtime_values(resolved: Resolved) -> RuntimeValues:
    """The :class:`RuntimeValues` of ``resolved`` (pure: same spec, same values):
    ``resolved.runtime``, which :func:`dlmspec.resolve.resolve` fills with this function."""
    if resolved.runtime is not None:
        return resolved.runtime
    spec = resolved.spec
    m, par, rc, tr = spec.model, spec.parallel, spec.recompute, spec.train
    lengths = schedule(resolved)
    fsdp = par.fsdp == "megatron"
    reduce_scatter = fsdp and par.data_parallel_sharding_strategy in ("optim_grads", "optim_grads_params")
    all_gather = fsdp and par.data_parallel_sharding_strategy == "optim_grads_params"
    group = data_parallel_size(resolved.world_size, resolved.tp, resolved.pp, 1)  # DP x CP
    gpu = resolved.gpu
    if gpu is None:
        peak, peak_source = None, f"GPU {spec.cluster.gpu!r} is not in the catalog: no MFU"
    elif spec.precision.dtype == "fp32":
        peak, peak_source = float(gpu.fp32_tflops), f"{gpu.name}, dense fp32 peak"
    else:
        peak, peak_source = float(gpu.bf16_tflops), f"{gpu.name}, dense bf16 peak"
    full = rc.granularity == "full"
    normalization = tr.loss_normalization or default_loss_normalization(spec)
    return RuntimeValues(
        lr_warmup_iters=lengths["lr_warmup_iters"],
        lr_decay_iters=lengths["lr_decay_iters"],
        lr_wsd_decay_iters=lengths["lr_wsd_decay_iters"] if tr.lr_decay_style == "WSD" else None,
        lr_points=([[int(step), float(lr)] for step, lr in tr.lr_points]
                   if tr.lr_decay_style == "piecewise" and tr.lr_points else None),
        recompute_granularity=None if rc.granularity == "none" else rc.granularity,
        recompute_method=rc.method if full else None,
        recompute_num_layers=rc.num_layers if full else None,
        cp_comm_type="all_gather" if par.cp_comm_type == "allgather" else par.cp_comm_type,
        block_size=spec.objective.block_size if resolved.attention_mask == "block_causal" else None,
        fsdp=fsdp,
        fsdp_reduce_scatter=reduce_scatter,
        fsdp_all_gather=all_gather,
        grad_reduce_group=group,
        overlap_grad_reduce=reduce_scatter or (par.overlap_grad_reduce and group > 1),
        overlap_param_gather=all_gather or (par.overlap_param_gather and group > 1),
        cuda_device_max_connections_1=(resolved.tp > 1 or par.sequence_parallel) and not fsdp,
        use_transformer_engine={"auto": None, "transformer_engine": True, "local": False}[resolved.transformer_impl],
        bias_activation_fusion=m.activation in ("swiglu", "geglu") or (m.activation == "gelu" and m.add_bias_linear),
        peak_tflops=peak,
        peak_source=peak_source,
        init_cache_dir=init_cache_dir(resolved),
        resume_from_run=spec.checkpoint.resume_from_run if spec.checkpoint.resume else None,
        min_masked_tokens=spec.objective.min_masked_tokens or 0,
        variable_length=spec.objective.variable_length or "sequence",
        loss_normalization=normalization,
        calculate_per_token_loss=normalization == "global_token",
        variable_length_multiple=math.lcm(2 * resolved.cp if resolved.cp > 1 else 1,
                                          resolved.tp if par.sequence_parallel and resolved.tp > 1 else 1),
        shift=bool(spec.objective.shift),
        unshift=(bool(spec.objective.unshift) and objectives.get(spec.objective.kind).diffusion
                 and spec.stage.kind != "sft"),  # MegaDLMs' window: masked diffusion pre-training only
        cart_p=((CART_P_DEFAULT if spec.objective.cart_p is None else spec.objective.cart_p)
                if spec.objective.loss_weighting == "cart" else None),
        save_at_end=spec.checkpoint.save is not None and bool(spec.checkpoint.save_at_end),
        tensorboard=spec.logging.tensorboard_dir is not None,
        wandb_exp_name=spec.logging.wandb_exp_name or spec.name,
        wandb_mode=spec.logging.wandb_mode or "online",
        wandb_tags=list(spec.logging.wandb_tags or []),
        recompute_modules=tuple(rc.modules) if rc.modules else ("core_attn",),
        plan_recompute_method=rc.method or "uniform",
        plan_recompute_layers=rc.num_layers or 1,
        blend=None if spec.data.mock else resolved.train_blend.pairs(),
        valid_blend=None if spec.data.mock or not resolved.valid_blend.pairs() else resolved.valid_blend.pairs(),
        max_unique_tokens=None if spec.data.mock else (train_caps(spec.data.train) or None),
        generation_every=(None if spec.eval is None or spec.eval.generation is None
                          else spec.eval.generation.every or tr.eval_interval),
    )
