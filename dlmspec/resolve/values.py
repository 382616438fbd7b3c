"""The values train.py and the launch scripts pass beyond the spec's own: :class:`RuntimeValues`,
``Resolved.runtime`` (filled by :func:`dlmspec.resolve.runtime.runtime_values`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RuntimeValues:
    """The values train.py passes to megatron-core and the runtime that the spec does not state
    one to one: the templates print these and decide nothing.

    Attributes:
        lr_warmup_iters, lr_decay_iters: :func:`schedule`'s lengths in optimizer steps.
        lr_wsd_decay_iters: WSD's decay phase; None unless ``lr_decay_style = "WSD"``.
        lr_points: ``train.lr_points`` as ``[[step, lr], ...]`` lists for ``lr_decay_style =
            "piecewise"`` (``ScheduleConfig.lr_points``), else None.
        recompute_granularity, recompute_method, recompute_num_layers: ``TransformerConfig``'s
            (None where ``[recompute]`` leaves them unused).
        cp_comm_type: megatron-core's spelling (``"all_gather"`` for the spec's ``"allgather"``).
        block_size: the objective's block size under block-causal attention, else None.
        fsdp: Megatron-FSDP (``parallel.fsdp = "megatron"``); fsdp_reduce_scatter /
            fsdp_all_gather: its strategy shards gradients / parameters.
        grad_reduce_group: GPUs a gradient is reduced over, data x context parallel =
            world / (TP x PP) (megatron-core's DDP reduces over the data-parallel group with CP).
        overlap_grad_reduce, overlap_param_gather: ``DistributedDataParallelConfig``'s: the
            spec's switch where gradients cross GPUs (False when ``grad_reduce_group`` is 1:
            nothing to overlap), always on where Megatron-FSDP shards them.
        cuda_device_max_connections_1: ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (TP > 1 or sequence
            parallel, so TP communication is issued in order with compute; never with
            Megatron-FSDP, which Megatron-LM refuses to run with it).
        use_transformer_engine: None / True / False for the resolved ``transformer_impl``
            auto / transformer_engine / local (:func:`layer_path`).
        bias_activation_fusion: megatron-core fuses bias + activation for SwiGLU, GeGLU and gelu
            with a bias only (``MLP.forward``).
        peak_tflops, peak_source: the dense bf16 peak of ``cluster.gpu`` in TFLOP/s (fp32 for
            fp32 runs) for the runtime's MFU, and where it comes from; None outside the catalog.
        init_cache_dir: :func:`init_cache_dir`.
        resume_from_run: ``checkpoint.resume_from_run`` when a resume can happen
            (``checkpoint.resume``), else None: the other spec name whose checkpoints the runtime
            may resume (``CheckpointConfig.resume_from_run``).
        min_masked_tokens, variable_length, loss_normalization: ``objective.min_masked_tokens``
            (unset: 0), ``objective.variable_length`` (unset: ``"sequence"``) and
            ``train.loss_normalization`` (unset: :func:`default_loss_normalization`) with their defaults filled.
        calculate_per_token_loss: megatron-core's ``TransformerConfig.calculate_per_token_loss``:
            True exactly for ``"global_token"`` (docs/recipes.md, "Loss normalisation").
        shift, cart_p: ``objective.shift`` (unset: False) and, with ``loss_weighting = "cart"`` only,
            ``objective.cart_p`` (unset: :data:`CART_P_DEFAULT`, Dream's trainers' 0.1); None otherwise.
        unshift: ``objective.unshift`` of an mdm pre-training stage (an SFT stage never unshifts).
        save_at_end: ``checkpoint.save_at_end`` where ``checkpoint.save`` is set (nothing is saved
            without a directory), else False.
        tensorboard: whether ``logging.tensorboard_dir`` is set.
        wandb_exp_name, wandb_mode, wandb_tags: ``logging.wandb_*`` with their defaults filled
            (the spec's name, ``"online"``, no tags).
        recompute_modules: ``recompute.modules`` with megatron-core's default filled
            (``("core_attn",)``, ``TransformerConfig.recompute_modules``).
        blend, valid_blend: ``DataConfig.blend`` / ``valid_blend``: the resolved blends'
            ``(prefix, weight)`` pairs (globs and manifests expanded); None with mock data, and
            ``valid_blend`` None when ``data.valid`` is empty (the ``split`` then carves it).
        max_unique_tokens: ``DataConfig.max_unique_tokens``: ``{prefix: cap}`` of the
            ``data.train`` entries that set ``max_unique_tokens``
            (:func:`dlmspec.data.repetition.train_caps`); None when none does (or mock data).
        generation_every: ``GenerationEvalConfig.every``: steps between generation evaluations,
            ``eval.generation.every`` or, unset, ``train.eval_interval``; None without
            ``[eval.generation]``.
        plan_recompute_method, plan_recompute_layers: ``recompute.method`` / ``num_layers`` as the
            planner models them (unset: ``"uniform"`` and 1, megatron-core's full-recompute defaults).
        variable_length_multiple: what a micro-batch cut's length is a multiple of: 2 x CP
            (megatron-core's load-balanced CP split, ``get_batch_on_this_cp_rank``) and TP under
            sequence parallelism (the sequence is split over TP ranks), their least common
            multiple; 1 without either.
    """

    lr_warmup_iters: int
    lr_decay_iters: int
    lr_wsd_decay_iters: int | None
    recompute_granularity: str | None
    recompute_method: str | None
    recompute_num_layers: int | None
    cp_comm_type: str
    block_size: int | None
    fsdp: bool
    fsdp_reduce_scatter: bool
    fsdp_all_gather: bool
    grad_reduce_group: int
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    cuda_device_max_connections_1: bool
    use_transformer_engine: bool | None
    bias_activation_fusion: bool
    peak_tflops: float | None
    peak_source: str
    init_cache_dir: str | None
    resume_from_run: str | None = None
    min_masked_tokens: int = 0
    variable_length: str = "sequence"
    loss_normalization: str = "global_token"
    calculate_per_token_loss: bool = True
    variable_length_multiple: int = 1
    lr_points: list[list[int | float]] | None = None
    shift: bool = False
    cart_p: float | None = None
    unshift: bool = False
    save_at_end: bool = False
    tensorboard: bool = False
    wandb_exp_name: str = ""
    wandb_mode: str = "online"
    wandb_tags: list[str] = field(default_factory=list)
    recompute_modules: tuple[str, ...] = ("core_attn",)
    plan_recompute_method: str = "uniform"
    plan_recompute_layers: int = 1
    blend: list[tuple[str, float]] | None = None
    valid_blend: list[tuple[str, float]] | None = None
    max_unique_tokens: dict[str, int] | None = None
    generation_every: int | None = None
