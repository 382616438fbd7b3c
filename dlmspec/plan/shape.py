"""Plain-number views of a resolved spec: the model's shapes and the run's layout.

The memory and time models read these small frozen dataclasses instead of the pydantic spec,
so the layout search (:mod:`dlmspec.plan.search`) can evaluate thousands of layouts by
``dataclasses.replace`` on a :class:`Layout` without building a spec per candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dlmspec import objectives
from dlmspec.attention import choose_backend
from dlmspec.gpus import GPU
from dlmspec.layout import derive as derive_layout
from dlmspec.params import mlp_params
from dlmspec.pipeline_split import Split, split_of, split_problems
from dlmspec.plan.sft import needs_segment_mask
from dlmspec.spec.optimizer_options import optimizer_options
from dlmspec.resolve import (LOCAL_CP_COMM_TYPES, Resolved, effective_cross_entropy, padded_vocab_size,  # noqa: F401 - search reads it here
                             runtime_values)

#: Bytes per element of each ``[precision] dtype``.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}



@dataclass(frozen=True)
class ModelShape:
    """The model's dimensions and per-module parameter counts (scalars, not bytes).

    Attributes:
        num_layers, hidden, ffn, heads, groups, head_dim: ``L, h, f, a, g, d``.
        vocab: padded vocabulary for the layout's TP (what the embedding and logits hold).
        tokenizer_vocab, vocab_divisible_by: the unpadded vocabulary and
            ``make_vocab_size_divisible_by`` (to re-pad for another TP size).
        gated: SwiGLU/GeGLU (``linear_fc1`` is ``[2f, h]``).
        layernorm: LayerNorm (weight + bias) instead of RMSNorm (weight only).
        qk_norm: per-head q/k normalisation (Qwen3).
        rope: rotary position embeddings; rotary_dim: rotated channels per head
            (``kv_channels * rotary_percent``).
        learned_positions: learned absolute position embedding rows (``max_position``).
        tied: input embedding and output layer share one matrix.
        num_experts, topk, expert_ffn, shared_ffn: MoE sizes (0 for a dense model).
        moe_layers: 1 per MoE layer, 0 per dense layer.
        hidden_dropout, attention_dropout: dropout probabilities.
        attention: ``bidirectional``, ``causal`` or ``block_causal``; block_size for the latter.
        objective: ``mdm`` or ``ar``; variable_length_prob: MDM's share of sequences cut one by one behind a
            key-padding mask (0 for a micro-batch cut, which is dense).
        loss_row_fraction, objective_bytes_per_token, extra_forward_passes: the objective's planner terms
            (:class:`dlmspec.objectives.Objective`): the share of positions carrying loss, the bytes per token
            its micro-batch adds on the first stage, the forward passes per micro-batch beyond the trained
            model's one. extra_seq_length: positions the objective adds to ``train.seq_length`` in the
            model's input (:func:`input_length`). attended_keys: the mean keys per query of that input
            where the objective's own mask sets them (block diffusion: ``(L + B) / 2`` over ``2 L``
            queries, :meth:`~dlmspec.objectives.Objective.attended_keys`); 0: the layer pattern's.
            extra_positions_output: whether those extra positions reach the output layer
            (:meth:`~dlmspec.objectives.Objective.extra_positions_output`; the rows:
            :func:`output_length`).
        attention_anneal_iters: ``objective.attention_anneal_iters`` (0: none); anneal_backend: the
            attention backend that runs the annealed mask (``sdpa`` or ``flex``; the extra memory of
            those steps: :mod:`dlmspec.plan.phases`).
        attn_split, attn_repl: attention parameters split over TP / replicated per TP rank.
        norms_repl: the two layer norms' parameters (replicated).
        mlp_split, mlp_repl: dense MLP parameters split over TP / replicated (fc2 bias).
        expert_params: one routed expert's MLP (split over expert TP).
        shared_split, shared_repl: the shared expert's MLP.
        router: router weight ``[E, h]`` (replicated).
        embedding_rows: rows of the word embedding (= vocab).
        final_norm: the final norm's parameters.
        total_params, active_params: :class:`dlmspec.params.ParamCounts` with the tokenizer
            vocabulary (published-figure comparable).
        padded_total_params: the same with the padded vocabulary (what is in memory).
        segment_mask: an SFT stage passes a ``[b, 1, s, s]`` segment mask (packed sequences, or
            MDM padding partly unsupervised: :func:`dlmspec.plan.sft.needs_segment_mask`).
        stage_kind: ``[stage] kind`` (its own memory and time terms:
            :data:`dlmspec.plan.memory.STAGE_MEMORY_TERMS`, :data:`dlmspec.plan.time.STAGE_TIME_TERMS`).
        stage_options: the ``[stage.<kind>]`` table those terms read (e.g. RL's rollouts), as
            sorted ``(key, value)`` pairs, lists as tuples (hashable); ``()`` without one.
    """

    num_layers: int
    hidden: int
    ffn: int
    heads: int
    groups: int
    head_dim: int
    vocab: int
    tokenizer_vocab: int
    vocab_divisible_by: int
    gated: bool
    layernorm: bool
    qk_norm: bool
    rope: bool
    rotary_dim: int
    learned_positions: int
    tied: bool
    num_experts: int
    topk: int
    expert_ffn: int
    shared_ffn: int
    moe_layers: tuple[int, ...]
    hidden_dropout: float
    attention_dropout: float
    attention: str
    block_size: int
    objective: str
    variable_length_prob: float
    attn_split: int
    attn_repl: int
    norms_repl: int
    mlp_split: int
    mlp_repl: int
    expert_params: int
    shared_split: int
    shared_repl: int
    router: int
    final_norm: int
    total_params: int
    active_params: int
    padded_total_params: int
    segment_mask: bool = False
    loss_row_fraction: float = 1.0
    objective_bytes_per_token: int = 0
    extra_forward_passes: int = 0
    extra_seq_length: int = 0
    attended_keys: float = 0.0
    extra_positions_output: bool = True
    attention_anneal_iters: int = 0
    anneal_backend: str = ""
    stage_kind: str = "pretrain"
    stage_options: tuple[tuple[str, Any], ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


@dataclass(frozen=True)
class Layout:
    """How one run is laid out and batched (what the search varies), plus the cluster.

    Attributes:
        tp, pp, vpp, cp, ep, etp, dp: parallel sizes (``vpp`` = 1 without interleaving).
        expert_dp: expert data-parallel size (world / (etp * ep * pp)).
        sp: sequence parallelism (only meaningful with tp > 1).
        micro_batch, global_batch, seq: batch sizes in sequences, sequence length in tokens.
        num_microbatches: gbs / (mbs * dp).
        recompute: ``none``, ``selective`` or ``full``; recompute_method ``uniform``/``block``;
            recompute_layers: megatron-core ``recompute_num_layers`` (full only);
            recompute_modules: selective modules (megatron-core default ``("core_attn",)``).
        distributed_optimizer: megatron's distributed optimizer (optimizer state sharded over DP).
        fsdp: ``none``, ``megatron`` or ``torch``; sharding: megatron FSDP strategy.
        overlap_grad_reduce, overlap_param_gather: DDP overlap switches.
        grad_fp32: gradients kept and reduced in fp32.
        dtype: ``bf16``, ``fp16`` or ``fp32``; fp8: TE fp8 on; fp8_attention: ``[precision]
            fp8_dot_product_attention`` with fp8 (attention planned at the fp8 peak); fp8_recipe:
            ``precision.fp8_recipe`` with fp8, ``""`` without.
        impl: ``transformer_engine`` or ``local+sdpa`` (the path the memory model assumes).
        cp_comm_type: ``[parallel] cp_comm_type`` (how context parallelism exchanges K/V).
        rope_fusion: ``[kernels] apply_rope_fusion`` (fused RoPE kernels; only with rotary
            embeddings).
        qkv_fusion: ``[kernels] qkv_fusion`` (local path: split of the QKV projection, q/k
            RMSNorm and RoPE in one ``torch.compile``'d function, ``backends/megatron/qkv.py``;
            :func:`qkv_fused` says where it applies). compiled_norm: ``[kernels] compiled_norm``
            (local path: ``torch.compile``'d RMSNorm/LayerNorm, ``backends/megatron/norms.py``).
            Both are ignored on the Transformer Engine path. sdpa_backend: ``[kernels] sdpa_backend`` as the spec says it
            (:func:`attention_backend` resolves ``auto`` against the GPU).
        optimizer: ``adam`` or ``sgd``.
        precision_aware, main_params_dtype, exp_avg_dtype, exp_avg_sq_dtype, store_param_remainders,
            cpu_offload, offload_fraction, overlap_offload: ``[train]``'s optimizer-state options
            (:mod:`dlmspec.spec.optimizer_options`; their bytes: :mod:`dlmspec.plan.optimizer_state`).
        moe_grouped_gemm: ``[model] moe_grouped_gemm`` on a MoE model (the experts' launches:
            :mod:`dlmspec.plan.moe_experts`).
        world, gpus_per_node: GPUs; inter_node_gbps: network bandwidth per GPU, Gbit/s.
        pipeline_split: megatron-core's uneven pipeline split options of ``[parallel]``:
            ``(num_layers_in_first_pipeline_stage, num_layers_in_last_pipeline_stage,
            account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split,
            pipeline_model_parallel_layout)``; None: the even split. :func:`pipeline_split` makes
            the :class:`~dlmspec.pipeline_split.Split` of a layout from it.
        host_launch_seconds: ``cluster.host_launch_us`` in seconds (host time per eager kernel
            launch, as ``backends/megatron/hostbench.py`` measures it), or None: the
            calibration's typical value (:attr:`Calibration.host_launch_seconds`).
        train_iters: optimizer steps of the run.
        tp_comm_overlap: tensor-parallel communication overlapped with the GEMMs through Transformer
            Engine's userbuffers (megatron-core ``TransformerConfig.tp_comm_overlap``). dlmspec does
            not compile it (False for every spec); a planner of a run that had it (the public
            measurements, ``bench/plan/public_points.py``) sets it.
        moe_a2a_overlap: the expert-parallel all-to-alls of one microbatch run beside another
            microbatch's forward or backward compute (megatron-core
            ``TransformerConfig.overlap_moe_expert_parallel_comm``, the combined 1F1B schedule of
            ``megatron/core/pipeline_parallel/combined_1f1b.py``). Not compiled by dlmspec (False
            for every spec); set like ``tp_comm_overlap`` for runs that had it.
        moe_flex_dispatcher: the backend of megatron-core's ``flex`` token dispatcher the MoE
            layers dispatch with (``moe_token_dispatcher_type = "flex"``,
            ``moe_flex_dispatcher_backend``: ``"deepep"`` or ``"hybridep"``), ``""`` for the
            ``alltoall`` / ``allgather`` dispatchers; its bytes: :func:`dlmspec.plan.comm.a2a_share`.
            Not compiled by dlmspec (``""`` for every spec: ``[model] moe_token_dispatcher_type``
            offers ``alltoall`` and ``allgather``); set like ``tp_comm_overlap`` for runs that had it.
        fp8_param_gather: with ``fp8``, the linear layers' primary weights are fp8 tensors
            (megatron-core ``TransformerConfig.fp8_param`` / ``DistributedDataParallelConfig.
            fp8_param_gather``: Transformer Engine ``fp8_model_init``), gathered by the distributed
            optimizer in fp8. Not compiled by dlmspec (False for every spec); set like
            ``tp_comm_overlap`` for runs that had it (:func:`dlmspec.plan.memory.stage_memory`
            counts their weights at 1 byte plus the 1-byte transpose / column-wise copy).
    """

    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    etp: int
    dp: int
    expert_dp: int
    sp: bool
    micro_batch: int
    global_batch: int
    seq: int
    num_microbatches: int
    recompute: str
    recompute_method: str
    recompute_layers: int
    recompute_modules: tuple[str, ...]
    distributed_optimizer: bool
    fsdp: str
    sharding: str
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    grad_fp32: bool
    dtype: str
    fp8: bool
    impl: str
    optimizer: str
    world: int
    gpus_per_node: int
    inter_node_gbps: float
    train_iters: int
    cross_entropy: str = "megatron"
    fused_linear_impl: str = "auto"
    cp_comm_type: str = "p2p"
    fp8_attention: bool = False
    fp8_recipe: str = ""
    rope_fusion: bool = False
    sdpa_backend: str = "auto"
    qkv_fusion: bool = False
    compiled_norm: bool = False
    host_launch_seconds: float | None = None
    tp_comm_overlap: bool = False
    moe_a2a_overlap: bool = False
    moe_flex_dispatcher: str = ""
    fp8_param_gather: bool = False
    pipeline_split: tuple[int | None, int | None, bool, bool, str | None] | None = None
    precision_aware: bool = False
    main_params_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    store_param_remainders: bool = True
    cpu_offload: bool = False
    offload_fraction: float = 1.0
    overlap_offload: bool = False
    moe_grouped_gemm: bool = False

    @property
    def fused_linear_ce(self) -> bool:
        """Whether the run takes the fused linear cross entropy at this layout's TP
        (:func:`dlmspec.resolve.effective_cross_entropy`, the rule ``resolve`` applies)."""
        return effective_cross_entropy(self.cross_entropy, self.tp, self.fsdp) == "fused_linear"

    @property
    def fused_linear_backend(self) -> str:
        """``"liger"`` or ``"torch"``: the fused cross entropy's implementation as planned
        (``auto`` is planned as Liger, what the runtime picks when it imports on CUDA)."""
        return "torch" if self.fused_linear_impl == "torch" else "liger"

    @property
    def act_bytes(self) -> int:
        """Bytes per activation element (the compute dtype)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def sequence_divisor(self) -> int:
        """What sequence-sharded activations (norm inputs, residuals) are divided by: TP with
        sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2), else 1."""
        return self.tp if (self.sp and self.tp > 1) else 1


def transformer_impl(resolved: Resolved) -> tuple[str, str]:
    """The layer implementation the run takes and why.

    Returns:
        ``(modelled, description)``: ``modelled`` is ``"transformer_engine"`` or
        ``"local+sdpa"``, the path the memory and time models assume; ``description`` says
        what the runtime does: the path :func:`dlmspec.resolve.layer_path` chose
        (``resolved.transformer_impl``, with its reason), or for ``"auto"`` Transformer Engine
        when it imports on the cluster, else megatron-core's local modules with SDPA core
        attention, modelled as the local path.
    """
    impl, reason = resolved.transformer_impl, resolved.transformer_impl_reason
    if impl == "transformer_engine":
        return "transformer_engine", f"transformer_engine ({reason})"
    if impl == "local":
        return "local+sdpa", f"local+sdpa: megatron-core local modules, SDPA core attention ({reason})"
    return (
        "local+sdpa",
        "auto: transformer_engine if importable on the cluster, else local+sdpa; "
        "modelled as local+sdpa (megatron-core local modules, SDPA core attention)",
    )


def model_shape(resolved: Resolved) -> ModelShape:
    """Extract the :class:`ModelShape` of ``resolved`` (parameter splits follow
    :mod:`dlmspec.params`, so ``attn_split + attn_repl`` equals its attention count)."""
    m = resolved.spec.model
    h, a, g, d = m.hidden_size, m.num_attention_heads, resolved.num_query_groups, resolved.kv_channels
    norm = 2 if m.normalization == "LayerNorm" else 1
    qkv_out = (a + 2 * g) * d
    attn_split = h * qkv_out + a * d * h + (qkv_out if (m.add_qkv_bias or m.add_bias_linear) else 0)
    attn_repl = (h if m.add_bias_linear else 0) + (2 * norm * d if m.qk_layernorm else 0)
    bias_h = h if m.add_bias_linear else 0
    mlp_total = mlp_params(m, m.ffn_hidden_size)
    expert = shared_total = 0
    if m.num_experts:
        expert = mlp_params(m, resolved.moe_ffn_hidden_size or m.ffn_hidden_size)
        if m.moe_shared_expert_intermediate_size:
            shared_total = mlp_params(m, m.moe_shared_expert_intermediate_size)
    objective = objectives.get(resolved.spec.objective.kind)
    return ModelShape(
        num_layers=m.num_layers,
        hidden=h,
        ffn=m.ffn_hidden_size,
        heads=a,
        groups=g,
        head_dim=d,
        vocab=resolved.padded_vocab_size,
        tokenizer_vocab=m.vocab_size,
        vocab_divisible_by=m.make_vocab_size_divisible_by,
        gated=m.activation in ("swiglu", "geglu"),
        layernorm=m.normalization == "LayerNorm",
        qk_norm=m.qk_layernorm,
        rope=m.position_embedding_type == "rope",
        rotary_dim=int(d * m.rotary_percent),
        learned_positions=m.max_position_embeddings if m.position_embedding_type == "learned_absolute" else 0,
        tied=not m.untie_embeddings_and_output_weights,
        num_experts=m.num_experts or 0,
        topk=m.moe_router_topk if m.num_experts else 0,
        expert_ffn=resolved.moe_ffn_hidden_size or 0,
        shared_ffn=m.moe_shared_expert_intermediate_size or 0 if m.num_experts else 0,
        moe_layers=tuple(resolved.moe_layers) if m.num_experts else (0,) * m.num_layers,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        attention=resolved.attention_mask,
        block_size=resolved.spec.objective.block_size or 0,
        objective=resolved.spec.objective.kind,
        # a micro-batch cut (objective.variable_length = "micro_batch") is dense: no mask to plan
        variable_length_prob=objective.masked_variable_length_prob(resolved.spec.objective),
        loss_row_fraction=objective.loss_row_fraction_of(resolved.spec.objective),
        objective_bytes_per_token=objective.input_bytes_per_token,
        extra_forward_passes=objective.extra_forward_passes(resolved.spec.objective),
        extra_seq_length=objective.extra_seq_length(resolved.spec.objective, resolved.spec.train.seq_length),
        extra_positions_output=bool(objective.extra_positions_output(resolved.spec.objective)),
        attention_anneal_iters=int(getattr(resolved.spec.objective, "attention_anneal_iters", None) or 0),
        anneal_backend=(choose_backend(m.attention_backend, (resolved.attention_mask,))
                        if getattr(resolved.spec.objective, "attention_anneal_iters", None) else ""),
        attended_keys=float(objective.attended_keys(resolved.spec.objective, resolved.spec.train.seq_length,
                                                    resolved.train_iters) or 0.0),
        attn_split=attn_split,
        attn_repl=attn_repl,
        norms_repl=2 * norm * h,
        mlp_split=mlp_total - bias_h,
        mlp_repl=bias_h,
        expert_params=expert,
        shared_split=max(0, shared_total - (bias_h if shared_total else 0)),
        shared_repl=bias_h if shared_total else 0,
        router=(m.num_experts or 0) * h,
        final_norm=norm * h,
        total_params=resolved.params.total,
        active_params=resolved.params.active,
        padded_total_params=resolved.params_padded.total,
        segment_mask=(resolved.spec.stage.kind == "sft"
                      and needs_segment_mask(resolved.spec.stage.sft, resolved.spec.objective.kind)),
        stage_kind=resolved.spec.stage.kind,
        stage_options=stage_options(resolved.spec.stage, resolved.spec),
    )


def input_length(shape: ModelShape, lay: Layout) -> int:
    """The model's input length in positions: ``train.seq_length`` (:attr:`Layout.seq`) plus the
    objective's :meth:`~dlmspec.objectives.Objective.extra_seq_length` (:attr:`ModelShape.extra_seq_length`;
    block diffusion's ``x_t (+) x_0`` doubles it). Activations, attention and FLOPs scale with it;
    the tokens a step trains on (throughput, the SFT plan) stay ``global_batch * seq``."""
    return lay.seq + shape.extra_seq_length


def output_length(shape: ModelShape, lay: Layout) -> int:
    """Positions per sequence that reach the output layer (the logits GEMM, the cross entropy, the
    fused projection's hidden-state hand-over): :func:`input_length`, less the objective's extra
    positions where the objective drops them after the decoder
    (:attr:`ModelShape.extra_positions_output` false: block diffusion without an AR loss, whose
    decoder passes only the ``x_t`` half, ``backends/megatron/objectives/bd3lm.py``
    ``noised_half_output``). Under sequence parallelism (``sp`` with ``tp > 1``) every position
    stays: each rank's decoder output is a slice of the sequence, which the runtime does not cut.

    Example: ``seq = 4096``, BD3-LM without AR loss: input 8192, output 4096 (8192 with SP)."""
    if shape.extra_positions_output or lay.sequence_divisor > 1:
        return input_length(shape, lay)
    return lay.seq


def output_rows(shape: ModelShape, lay: Layout) -> float:
    """Rows of one micro-batch that reach the output layer on one rank:
    ``micro_batch * output_length / cp`` (:func:`output_length`; the ``[rows, vocab / tp]`` logits
    of megatron's cross entropy, ``rows`` hidden states of the fused one)."""
    return lay.micro_batch * output_length(shape, lay) / lay.cp


def _frozen(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if hasattr(value, "model_fields_set"):  # a table (pydantic's, or the fast path's SpecTable): (key, value) pairs
        return tuple(sorted((k, _frozen(v)) for k, v in value))
    return value


def stage_options(stage: Any, spec: Any = None) -> tuple[tuple[str, Any], ...]:
    """``[stage.<kind>]`` of ``stage`` (the ``[stage]`` table) as sorted, hashable ``(key, value)``
    pairs; ``()`` when the kind has no table of that name or it is unset. An RL stage's also holds
    ``("generate", ...)``: the rollout sampler's ``[generate]`` table of ``spec`` (``()`` unset)."""
    table = {k: v for k, v in stage}.get(stage.kind)  # its fields only (an unknown attribute, or keys(), of the fast path's
    # SpecTable would build its pydantic twin)
    options = () if table is None else _frozen(table)
    if stage.kind == "rl" and spec is not None:
        generate = spec.generate
        options = tuple(sorted(options + (("generate", () if generate is None else _frozen(generate)),)))
    return options


def layout(resolved: Resolved, impl: str | None = None) -> Layout:
    """Extract the :class:`Layout` of ``resolved``; ``impl`` overrides the modelled layer
    implementation (default: :func:`transformer_impl`)."""
    spec = resolved.spec
    par, rc, tr = spec.parallel, spec.recompute, spec.train
    rt = runtime_values(resolved)  # the defaults resolve fills
    return Layout(
        tp=resolved.tp,
        pp=resolved.pp,
        vpp=resolved.vpp if (resolved.vpp and resolved.pp > 1) else 1,
        cp=resolved.cp,
        ep=resolved.ep,
        etp=resolved.etp,
        dp=resolved.dp,
        expert_dp=resolved.expert_dp,
        sp=par.sequence_parallel,
        micro_batch=tr.micro_batch_size,
        global_batch=tr.global_batch_size,
        seq=tr.seq_length,
        num_microbatches=resolved.num_microbatches,
        recompute=rc.granularity,
        recompute_method=rt.plan_recompute_method,
        recompute_layers=rt.plan_recompute_layers,
        recompute_modules=rt.recompute_modules,
        distributed_optimizer=par.use_distributed_optimizer,
        fsdp=par.fsdp,
        sharding=par.data_parallel_sharding_strategy,
        overlap_grad_reduce=par.overlap_grad_reduce,
        overlap_param_gather=par.overlap_param_gather,
        grad_fp32=par.grad_reduce_in_fp32,
        dtype=spec.precision.dtype,
        fp8=spec.precision.fp8 != "none",
        impl=impl or transformer_impl(resolved)[0],
        optimizer=tr.optimizer,
        world=resolved.world_size,
        gpus_per_node=spec.cluster.gpus_per_node,
        inter_node_gbps=spec.cluster.inter_node_gbps,
        train_iters=resolved.train_iters,
        cross_entropy=spec.kernels.cross_entropy,
        fused_linear_impl=spec.kernels.fused_linear_impl,
        cp_comm_type=par.cp_comm_type,
        rope_fusion=spec.kernels.apply_rope_fusion,
        fp8_attention=spec.precision.fp8 != "none" and spec.precision.fp8_dot_product_attention,
        fp8_recipe=spec.precision.fp8_recipe if spec.precision.fp8 != "none" else "",
        sdpa_backend=spec.kernels.sdpa_backend,
        qkv_fusion=getattr(spec.kernels, "qkv_fusion", False),
        compiled_norm=getattr(spec.kernels, "compiled_norm", False),
        host_launch_seconds=_host_launch_seconds(spec.cluster),
        pipeline_split=split_options(spec.parallel),
        **_optimizer_state(tr),
        moe_grouped_gemm=bool(spec.model.num_experts) and spec.model.moe_grouped_gemm,
    )


def split_options(parallel: Any) -> tuple[int | None, int | None, bool, bool, str | None] | None:
    """:attr:`Layout.pipeline_split` of a ``[parallel]`` table: its uneven-split options, None when
    it sets none (the even split)."""
    split = split_of(1, parallel)
    if not split.uneven:
        return None
    return split.first, split.last, split.embedding, split.loss, split.layout


def pipeline_split(shape: ModelShape, lay: Layout, pp: int | None = None, vpp: int | None = None) -> Split:
    """The :class:`~dlmspec.pipeline_split.Split` of ``lay`` (``pp`` / ``vpp`` override its sizes:
    the search tries others): what :func:`dlmspec.pipeline_split.chunk_layers` places."""
    pp = lay.pp if pp is None else pp
    v = lay.vpp if vpp is None else vpp
    options = lay.pipeline_split or (None, None, False, False, None)
    return Split(shape.num_layers, pp, v if (v > 1 and pp > 1) else None, *options)


def pipeline_fits(shape: ModelShape, lay: Layout, pp: int, vpp: int) -> bool:
    """Whether megatron-core builds ``lay``'s split at ``pp`` x ``vpp`` (1: no interleaving)
    (:func:`dlmspec.pipeline_split.split_problems`)."""
    return not split_problems(pipeline_split(shape, lay, pp, vpp))


def _optimizer_state(train) -> dict[str, Any]:
    """The :class:`Layout` fields of ``[train]``'s optimizer-state options."""
    o = optimizer_options(train)
    return dict(precision_aware=o.use_precision_aware_optimizer, main_params_dtype=o.main_params_dtype,
                exp_avg_dtype=o.exp_avg_dtype, exp_avg_sq_dtype=o.exp_avg_sq_dtype,
                store_param_remainders=o.store_param_remainders, cpu_offload=o.optimizer_cpu_offload,
                offload_fraction=o.optimizer_offload_fraction, overlap_offload=o.overlap_cpu_optimizer_d2h_h2d)


def _host_launch_seconds(cluster) -> float | None:
    """``cluster.host_launch_us`` in seconds (None when unset or absent)."""
    value = getattr(cluster, "host_launch_us", None)
    return value * 1e-6 if value else None


def cross_entropy_path(lay: Layout) -> str:
    """One line naming the loss path a run with layout ``lay`` takes (the plan's report)."""
    if lay.fused_linear_ce:
        impl = {"liger": "Liger Kernel (required)", "torch": "PyTorch row chunks"}.get(
            lay.fused_linear_impl, "Liger Kernel when it imports on the GPU machine (planned), else PyTorch row chunks")
        return f"fused_linear: output projection + cross entropy on the loss-carrying rows only, {impl}"
    return "megatron: [s, b, vocab/TP] logits and megatron-core's vocab-parallel cross entropy"


def attention_backend(lay: Layout, compute_capability: tuple[int, int]) -> str:
    """The attention kernel the time model assumes: ``"transformer_engine"`` on the TE path,
    else the SDPA backend - ``"cudnn"``, ``"flash"`` or ``"efficient"``. ``auto`` is cuDNN on
    compute capability 9.0 and above (``dlmspec.backends.megatron.attention.auto_sdpa_backend`` for
    unmasked bidirectional attention; masked and causal calls keep PyTorch's order, which on
    torch 2.11 with cuDNN >= 9.15 on sm90/sm100 also puts cuDNN first:
    ``check_prefer_cudnn_attention``), else flash."""
    if lay.impl == "transformer_engine":
        return "transformer_engine"
    if lay.sdpa_backend == "auto":
        return "cudnn" if compute_capability >= (9, 0) else "flash"
    return lay.sdpa_backend


def attention_path(lay: Layout, compute_capability: tuple[int, int], shape: ModelShape | None = None) -> str:
    """One line naming the attention kernel and the RoPE path a plan assumes (the report);
    with ``shape``, RoPE inside the fused QKV kernel is named (:func:`qkv_fused`)."""
    backend = attention_backend(lay, compute_capability)
    names = {"cudnn": "SDPA cuDNN", "flash": "SDPA flash", "efficient": "SDPA memory-efficient",
             "transformer_engine": "Transformer Engine DotProductAttention"}
    line = names.get(backend, backend)
    if lay.impl != "transformer_engine":
        line += f" (sdpa_backend = {lay.sdpa_backend!r})"
    if shape is not None and qkv_fused(shape, lay) and shape.rope:
        rope = "inside the fused QKV kernel (kernels.qkv_fusion)"
    elif lay.rope_fusion:
        rope = "TE's fused kernel" if lay.impl == "transformer_engine" else "torch.compile'd (2+2 kernels per layer)"
    else:
        rope = "megatron-core unfused (34 kernels per layer)"
    return f"{line}; RoPE: {rope}"


def qkv_fused(shape: ModelShape, lay: Layout) -> bool:
    """Whether the layers take ``dlmspec.backends.megatron.qkv.FusedQKVSelfAttention``'s fused path:
    ``kernels.qkv_fusion`` on the local path, and none of the cases its ``fast_path_reason``
    hands back to megatron-core that a plan can see (partial rotary dimension, LayerNorm q/k
    norms, fewer query groups than TP ranks)."""
    if lay.impl == "transformer_engine" or not lay.qkv_fusion:
        return False
    if shape.rope and shape.rotary_dim != shape.head_dim:
        return False
    if shape.qk_norm and shape.layernorm:
        return False  # LayerNorm q/k norms: "q/k norm is not RMSNorm"
    return shape.groups >= lay.tp


def norms_compiled(lay: Layout) -> bool:
    """Whether the local path's norms are ``torch.compile``'d (``kernels.compiled_norm``)."""
    return lay.impl != "transformer_engine" and lay.compiled_norm


def kernels_path(shape: ModelShape, lay: Layout) -> str:
    """One line naming the local-path fusions a plan assumes: QKV fusion and compiled norms
    on or off (the report's ``kernels`` line)."""
    if lay.impl == "transformer_engine":
        return "Transformer Engine's modules (kernels.qkv_fusion and kernels.compiled_norm apply to the local path only)"
    if qkv_fused(shape, lay):
        qkv = "qkv_fusion on: QKV split + q/k norm + RoPE in one torch.compile'd function (1 + 12 kernels per layer)"
    elif lay.qkv_fusion:
        qkv = "qkv_fusion requested but not taken (partial rotary or fewer query groups than TP): megatron-core's split"
    else:
        qkv = "qkv_fusion off: megatron-core's split, q/k norm and RoPE"
    norm = ("compiled_norm on: torch.compile'd norms (1 + 4 kernels each)" if norms_compiled(lay)
            else "compiled_norm off: PyTorch's norm kernels (1 + 2 each)")
    return f"{qkv}; {norm}"


def gpu_of(resolved: Resolved) -> GPU | None:
    """The catalog entry of ``cluster.gpu`` (None when unknown)."""
    return resolved.gpu


def fast_replace(obj: Layout, **changes: object) -> Layout:
    """``dataclasses.replace`` without ``__init__`` (a copy of the instance dict with
    ``changes``): the search builds thousands of layouts, and ``replace`` of a 31-field frozen
    dataclass costs tens of microseconds. Internal: values are not re-derived (see
    :func:`relayout`)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


def relayout(shape: ModelShape, lay: Layout, **changes: object) -> tuple[ModelShape, Layout]:
    """``(shape, lay)`` with ``changes`` applied to the layout and every derived value redone:
    ``dp = world / (tp*pp*cp)``, ``expert_dp = world / (etp*ep*pp)``, microbatches
    ``gbs / (mbs*dp)`` (megatron-core ``parallel_state`` and the microbatch calculator), the
    vocabulary re-padded for the new TP (:func:`dlmspec.resolve.padded_vocab_size`); expert TP
    follows TP when it did before and is not changed itself. Divisibility is not checked here
    (:mod:`dlmspec.plan.search` filters layouts first).
    """
    if "tp" in changes and "etp" not in changes and lay.etp == lay.tp:
        changes["etp"] = changes["tp"]
    new = replace(lay, **changes)  # type: ignore[arg-type]
    sizes = derive_layout(new.world, tp=new.tp, pp=new.pp, cp=new.cp, ep=new.ep, etp=new.etp,
                          global_batch_size=new.global_batch, micro_batch_size=new.micro_batch)
    new = replace(new, dp=sizes.dp, expert_dp=sizes.expert_dp, num_microbatches=sizes.num_microbatches)
    if new.tp != lay.tp:
        shape = replace(shape, vocab=padded_vocab_size(shape.tokenizer_vocab, shape.vocab_divisible_by, new.tp))
    return shape, new
