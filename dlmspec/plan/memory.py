"""Per-GPU memory of a training step, per pipeline stage, as a breakdown in bytes.

What is counted is what megatron-core 0.16 keeps on a GPU during training with the layers
``backends/megatron`` builds: static memory (weights, gradients, optimizer state, FSDP shards,
fp8 copies), the activations each module saves (Korthikanti et al. 2022, sec. 4, with flash
attention, GQA and recomputation), the microbatches in flight under each pipeline schedule, and
the loss. The model, its notation and its sources, term by term: docs/planner-methods.md, "The memory
model"; the measurements it was checked against: ``bench/results/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import ceil
from typing import Any, Callable

from dlmspec.plan.calibration import DEFAULT_CALIBRATION, Calibration
from dlmspec.plan.pipeline_stages import (heaviest_stage, in_flight, in_flight_layers,  # noqa: F401 - read here too
                                          stage_layer_counts)
from dlmspec.plan import optimizer_state
from dlmspec.plan.shape import DTYPE_BYTES, Layout, ModelShape, input_length, output_rows

#: Breakdown keys of allocated memory, in report order (``peak_allocated_bytes`` is their sum).
ALLOCATED_TERMS = (
    "weights",
    "gradients",
    "optimizer_states",
    "fp8_weight_cache",
    "fsdp_unsharded_buffers",
    "sp_gather_buffer",
    "activations",
    "embedding_output_activations",
    "batch_and_objective",
    "loss_logits",
    "backward_transient",
    "optimizer_step_transient",
    "allocated_overhead",
)

#: Breakdown keys of memory outside the allocator (``peak_bytes`` adds them).
RESERVED_TERMS = ("cuda_context", "nccl_buffers", "allocator_reserve")

@dataclass(frozen=True)
class StageTermInputs:
    """What a stage's memory term reads of one pipeline rank (besides the shape and layout).

    Attributes:
        stage: pipeline rank (0 = first).
        params: (non-expert, expert) parameters on the rank (:func:`stage_params`), scalars.
        param_bytes: bytes per weight in the run's dtype (2 for bf16/fp16, 4 for fp32).
        in_flight: microbatches of activations held at the peak (:func:`in_flight`).
    """

    stage: int
    params: tuple[float, float]
    param_bytes: int
    in_flight: float


@dataclass(frozen=True)
class StageMemoryTerm:
    """Memory a training stage keeps on every GPU besides the policy's (a frozen reference
    model's weights, rollout buffers), allocated for the whole step (counted in both the
    forward/backward and the optimizer-step peak).

    Attributes:
        name: its breakdown key (after :data:`ALLOCATED_TERMS`, before :data:`RESERVED_TERMS`).
        label: what it is, for the plan's table.
        bytes: ``(shape, layout, inputs) -> bytes`` on the rank (:class:`StageTermInputs`).
    """

    name: str
    label: str
    bytes: Callable[[ModelShape, Layout, StageTermInputs], float]


#: ``[stage] kind`` -> its memory terms (:func:`register_stage_memory_term`); pre-training and
#: SFT have none.
STAGE_MEMORY_TERMS: dict[str, tuple[StageMemoryTerm, ...]] = {}


def register_stage_memory_term(kind: str, term: StageMemoryTerm) -> None:
    """Count ``term`` in the memory of every plan of ``[stage] kind = kind`` (replacing a term
    of the same name: a module imported twice registers again).

    Raises:
        ValueError: ``term.name`` is one of the planner's own terms.
    """
    if term.name in ALLOCATED_TERMS or term.name in RESERVED_TERMS:
        raise ValueError(f"stage memory term {term.name!r} is one of the planner's own terms")
    kept = tuple(t for t in STAGE_MEMORY_TERMS.get(kind, ()) if t.name != term.name)
    STAGE_MEMORY_TERMS[kind] = kept + (term,)


def stage_memory_label(name: str) -> str:
    """The label of a registered stage memory term (``name`` itself when none has it)."""
    for terms in STAGE_MEMORY_TERMS.values():
        for term in terms:
            if term.name == name:
                return term.label
    return name


#: Activation terms each selective-recompute module drops from a layer (megatron-core
#: ``TransformerConfig.recompute_modules``; ``core_attn``, which frees part of a term, is
#: handled in :func:`apply_selective`).
SELECTIVE_DROPS: dict[str, tuple[str, ...]] = {
    "layernorm": ("qkv_input", "mlp_input"),
    "mlp": ("mlp_activation_input", "mlp_fc2_input"),
    "moe": (
        "router",
        "expert_input",
        "expert_activation_input",
        "expert_fc2_input",
        "expert_output",
        "shared_activation_input",
        "shared_fc2_input",
    ),
    "moe_act": ("expert_fc2_input",),
    "shared_experts": ("shared_activation_input", "shared_fc2_input"),
}


#: Bytes of a micro-batch per input position on the first pipeline rank: the int64 token ids and
#: position ids (8 + 8); the objective adds its own (``ModelShape.objective_bytes_per_token``: MDM's
#: and block diffusion's noised ids and masks, 9), per input position too
#: (``backends/megatron/objectives``: ``ObjectiveBatch.input_ids``, ``position_ids``, ``source_ids``,
#: ``masked``, ``token_mask``).
BATCH_BYTES_PER_INPUT_POSITION = 16
#: Bytes per row reaching the output layer on the last pipeline rank: int64 labels (8), fp32 loss
#: weights (4), the fp32 per-token loss and its gradient (4 + 4). Block diffusion without an AR loss
#: hands the loss ``[b, L]`` labels and weights for its ``2 L`` input positions
#: (``BlockDiffusionObjective.prepare_batch`` with ``noised_half_loss``), so these count the output
#: rows (:func:`dlmspec.plan.shape.output_rows`), not the input positions.
BATCH_BYTES_PER_OUTPUT_ROW = 20


#: Rows per chunk of the PyTorch fused linear cross entropy
#: (``dlmspec.backends.megatron.output_loss.DEFAULT_CHUNK_ROWS``).
TORCH_FUSED_CE_CHUNK_ROWS = 4096


def fused_linear_ce_bytes(rows: float, hidden: int, vocab: int, y: int, impl: str) -> float:
    """Transient bytes of the fused linear cross entropy (``[kernels] cross_entropy =
    "fused_linear"``, ``backends/megatron/output_loss.py``) around the loss.

    ``rows`` = ``T`` positions (an upper bound of the masked ones it projects), ``hidden`` =
    ``h``, ``vocab`` = ``V`` (padded), ``y`` = activation bytes. Alive together: the model's
    fp32 output ``4 T h`` (``Float16Module`` casts the last stage's output to fp32), the
    selected rows and their gradient ``2 y T h``, the weight gradient (Liger: ``y V h`` in the
    weight's dtype; PyTorch: ``4 V h`` fp32) and one chunk's logits: Liger's chunk of
    ``next_pow2(ceil(T / ceil(V / h)))`` rows in ``y`` bytes (``liger_kernel.ops.
    fused_linear_cross_entropy``), PyTorch's ``min(T, 4096)`` rows as fp32 logits, the
    ``logsumexp`` temporary and the ``y``-byte gradient (``4 + 4 + y`` bytes per element).
    ``impl``: ``"liger"`` or ``"torch"`` (:attr:`~dlmspec.plan.shape.Layout.fused_linear_backend`).

    Returns:
        Bytes.
    """
    base = 4 * rows * hidden + 2 * y * rows * hidden
    if impl == "torch":
        chunk = min(rows, TORCH_FUSED_CE_CHUNK_ROWS)
        return base + 4 * vocab * hidden + (8 + y) * chunk * vocab
    per = max(1, ceil(vocab / hidden))
    chunk = 1 << max(0, ceil(rows / per) - 1).bit_length()
    return base + y * vocab * hidden + y * chunk * vocab


#: Megatron-FSDP's communication unit in megatron-core 0.16.1, elements: ``max(1_000_000_000,
#: suggested_communication_unit_size)`` (so never less); the all-gather prefetch is half of it.
MEGATRON_FSDP_UNIT = 1_000_000_000


def fsdp_sharding(lay: Layout) -> tuple[bool, bool, bool]:
    """(weights, gradients, optimizer state) sharded over data parallelism, for ``lay.fsdp`` /
    ``lay.sharding`` (megatron ``data_parallel_sharding_strategy``) and the distributed optimizer."""
    if lay.fsdp == "torch":
        return True, True, True
    if lay.fsdp == "megatron":
        return (lay.sharding == "optim_grads_params", lay.sharding in ("optim_grads", "optim_grads_params"),
                lay.sharding != "no_shard")
    return False, False, lay.distributed_optimizer


def fsdp_unsharded_bytes(lay: Layout, params: float, layers: int, param_b: int, grad_b: int) -> float:
    """Unsharded FSDP buffers alive during forward/backward on a stage of ``params`` parameters
    and ``layers`` layers (the FSDP units): see the module docstring. Megatron-FSDP: gathered
    bf16 weights ``param_b * min(P, P/L + unit/2)`` (``optim_grads_params``) plus queued unsharded
    gradients ``grad_b * min(P, P/L + unit)`` (``optim_grads`` and ``optim_grads_params``); torch
    FSDP2: two layers of weights and gradients."""
    if not layers or not params:
        return 0.0
    layer = params / layers
    if lay.fsdp == "torch":
        return 2 * layer * (param_b + grad_b)
    if lay.fsdp != "megatron":
        return 0.0
    total = 0.0
    if lay.sharding == "optim_grads_params":
        total += param_b * min(params, layer + MEGATRON_FSDP_UNIT / 2)
    if lay.sharding in ("optim_grads", "optim_grads_params"):
        total += grad_b * min(params, layer + MEGATRON_FSDP_UNIT)
    return total


def expert_tokens(shape: ModelShape, lay: Layout) -> float:
    """Token-expert pairs one rank's experts process per microbatch and MoE layer, ``N``.

    Each token goes to ``topk`` experts; with balanced routing the ``E/ep`` local experts of a
    rank receive the share of its own tokens (megatron-core ``MoEAlltoAllTokenDispatcher``).
    With sequence parallelism a rank routes its ``T/t`` tokens and the dispatcher gathers them
    over the expert-TP group (``etp``), so ``N = T*k*etp/t``; without it every TP rank holds all
    ``T`` tokens, ``N = T*k``. Routing is assumed balanced (the aux loss keeps it near).
    """
    T = lay.micro_batch * input_length(shape, lay) / lay.cp
    r = lay.sequence_divisor
    if r > 1:
        return T * shape.topk * lay.etp / r
    return T * shape.topk


def layer_activation_terms(shape: ModelShape, lay: Layout, moe: bool) -> dict[str, float]:
    """Bytes one transformer layer saves for backward, per microbatch, per rank, before
    recomputation, by tensor.

    Terms (``T = b*s/cp`` tokens, ``r`` the sequence-parallel divisor, ``y`` activation
    bytes, ``y8`` = 1 for linear inputs TE saves in fp8, else ``y``):

    * ``norm_inputs``: inputs of ``input_layernorm`` and ``pre_mlp_layernorm`` (the residual
      stream) plus their fp32 ``rstd`` (and mean for LayerNorm): ``2*(y*T*h + 4*T)/r``
      (Korthikanti Table 2: 4sbh/t with SP).
    * ``qkv_input``: the norm output ``linear_qkv`` saves: ``y8*T*h/r`` (with SP megatron saves
      the local shard and re-gathers it in backward).
    * ``qkv_output``: ``linear_qkv``'s output ``[T, (a+2g)d/t]``, kept alive because ``v``
      (and the q/k norm inputs) are views of it (megatron-core
      ``SelfAttention.get_query_key_value_tensors`` splits by ``torch.split``).
    * ``qk_norm_stats``: fp32 ``rstd`` per head row of q/k norm.
    * ``qk_norm_query_copy``: with q/k norm and more than one query group per TP rank (and
      ``a > g``), ``query.reshape`` of the split QKV view is a copy, which ``q_layernorm`` saves:
      ``y*T*a*d/t``.
    * ``rotated_qk``: RoPE (and/or q/k norm) write new q and k: ``y*T*(a+g)d/t``.
    * ``rope_cos_sin``: unfused RoPE (``apply_rope_fusion=False``) saves the ``[s, 1, 1, d_rot]``
      cos and sin it multiplies q and k by: ``4*y*(s/cp)*d_rot`` (megatron-core
      ``_apply_rotary_pos_emb_bshd``).
    * ``attention_output``: SDPA/flash output ``y*T*a*d/t`` and its fp32 log-sum-exp ``4*T*a/t``
      (FlashAttention-2, Dao 2023: O and L are what backward needs; no ``s*s`` matrix). The
      ``[b,np,s,hn] -> [s,b,np*hn]`` reshape is a view (the kernels write ``[b,s,np,hn]``), so
      ``linear_proj`` saves the same storage.
    * ``attention_output_copy``: with fp8 TE, the fp8 cast of ``linear_proj``'s input.
    * ``attention_mask_path``: local+sdpa with a mask (block-causal, or MDM sequences cut by
      ``variable_length_prob``): SDPA's memory-efficient kernel saves the additive mask
      (``y*s*s`` per layer for the block pattern; the truncated sequences' key-padding mask is
      ``[b, 1, 1, s]``, broadcast over queries and heads: ``y*b*s``) and, when
      ``a != g``, the ``repeat_interleave``-d k and v (``2*y*T*a*d/t``) in place of the rotated k
      (``-y*T*g*d/t``) and - without q/k norm - of the mixed QKV output. A run's peak includes
      the steps where a sequence was truncated, so the term counts whenever the spec allows it.
      An SFT stage's segment mask (``ModelShape.segment_mask``: packed conversations, or MDM
      padding partly unsupervised) is ``[b, 1, s, s]``: ``y*b*s*s``.
    * ``cp_gathered_kv`` (local+sdpa with ``cp > 1``): ``SDPACoreAttention`` all-gathers k and
      v over the CP group (``backends/megatron/attention.py``) and SDPA saves the gathered
      ``[cp*T, g*d/t]`` pair, in place of the rotated local k: ``2*y*cp*T*g*d/t - y*T*g*d/t``.
      Causal / block-causal attention sends each of the rank's two query chunks (``c = s/(2*cp)``
      tokens, chunks ``r`` and ``2*cp-1-r``) to a key prefix, ``(2*cp+1)*c`` keys together on
      every rank, i.e. ``(cp + 1/2)*T`` tokens, with its ``[c, keys]`` mask (``attention_mask_path``:
      ``y*c*(2*cp+1)*c``); with ``a != g`` the prefixes are ``repeat_interleave``-d to ``a``
      heads (``2*y*(cp+1/2)*T*a*d/t``).
    * ``dropout_masks``: with ``hidden_dropout > 0`` two bool masks ``T*h/r``
      (Korthikanti's ``2sbh``); attention dropout inside flash/SDPA replays its RNG, no mask.
    * dense MLP: ``mlp_input`` (fc1 input ``y8*T*h/r``), ``mlp_activation_input`` (fc1 output
      ``y*T*f*(2 if gated)/t``, saved by megatron's fused ``bias_swiglu_impl`` /
      ``bias_gelu_impl``), ``mlp_fc2_input`` (``y8*T*f/t``).
    * MoE (``megatron.core.transformer.moe``): ``router`` (fp32 probabilities and scores for
      the aux loss, bool routing map: ``9*T*E/r``), ``expert_input`` (the ``N`` dispatched
      token copies of :func:`expert_tokens`, ``y8*N*h``), ``expert_activation_input`` (``y*N*f_e*(2 if gated)/etp``),
      ``expert_fc2_input`` (``y8*N*f_e/etp``), ``expert_output`` (unpermute keeps the expert
      outputs to weight them by the router probabilities, ``y*T*k*h/r``), and the shared
      expert's ``shared_activation_input``/``shared_fc2_input``.
    """
    h, a, g, d = shape.hidden, shape.heads, shape.groups, shape.head_dim
    t, r = lay.tp, lay.sequence_divisor
    y = DTYPE_BYTES[lay.dtype]
    y8 = 1 if lay.fp8 else y
    T = lay.micro_batch * input_length(shape, lay) / lay.cp
    stat = 8 if shape.layernorm else 4
    gate = 2 if shape.gated else 1
    local = lay.impl != "transformer_engine"
    terms: dict[str, float] = {
        "norm_inputs": 2 * (y * T * h + stat * T) / r,
        "qkv_input": y8 * T * h / r,
        "qkv_output": y * T * (a + 2 * g) * d / t,
        "qk_norm_stats": stat * T * (a + g) / t if shape.qk_norm else 0.0,
        "qk_norm_query_copy": y * T * a * d / t if (shape.qk_norm and g // t > 1 and a > g) else 0.0,
        "rotated_qk": y * T * (a + g) * d / t if (shape.rope or shape.qk_norm) else 0.0,
        "rope_cos_sin": 4 * y * input_length(shape, lay) / lay.cp * shape.rotary_dim if shape.rope else 0.0,
        "attention_output": y * T * a * d / t + 4 * T * a / t,
        "attention_output_copy": T * a * d / t if lay.fp8 else 0.0,
        "attention_mask_path": 0.0,
        "dropout_masks": 2 * T * h / r if shape.hidden_dropout > 0 else 0.0,
    }
    if local:
        s_local = input_length(shape, lay) / lay.cp
        mask = 0.0
        if shape.attention == "block_causal":
            mask = y * s_local * input_length(shape, lay)
        if shape.variable_length_prob > 0:
            mask = max(mask, y * lay.micro_batch * input_length(shape, lay))
        if shape.segment_mask:
            mask = max(mask, y * lay.micro_batch * s_local * input_length(shape, lay))
        if lay.cp > 1 and shape.attention != "bidirectional":
            c = s_local / 2
            mask = y * c * (2 * lay.cp + 1) * c
        if lay.cp > 1:
            expand = shape.attention != "bidirectional" and a != g
            keys = (lay.cp + 0.5) * T if expand else lay.cp * T
            terms["cp_gathered_kv"] = 2 * y * keys * (a if expand else g) * d / t - y * T * g * d / t
        elif mask and a != g:
            # GQA on the masked kernel: k and v are repeat_interleave'd to a heads and saved;
            # the rotated k is then saved by nothing (freed), and without q/k norm nothing keeps
            # the mixed QKV storage alive either.
            mask += 2 * y * T * a * d / t - y * T * g * d / t
            if not shape.qk_norm:
                mask -= terms["qkv_output"]
        terms["attention_mask_path"] = mask
    if not moe:
        terms["mlp_input"] = y8 * T * h / r
        terms["mlp_activation_input"] = y * T * shape.ffn * gate / t
        terms["mlp_fc2_input"] = y8 * T * shape.ffn / t
        return terms
    E, k, fe, etp = shape.num_experts, shape.topk, shape.expert_ffn, lay.etp
    N = expert_tokens(shape, lay)
    terms["mlp_input"] = y8 * T * h / r
    terms["router"] = 9 * T * E / r
    terms["expert_input"] = y8 * N * h
    terms["expert_activation_input"] = y * N * fe * gate / etp
    terms["expert_fc2_input"] = y8 * N * fe / etp
    terms["expert_output"] = y * T * k * h / r
    if shape.shared_ffn:
        terms["shared_activation_input"] = y * T * shape.shared_ffn * gate / t
        terms["shared_fc2_input"] = y8 * T * shape.shared_ffn / t
    return terms


def apply_selective(
    terms: dict[str, float], modules: tuple[str, ...], moe: bool, *, lse: float
) -> dict[str, float]:
    """``terms`` after megatron-core selective recomputation of ``modules``.

    ``core_attn`` (``TransformerConfig.recompute_modules`` default) checkpoints the core
    attention: its inputs q, k, v stay saved (by the checkpoint), its fp32 log-sum-exp
    (``lse`` bytes) and mask path are recomputed, and its output survives, as
    ``linear_proj``'s input. ``mlp`` applies to dense layers; ``moe``, ``moe_act`` and
    ``shared_experts`` to MoE layers; ``layernorm`` drops the norm outputs
    (``CheckpointWithoutOutput``). Keys: :data:`SELECTIVE_DROPS`.
    """
    out = dict(terms)
    for module in modules:
        if module == "core_attn":
            out["attention_output"] = max(0.0, out["attention_output"] - lse)
            out["attention_mask_path"] = 0.0
            if "cp_gathered_kv" in out:  # gathered again inside the recomputed core attention
                out["cp_gathered_kv"] = 0.0
            continue
        if module == "mlp" and moe:
            continue
        if module in ("moe", "moe_act", "shared_experts") and not moe:
            continue
        for key in SELECTIVE_DROPS.get(module, ()):
            if key in out:
                out[key] = 0.0
    return out


@dataclass
class LayerTerms:
    """Per-layer activation terms for one layout: dense and MoE layer, before and after
    selective recomputation, plus the bytes of one layer's backward workspace."""

    dense: dict[str, float]
    moe: dict[str, float]
    dense_kept: dict[str, float]
    moe_kept: dict[str, float]
    dense_total: float
    moe_total: float
    dense_kept_total: float
    moe_kept_total: float
    layer_input: float
    dense_backward: float
    moe_backward: float


def layer_terms(shape: ModelShape, lay: Layout) -> LayerTerms:
    """Compute :class:`LayerTerms` (see :func:`layer_activation_terms`,
    :func:`apply_selective`, :func:`backward_workspace`)."""
    y = DTYPE_BYTES[lay.dtype]
    T = lay.micro_batch * input_length(shape, lay) / lay.cp
    lse = 4 * T * shape.heads / lay.tp
    dense = layer_activation_terms(shape, lay, False)
    moe = layer_activation_terms(shape, lay, True) if shape.is_moe else {}
    if lay.recompute == "selective":
        modules = lay.recompute_modules
        dense_kept = apply_selective(dense, modules, False, lse=lse)
        moe_kept = apply_selective(moe, modules, True, lse=lse) if moe else {}
    else:
        dense_kept, moe_kept = dense, moe
    return LayerTerms(
        dense=dense,
        moe=moe,
        dense_kept=dense_kept,
        moe_kept=moe_kept,
        dense_total=sum(dense.values()),
        moe_total=sum(moe.values()),
        dense_kept_total=sum(dense_kept.values()),
        moe_kept_total=sum(moe_kept.values()),
        layer_input=y * T * shape.hidden / lay.sequence_divisor,
        dense_backward=backward_workspace(shape, lay, False),
        moe_backward=backward_workspace(shape, lay, True) if moe else 0.0,
    )


def backward_workspace(shape: ModelShape, lay: Layout, moe: bool) -> float:
    """Bytes alive only while one layer runs its backward (added once per stage).

    MLP backward holds the incoming gradient and the gradients of fc2's input and fc1's output
    (``y*T*f*(3 if gated else 2)/t``), the re-gathered fc1 input under sequence parallelism
    and fc1's input gradient before its reduce-scatter (``y*T*h`` each), and - on the local
    path, without ``gradient_accumulation_fusion`` - the bf16 weight gradient of fc1 before it
    is added to ``main_grad``. Attention backward holds dq, dk, dv, dO and FlashAttention's fp32
    dq accumulator. The larger of the two counts; MoE layers use the per-rank expert tokens.
    """
    h, a, g, d = shape.hidden, shape.heads, shape.groups, shape.head_dim
    t, r = lay.tp, lay.sequence_divisor
    y = DTYPE_BYTES[lay.dtype]
    T = lay.micro_batch * input_length(shape, lay) / lay.cp
    gate = 2 if shape.gated else 1
    gathered = y * T * h if r > 1 else 0.0
    local = lay.impl != "transformer_engine"
    if moe:
        f, tt, tokens = shape.expert_ffn, lay.etp, expert_tokens(shape, lay)
    else:
        f, tt, tokens = shape.ffn, t, T
    wgrad = y * h * f * gate / tt if local else 0.0
    mlp = y * tokens * f * (gate + 1) / tt + gathered + y * tokens * h + wgrad
    attn = y * T * (2 * a + 2 * g) * d / t + 4 * T * a * d / t + gathered + (y * h * (a + 2 * g) * d / t if local else 0.0)
    return max(mlp, attn)


@dataclass
class StageMemory:
    """Memory of one pipeline rank at its peak.

    Attributes:
        stage: pipeline rank (0 = first).
        layers: transformer layers on the rank (dense, MoE).
        in_flight: microbatches of activations held at the peak (:func:`in_flight`).
        params: parameters on the rank (dense/shared part, expert part), scalars.
        breakdown: bytes per term at the peak (:data:`ALLOCATED_TERMS`, then the training
            stage's own terms (:data:`STAGE_MEMORY_TERMS`), then :data:`RESERVED_TERMS`).
        phase: ``forward_backward`` or ``optimizer_step`` - when the peak happens.
        peak_allocated_bytes: sum of the allocated terms (compare with
            ``torch.cuda.max_memory_allocated``).
        peak_bytes: all terms: allocated plus CUDA context, NCCL and allocator reserve (what
            must fit the GPU).
        stage_terms: the keys of the stage's own terms in ``breakdown`` (allocated memory).
    """

    stage: int
    layers: tuple[int, int]
    in_flight: float
    params: tuple[float, float]
    breakdown: dict[str, float] = field(default_factory=dict)
    phase: str = "forward_backward"
    peak_allocated_bytes: float = 0.0
    peak_bytes: float = 0.0
    stage_terms: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (integers of bytes)."""
        return {
            "stage": self.stage,
            "dense_layers": self.layers[0],
            "moe_layers": self.layers[1],
            "in_flight_microbatches": round(self.in_flight, 4),
            "parameters": int(round(self.params[0] + self.params[1])),
            "phase": self.phase,
            "peak_allocated_bytes": int(round(self.peak_allocated_bytes)),
            "peak_bytes": int(round(self.peak_bytes)),
            "breakdown": {k: int(round(v)) for k, v in self.breakdown.items()},
        }


def stage_params(shape: ModelShape, lay: Layout, stage: int, counts: tuple[int, int] | None = None) -> tuple[float, float]:
    """(non-expert, expert) parameters held by pipeline rank ``stage``, scalars.

    TP splits ``linear_qkv``/``linear_proj``/``linear_fc1``/``linear_fc2`` and the vocabulary
    (megatron-core ``ColumnParallelLinear``/``RowParallelLinear``/``VocabParallelEmbedding``);
    norms, the router, ``linear_proj``/``fc2`` biases and learned positions are replicated.
    Experts: ``E/ep`` per rank, each split over expert TP. The first stage holds the word
    (and position) embedding; the last the final norm and the output layer - with tied
    embeddings and ``pp > 1`` a second copy of the word embedding (megatron-core
    ``LanguageModule.setup_embeddings_and_output_layer``).
    """
    dense_n, moe_n = counts if counts is not None else stage_layer_counts(shape, lay, stage)
    t = lay.tp
    attn = shape.attn_split / t + shape.attn_repl + shape.norms_repl
    dense_layer = attn + shape.mlp_split / t + shape.mlp_repl
    params = dense_n * dense_layer
    expert = 0.0
    if moe_n:
        params += moe_n * (attn + shape.router + shape.shared_split / t + shape.shared_repl)
        expert = moe_n * (shape.num_experts / lay.ep) * shape.expert_params / lay.etp
    emb = shape.vocab * shape.hidden / t
    if stage == 0:
        params += emb + shape.learned_positions * shape.hidden
    if stage == lay.pp - 1:
        params += shape.final_norm
        if not shape.tied or lay.pp > 1:
            params += emb
    return params, expert


def linear_params(shape: ModelShape, lay: Layout, counts: tuple[int, int]) -> float:
    """Parameters of the linear layers on a rank (what TE casts to fp8)."""
    dense_n, moe_n = counts
    t = lay.tp
    per = shape.attn_split / t
    out = dense_n * (per + shape.mlp_split / t)
    if moe_n:
        out += moe_n * (per + shape.shared_split / t + (shape.num_experts / lay.ep) * shape.expert_params / lay.etp)
    return out


def _nccl_groups(lay: Layout, shape: ModelShape) -> int:
    """Communicators a rank uses: TP, PP (p2p), CP, DP x CP, EP, expert DP, embedding sync."""
    groups = [lay.tp, lay.pp, lay.cp, lay.dp * lay.cp]
    if shape.is_moe:
        groups += [lay.ep, lay.expert_dp, lay.etp]
    count = sum(1 for n in groups if n > 1)
    if lay.pp > 1 and shape.tied:
        count += 1
    return count


def stage_memory(
    shape: ModelShape,
    lay: Layout,
    stage: int,
    terms: LayerTerms | None = None,
    calib: Calibration = DEFAULT_CALIBRATION,
) -> StageMemory:
    """Memory of pipeline rank ``stage`` at its peak (see the module docstring for each term).

    The peak is the larger of two moments: during forward/backward (static memory + stored
    activations of the in-flight microbatches + the largest transient: the loss's logits on
    the last stage, or one layer's backward workspace plus what recomputation rebuilds), and
    during the optimizer step (static memory + the step's temporaries).
    """
    lt = terms if terms is not None else layer_terms(shape, lay)
    counts = stage_layer_counts(shape, lay, stage)
    dense_n, moe_n = counts
    p_dense, p_expert = stage_params(shape, lay, stage, counts)
    y = DTYPE_BYTES[lay.dtype]
    param_b = 4 if lay.dtype == "fp32" else 2
    grad_b = 4 if (lay.grad_fp32 or lay.dtype == "fp32") else param_b
    opt_b = optimizer_state.gpu_bytes_per_param(lay)  # [train] optimizer-state options (plan/optimizer_state.py)
    shard = lay.dp * lay.cp
    eshard = lay.expert_dp
    full_fsdp, grad_fsdp, opt_sharded = fsdp_sharding(lay)

    def sharded(dense: float, expert: float, on: bool) -> float:
        return dense / shard + expert / eshard if on else dense + expert

    weights = param_b * sharded(p_dense, p_expert, full_fsdp)
    gradients = grad_b * sharded(p_dense, p_expert, grad_fsdp)
    optimizer = opt_b * sharded(p_dense, p_expert, opt_sharded)
    fp8_cache = 2 * linear_params(shape, lay, counts) if lay.fp8 else 0.0
    if lay.fp8 and lay.fp8_param_gather and not full_fsdp:
        # fp8 primary weights (megatron-core fp8_param / fp8_param_gather: TE fp8_model_init builds
        # the linear weights as Float8Tensor / MXFP8Tensor; the DDP param buffer holds them as
        # uint8, megatron/core/distributed/param_and_grad_buffer.py ``_ParamAndGradBuffer``
        # ``param_dtype = torch.uint8`` for fp8 params): 1 byte per linear weight instead of the
        # bf16 copy, plus the 1-byte transpose (Hopper ``Float8Tensor._transpose``) or column-wise
        # copy (``MXFP8Tensor._columnwise_data``) that backward reads, in place of the 2-byte
        # per-step fp8 cache TE keeps for bf16 weights (``is_first_microbatch``).
        lin_expert = moe_n * (shape.num_experts / lay.ep) * shape.expert_params / lay.etp if moe_n else 0.0
        lin_dense = linear_params(shape, lay, counts) - lin_expert
        weights -= (param_b - 1) * (lin_dense + lin_expert)
        fp8_cache = 1 * (lin_dense + lin_expert)
    layers = dense_n + moe_n
    fsdp_buffers = fsdp_unsharded_bytes(lay, p_dense + p_expert, layers, param_b, grad_b)
    T = lay.micro_batch * input_length(shape, lay) / lay.cp
    h = shape.hidden
    sp_buffer = y * T * h if (lay.sp and lay.tp > 1) else 0.0

    # Activations kept per microbatch on this rank.
    flight = in_flight(lay, stage)
    scale = calib.activation_scale
    if lay.recompute == "full":
        stored_layers, recompute_transient = _full_recompute(lt, lay, dense_n, moe_n)
    else:
        stored_layers = dense_n * lt.dense_kept_total + moe_n * lt.moe_kept_total
        recompute_transient = 0.0
        if lay.recompute == "selective" and layers:
            recompute_transient = max(
                lt.dense_total - lt.dense_kept_total if dense_n else 0.0,
                lt.moe_total - lt.moe_kept_total if moe_n else 0.0,
            )
    first, last = stage == 0, stage == lay.pp - 1
    r = lay.sequence_divisor
    edge = 0.0
    if first and shape.hidden_dropout > 0:
        edge += T * h / r
    if last:
        stat = 8 if shape.layernorm else 4
        edge += (y * T * h + stat * T) / r + (1 if lay.fp8 else y) * T * h / r
    activations = scale * in_flight_layers(shape, lay, stage) * stored_layers
    edge_acts = scale * flight * edge
    # the micro-batch: ids and positions of every input position on the first rank, the loss's tensors
    # of the rows reaching the output layer on the last (block diffusion without an AR loss: x_t's L)
    batch = flight * ((BATCH_BYTES_PER_INPUT_POSITION + shape.objective_bytes_per_token) * T if first else 0.0)
    if last:
        batch += flight * BATCH_BYTES_PER_OUTPUT_ROW * output_rows(shape, lay)

    # The largest transient of forward/backward.
    loss = 0.0
    rows = output_rows(shape, lay)  # the rows reaching the output layer (block diffusion: x_t's only)
    if last and lay.fused_linear_ce:
        loss = fused_linear_ce_bytes(rows, h, shape.vocab, y, lay.fused_linear_backend)
    elif last:
        V = shape.vocab / lay.tp
        logits = (4 + (y if y != 4 else 0)) * rows * V
        out_bwd = y * rows * V + (y * V * h if lay.impl != "transformer_engine" else 0.0) + y * rows * h
        loss = logits if logits > out_bwd else out_bwd
    workspace = 0.0
    if layers:
        workspace = max(lt.dense_backward if dense_n else 0.0, lt.moe_backward if moe_n else 0.0) + recompute_transient
    loss_logits = scale * loss if loss >= workspace else 0.0
    backward = 0.0 if loss >= workspace else scale * workspace

    # The optimizer step: activations are gone, the step's temporaries appear.
    step = _step_transient(lay, p_dense, p_expert, opt_sharded, shard, eshard)
    phase = "forward_backward"
    if step > activations + edge_acts + batch + loss_logits + backward + fsdp_buffers:
        activations = edge_acts = batch = loss_logits = backward = sp_buffer = fsdp_buffers = 0.0
        phase = "optimizer_step"
    else:
        step = 0.0
    overhead = calib.allocated_overhead_bytes
    inputs = StageTermInputs(stage=stage, params=(p_dense, p_expert), param_bytes=param_b, in_flight=flight)
    extra = {t.name: float(t.bytes(shape, lay, inputs)) for t in STAGE_MEMORY_TERMS.get(shape.stage_kind, ())}
    allocated = (weights + gradients + optimizer + fp8_cache + fsdp_buffers + sp_buffer + activations + edge_acts
                 + batch + loss_logits + backward + step + overhead + sum(extra.values()))
    context = calib.cuda_context_bytes
    nccl = calib.nccl_bytes_per_group * _nccl_groups(lay, shape)
    reserve = calib.allocator_reserve_fraction * allocated
    b = {
        "weights": weights,
        "gradients": gradients,
        "optimizer_states": optimizer,
        "fp8_weight_cache": fp8_cache,
        "fsdp_unsharded_buffers": fsdp_buffers,
        "sp_gather_buffer": sp_buffer,
        "activations": activations,
        "embedding_output_activations": edge_acts,
        "batch_and_objective": batch,
        "loss_logits": loss_logits,
        "backward_transient": backward,
        "optimizer_step_transient": step,
        "allocated_overhead": overhead,
        **extra,
        "cuda_context": context,
        "nccl_buffers": nccl,
        "allocator_reserve": reserve,
    }
    return StageMemory(stage=stage, layers=counts, in_flight=flight, params=(p_dense, p_expert), breakdown=b,
                       phase=phase, peak_allocated_bytes=allocated, peak_bytes=allocated + context + nccl + reserve,
                       stage_terms=tuple(extra))


def _full_recompute(lt: LayerTerms, lay: Layout, dense_n: int, moe_n: int) -> tuple[float, float]:
    """(stored bytes per microbatch, transient bytes) of megatron-core full recomputation.

    ``uniform``: the stage's layers (per virtual chunk) are cut into groups of
    ``recompute_num_layers``; each group keeps its input, and its backward first recomputes
    the whole group. ``block``: the first ``recompute_num_layers`` layers of each chunk keep
    only their input, the rest keep everything; one recomputed layer is rebuilt at a time.
    (megatron-core ``TransformerBlock._checkpointed_forward``.)
    """
    layers = dense_n + moe_n
    if not layers:
        return 0.0, 0.0
    chunks = max(1, lay.vpp)
    per_chunk = layers / chunks
    n = max(1, min(lay.recompute_layers, int(per_chunk) or 1))
    avg_full = (dense_n * lt.dense_total + moe_n * lt.moe_total) / layers
    big = max(lt.dense_total if dense_n else 0.0, lt.moe_total if moe_n else 0.0)
    if lay.recompute_method == "block":
        checkpointed = min(n, per_chunk) * chunks
        stored = checkpointed * lt.layer_input + (layers - checkpointed) * avg_full
        return stored, big
    groups = ceil(per_chunk / n) * chunks
    return groups * lt.layer_input, n * big


def _step_transient(lay: Layout, p_dense: float, p_expert: float, sharded: bool, shard: int, eshard: int) -> float:
    """Temporaries of the optimizer step, bytes.

    Transformer Engine's ``FusedAdam`` (megatron-core's first choice) updates in place: 0.
    Without it megatron-core falls back to ``torch.optim.AdamW`` (foreach), whose
    ``_multi_tensor_adam`` allocates ``sqrt(exp_avg_sq)`` for every parameter it owns: 4 bytes
    per parameter; bf16 gradients are also copied to fp32 (``main_param.grad = grad.float()``).
    The precision-aware optimizer: :func:`dlmspec.plan.optimizer_state.step_transient_bytes`.
    """
    owned = p_dense / shard + p_expert / eshard if sharded else p_dense + p_expert
    if lay.precision_aware:  # TE FusedAdam (or the hybrid optimizer): its fp32 copies of low-precision state
        return optimizer_state.step_transient_bytes(lay) * owned
    temp = 0.0
    if lay.impl != "transformer_engine" and lay.optimizer == "adam":
        temp += 4 * owned
    if not lay.grad_fp32 and lay.dtype != "fp32":
        temp += 4 * owned
    return temp


@dataclass
class MemoryPlan:
    """Memory of every pipeline rank; ``peak`` is the worst one.

    Attributes:
        stages: one :class:`StageMemory` per pipeline rank.
        peak: the stage with the largest ``peak_bytes``.
        layer_terms: per-layer activation bytes (:class:`LayerTerms`).
    """

    stages: list[StageMemory]
    peak: StageMemory
    layer_terms: LayerTerms


def memory_plan(
    shape: ModelShape,
    lay: Layout,
    calib: Calibration = DEFAULT_CALIBRATION,
    *,
    all_stages: bool = True,
    terms: LayerTerms | None = None,
) -> MemoryPlan:
    """Memory of each pipeline rank.

    ``all_stages=False`` (the layout search) evaluates only the ranks that can be the peak:
    the first (most microbatches in flight, the embedding), the last (the logits), the rank
    with the most MoE layers and, with an uneven split, the first rank with the most layers; any
    other rank holds no more layers, fewer in-flight microbatches than one of these and neither
    the embedding nor the logits. ``terms`` reuses
    :func:`layer_terms` computed for a layout with the same per-layer shapes (the search caches
    them).
    """
    lt = terms if terms is not None else layer_terms(shape, lay)
    if all_stages or lay.pp <= 2:
        ids: list[int] = list(range(lay.pp))
    else:
        ids = [0, lay.pp - 1]
        if lay.pipeline_split is not None:
            ids.append(heaviest_stage(shape, lay))
        if shape.is_moe:
            moe_counts = [stage_layer_counts(shape, lay, i)[1] for i in range(lay.pp)]
            ids.append(max(range(lay.pp), key=lambda i: (moe_counts[i], -i)))
        ids = sorted(set(ids))
    stages = [stage_memory(shape, lay, i, lt, calib) for i in ids]
    peak = max(stages, key=lambda s: (s.peak_bytes, -s.stage))
    return MemoryPlan(stages=stages, peak=peak, layer_terms=lt)
