"""The spec: what a user writes, as pydantic models, one class per TOML table.

Key names are Megatron's (megatron-core's ``TransformerConfig``/``OptimizerConfig``/
``DistributedDataParallelConfig`` fields, or Megatron-LM's argument names where megatron-core
has no field), so a spec key maps to one megatron-core field wherever one exists; the mapping
is in :mod:`dlmspec.render.compile`'s templates and tested against the installed megatron-core.

Only per-field checks live here (types, ranges, enumerations, unknown keys). Rules that relate
several fields (heads divisible by TP, batch divisible by DP, ...) live in
:mod:`dlmspec.validate`; values derived from several fields live in :mod:`dlmspec.resolve`.

Some tables are defined beside this module, by concern, and imported here (import every model
from this module): :mod:`dlmspec.spec.section` (the base :class:`Section` and the strict number
types), :mod:`dlmspec.spec.stage_models` (``[stage]``, ``[stage.sft]``, ``[stage.rl]``) and
:mod:`dlmspec.spec.generate_models` (``[generate]``, ``[eval]``).
"""

from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from dlmspec import objectives
from dlmspec.spec import objective_union, python
from dlmspec.spec.objective_union import OBJECTIVE_TAGS, plain_objective_loc  # noqa: F401 - schema_errors reads them here
from dlmspec.spec.dotted import deep_merge, set_dotted
from dlmspec.spec.names import DEFAULT_NAME, PlaceholderError, expand_names, placeholder_problems, problem_message
from dlmspec.spec.presets import PRESETS
from dlmspec.spec.shorthands import prefix_strings
from dlmspec.spec.section import (  # noqa: F401 - the base of every table, importable from here as before
    MAX_LAYERS, Bool, Float, Int, NonNegInt, PosFloat, PosInt, Section, _empty_list, _table,
)
from dlmspec.spec.stage_models import RewardSpec, RLSpec, SFTSpec, StageSpec  # noqa: F401 - [stage] and its tables
from dlmspec.spec.generate_models import EvalSpec, GenerateSpec, GenerationEvalSpec  # noqa: F401 - [generate], [eval]


class ModelSpec(Section):
    """``[model]``: the transformer. Either ``preset`` or the explicit dimensions (or both:
    explicit keys override the preset). Names follow megatron-core's ``TransformerConfig``
    and ``GPTModel`` arguments; ``num_experts`` is Megatron-LM's ``--num-experts``
    (``TransformerConfig.num_moe_experts``) and ``activation`` chooses ``activation_func`` plus
    ``gated_linear_unit``."""

    preset: str | None = Field(None, description="Published architecture id, e.g. 'qwen3-1.7b'.")
    num_layers: Int = Field(gt=0, le=MAX_LAYERS)
    hidden_size: PosInt
    ffn_hidden_size: PosInt
    num_attention_heads: PosInt
    num_query_groups: PosInt | None = Field(
        None, description="Key/value heads (GQA). Default: num_attention_heads (MHA)."
    )
    kv_channels: PosInt | None = Field(
        None, description="Head dimension. Default: hidden_size / num_attention_heads."
    )
    vocab_size: PosInt = Field(description="Tokenizer vocabulary size (before padding).")
    make_vocab_size_divisible_by: PosInt = 128
    max_position_embeddings: PosInt
    position_embedding_type: Literal["rope", "learned_absolute", "none"] = "rope"
    rotary_base: PosFloat = 10000.0
    rotary_percent: Float = Field(1.0, gt=0.0, le=1.0)
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    layernorm_epsilon: PosFloat = 1e-5
    activation: Literal["swiglu", "geglu", "gelu", "relu", "squared_relu", "silu"] = "swiglu"
    qk_layernorm: Bool = False
    add_bias_linear: Bool = False
    add_qkv_bias: Bool = False
    untie_embeddings_and_output_weights: Bool = True
    hidden_dropout: Float = Field(0.0, ge=0.0, lt=1.0)
    attention_dropout: Float = Field(0.0, ge=0.0, lt=1.0)
    init_method_std: PosFloat = 0.02
    # Mixture of experts (megatron.core.transformer.moe).
    num_experts: PosInt | None = Field(None, description="Routed experts; unset = dense MLP.")
    moe_router_topk: PosInt = 2
    moe_ffn_hidden_size: PosInt | None = Field(None, description="Default: ffn_hidden_size.")
    moe_shared_expert_intermediate_size: PosInt | None = None
    moe_layer_freq: PosInt | list[Int] = Field(
        1, description="1 = every layer MoE; N = every Nth; or a 0/1 list, one entry per layer."
    )
    moe_router_load_balancing_type: Literal["aux_loss", "seq_aux_loss", "sinkhorn", "none"] = "aux_loss"
    moe_aux_loss_coeff: Float = Field(1e-2, ge=0.0)
    moe_token_dispatcher_type: Literal["allgather", "alltoall"] = "alltoall"
    moe_grouped_gemm: Bool = False
    transformer_impl: Literal["auto", "transformer_engine", "local"] = Field(
        "auto",
        description="Layer implementation: Transformer Engine if importable where the job runs (auto), "
        "or megatron-core's local modules with SDPA attention.",
    )
    attention_backend: Literal["sdpa", "flex", "auto"] | None = Field(
        None,
        description="Core attention of the local layers: 'sdpa' (PyTorch SDPA; unset means this), 'flex' "
        "(FlexAttention with a block mask: no s x s mask tensor), or 'auto' (SDPA unless a mask only Flex runs "
        "without a dense tensor). Transformer Engine layers run TE's own (docs/attention.md).",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        """Fill keys from ``preset`` under the explicit ones.

        Raises:
            PydanticCustomError: ``unknown_preset`` (context ``preset``: the id as written) for
                an id not in :data:`~dlmspec.spec.presets.PRESETS`. It is the only error reported for
                ``[model]``: the dimensions the preset would have filled are not listed as
                missing. :mod:`dlmspec.spec.load` turns it into an issue at ``model.preset`` with
                the closest ids.
        """
        if isinstance(data, dict) and isinstance(data.get("preset"), str):
            preset = PRESETS.get(data["preset"])
            if preset is None:
                raise PydanticCustomError(
                    "unknown_preset", "unknown preset '{preset}'", {"preset": data["preset"]}
                )
            return {**preset, **data}
        return data

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None


# The spec model of the built-in objectives, and the base of an objective's own
# (dlmspec.objectives.Objective.spec_model): a plugin subclasses it to add its keys, and [objective]
# validates against the model registered for its kind (objective_model below). Its docstring is the
# JSON Schema's description (`dlmspec schema`), so this note stays a comment.
class ObjectiveSpec(Section):
    """``[objective]``: what the model learns. ``mdm`` is masked (absorbing-state) diffusion
    as in LLaDA (Nie et al. 2025, eq. 3) and MDLM (Sahoo et al. 2024); ``ar`` is next-token
    prediction."""

    kind: Literal[objectives.kinds()] = "mdm"  # the registered objectives (dlmspec.objectives): mdm, ar
    mask_token_id: Int | None = Field(
        None, ge=0, description="Id of [MASK]. Default: the preset's, else the first padded slot."
    )
    attention_mask: Literal["bidirectional", "causal", "block_causal"] | None = Field(
        None, description="Default: bidirectional for mdm, causal for ar."
    )
    block_size: PosInt | None = Field(
        None, description="Block length for block_causal attention, and bd3lm's block (a divisor of seq_length)."
    )
    noise_clip_min: Float | None = Field(
        None, ge=0.0, le=1.0,
        description="bd3lm clipped schedule: each block's noise level t ~ U(noise_clip_min, noise_clip_max) "
        "(Arriola et al. 2025 sec. 5.2, e.g. 0.3 with max 0.8 at block 4). Unset: eps.",
    )
    noise_clip_max: Float | None = Field(
        None, gt=0.0, le=1.0, description="bd3lm clipped schedule's upper end (see noise_clip_min). Unset: 1."
    )
    block_size_schedule: list[tuple[NonNegInt, PosInt]] | None = Field(
        None,
        description="bd3lm: the block size over training as [[step, block_size], ...] from step 0, steps increasing: "
        "step k trains with the block of the last entry at or before k, each a divisor of seq_length. LLaDA 2.0's "
        "warm-up / stable / decay (inclusionAI/LLaDA2.0 tech_report.pdf, block-level WSD): blocks growing from small to seq_length (full-sequence "
        "diffusion), then back to a small block. Unset: block_size throughout.",
    )
    ar_loss_weight: Float | None = Field(
        None, ge=0.0, le=100.0,
        description="bd3lm: weight of a next-token loss on the clean half x_0, which is then causal within "
        "itself (Megatron-Bridge dgpt_step.py ar_loss_weight, dllm.py compute_block_mask). Unset: 0.",
    )
    attention_anneal_iters: PosInt | None = Field(
        None,
        description="mdm adapting an AR model (checkpoint.init_from): over the first attention_anneal_iters steps the "
        "causal mask is relaxed to full attention, step k (from 0) attending each key above the diagonal with "
        "probability min(1, (k + 1) / attention_anneal_iters), one draw per micro-batch (DiffuLLaMA, Gong et al. "
        "2024 arXiv:2410.17891 sec. 3.2; HKUNLP/DiffuLLaMA trainer.py anneal_steps, get_anneal_attn_mask). Local "
        "layers only. Unset: full attention from the first step.",
    )
    noise_schedule: Literal["linear", "cosine", "polynomial"] = Field(
        "linear", description="mdm masking schedule alpha(t), a token masked with probability 1 - alpha(t) at "
        "t ~ U(eps, 1), its loss weighted by -alpha'(t)/(1-alpha(t)) (MDLM eq. 10) with loss_weighting = 'llada'; "
        "the sampler and eval's ELBO follow it. linear: alpha = 1 - t, weight 1/t (LLaDA); cosine: "
        "alpha = 1 - cos(pi/2 (1-t)) (dllm CosineAlphaScheduler, MD4); polynomial: alpha = 1 - t^a, weight a/t "
        "(MD4), a = noise_schedule_exponent.",
    )
    noise_schedule_exponent: Float | None = Field(
        None, gt=0.0, le=100.0,
        description="noise_schedule = 'polynomial': the exponent a of alpha(t) = 1 - t^a. Unset: 1 (linear).",
    )
    eps: Float = Field(
        1e-3, ge=0.0, lt=1.0,
        description="t ~ U(eps, 1) (LLaDA's code: 1e-3). 0 is MegaDLMs' torch.rand(b) "
        "(JinjieNi/MegaDLMs gpt_model.py:309); with loss_weighting = 'llada' (1/t) it is refused (mdm-eps-zero).",
    )
    loss_weighting: Literal["llada", "realised", "cart"] = Field(
        "llada", description="llada: sum CE/t over masked / (b*s); realised: by the realised mask ratio; cart: Dream's "
        "context-adaptive token-level weight w_n = 1/2 sum_{i != n} 1[x_t^i clean] p (1-p)^(|n-i|-1), no 1/t "
        "(DreamLM/Dream-Coder instruct/src/trainer/fsdp_sft_trainer.py:93-112, 802-818).",
    )
    variable_length_prob: Float = Field(
        0.0, ge=0.0, le=1.0, description="Share of sequences cut to a random length (LLaDA: 0.01)."
    )
    min_masked_tokens: NonNegInt | None = Field(
        None,
        description="A row that drew fewer masked positions gets the missing ones at uniformly drawn unmasked "
        "positions. MegaDLMs: 1 (JinjieNi/MegaDLMs gpt_model.py:315-318, one position for a row that drew none). "
        "Unset: 0 (no forced mask).",
    )
    variable_length: Literal["sequence", "micro_batch"] | None = Field(
        None,
        description="What variable_length_prob cuts. 'sequence': each sequence alone, the tail hidden by a "
        "key-padding mask (local layers only). 'micro_batch': one coin and one length U{1..seq_length} per "
        "micro-batch, drawn from (train.seed, iteration, micro-batch index) only, so every data-parallel rank cuts "
        "alike; the micro-batch is sliced, dense, and runs on either layer path (MegaDLMs gpt_model.py:269-297, "
        "413-425; LLaDA GUIDELINES.md one cut per batch). Evaluation never cuts. Unset: 'sequence'.",
    )
    shift: Bool | None = Field(
        None,
        description="Dream's shifted predictions: the logits at position i-1 predict the token at i (the AR "
        "model's head alignment kept; DreamLM/Dream eval/eval.py:352-354, DreamLM/Dream-Coder "
        "fsdp_sft_trainer.py:777-786); position 0 is never masked, the last position predicts nothing. "
        "Unset: false (each position predicts itself, LLaDA / MegaDLMs).",
    )
    cart_p: Float | None = Field(
        None, gt=0.0, lt=1.0,
        description="loss_weighting = 'cart': the geometric parameter p (near clean tokens count more as p grows). "
        "Unset: 0.1 (DreamLM/Dream-Coder instruct/src/trainer/config/sft_trainer.yaml:57).",
    )
    unshift: Bool | None = Field(
        None,
        description="MegaDLMs' 2,049-token window: the dataset draws seq_length + 1 ids (megatron-core's "
        "add_extra_token_to_sequence, as MegaDLMs' GPTDataset) and the model sees and predicts ids 1 .. seq_length-1 "
        "of each at positions 1 .. seq_length-1 (JinjieNi/MegaDLMs gpt_model.py:427-431: input_ids[:, 1:], "
        "position_ids[:, 1:], labels[:, :-1]); a micro-batch cut comes first. Pre-training only. Unset: false "
        "(seq_length ids, all trained on).",
    )


class ParallelSpec(Section):
    """``[parallel]``: model and data parallelism. Names are megatron-core's
    (``ModelParallelConfig`` and ``DistributedDataParallelConfig``). The data-parallel size is
    derived (world size / (TP * PP * CP)), never written."""

    tensor_model_parallel_size: PosInt = 1
    pipeline_model_parallel_size: PosInt = 1
    virtual_pipeline_model_parallel_size: PosInt | None = None
    account_for_embedding_in_pipeline_split: Bool | None = Field(
        None,
        description="Count the embedding as one layer of the pipeline split: num_layers + 1 (+ 1 with the loss) "
        "layers split evenly and the first rank's first virtual stage builds one transformer layer fewer "
        "(megatron-core TransformerConfig.account_for_embedding_in_pipeline_split). Unset: off, megatron-core's "
        "default.",
    )
    account_for_loss_in_pipeline_split: Bool | None = Field(
        None,
        description="Count the loss (output layer) as one layer of the pipeline split: the last rank's last "
        "virtual stage builds one transformer layer fewer (megatron-core "
        "TransformerConfig.account_for_loss_in_pipeline_split). Unset: off, megatron-core's default.",
    )
    num_layers_in_first_pipeline_stage: PosInt | None = Field(
        None,
        description="Transformer layers on the first pipeline rank; the other ranks split the rest evenly "
        "(megatron-core TransformerConfig.num_layers_in_first_pipeline_stage).",
    )
    num_layers_in_last_pipeline_stage: PosInt | None = Field(
        None,
        description="Transformer layers on the last pipeline rank (megatron-core "
        "TransformerConfig.num_layers_in_last_pipeline_stage).",
    )
    pipeline_model_parallel_layout: str | None = Field(
        None,
        description="Explicit layer placement, one '|'-separated stage per (virtual) stage in the order "
        "vpp_rank * PP + pp_rank: 'E' embedding, 'L' loss, 't' transformer layer, '(...)*n' and 'x*n' repeat, "
        "e.g. 'Et*3|(t*4|)*2t*3L' (megatron-core TransformerConfig.pipeline_model_parallel_layout).",
    )
    context_parallel_size: PosInt = 1
    cp_comm_type: Literal["p2p", "a2a", "allgather", "a2a+p2p"] = "p2p"
    expert_model_parallel_size: PosInt = 1
    expert_tensor_parallel_size: PosInt | None = Field(None, description="Default: TP size.")
    sequence_parallel: Bool = False
    use_distributed_optimizer: Bool = True
    data_parallel_sharding_strategy: Literal["no_shard", "optim", "optim_grads", "optim_grads_params"] = (
        "no_shard"
    )
    fsdp: Literal["none", "megatron", "torch"] = "none"
    overlap_grad_reduce: Bool = True
    overlap_param_gather: Bool = False
    grad_reduce_in_fp32: Bool = Field(
        True,
        description="Keep gradients (DDP main_grad buffer) in fp32 and reduce them in fp32, as "
        "Megatron-LM forces for bf16 (megatron-core DistributedDataParallelConfig.grad_reduce_in_fp32).",
    )


class RecomputeSpec(Section):
    """``[recompute]``: activation recomputation (Korthikanti et al. 2022), megatron-core's
    ``recompute_granularity``/``recompute_method``/``recompute_num_layers``/``recompute_modules``."""

    granularity: Literal["none", "selective", "full"] = "none"
    method: Literal["uniform", "block"] | None = None
    num_layers: PosInt | None = None
    modules: list[Literal["core_attn", "mlp", "moe", "moe_act", "layernorm", "shared_experts"]] | None = None


class PrecisionSpec(Section):
    """``[precision]``: compute dtype and fp8 (Transformer Engine only)."""

    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    fp8: Literal["none", "hybrid", "e4m3"] = "none"
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8", "blockwise"] = "delayed"
    fp8_dot_product_attention: Bool = Field(
        False,
        description="Attention's two batched GEMMs in fp8 as well (megatron-core "
        "TransformerConfig.fp8_dot_product_attention, Megatron-LM's --fp8-dot-product-attention: "
        "Transformer Engine's fp8 fused attention through cuDNN); with precision.fp8 and the delayed or "
        "tensorwise recipe only.",
    )


class KernelsSpec(Section):
    """``[kernels]``: implementation choices that change speed and memory, not the result."""

    cross_entropy: Literal["auto", "fused_linear", "megatron"] = Field(
        "auto",
        description="'fused_linear': output projection + cross entropy in row chunks on the positions "
        "that carry loss only (no [s, b, vocab] logits; tensor_model_parallel_size = 1); 'megatron': "
        "GPTModel's logits and megatron's vocab-parallel cross entropy; 'auto': fused_linear at TP = 1.",
    )
    fused_linear_impl: Literal["auto", "liger", "torch"] = Field(
        "auto", description="fused_linear backend: Liger Kernel (Triton) when it imports ('auto'), or PyTorch."
    )
    cross_entropy_loss_fusion: Bool = Field(
        False, description="megatron-core's fused vocab-parallel cross entropy (the 'megatron' path)."
    )
    apply_rope_fusion: Bool = Field(
        True,
        description="Fused RoPE: megatron-core's apply_rope_fusion (Transformer Engine's kernel) on the TE "
        "path; on the local path a torch.compile'd kernel (backends/megatron/rope.py) in place of "
        "megatron-core's eight unfused element-wise kernels. No effect without rotary embeddings.",
    )
    gradient_accumulation_fusion: Literal["auto"] | Bool = Field(
        "auto",
        description="megatron-core's gradient_accumulation_fusion: weight gradients accumulated into the fp32 "
        "main_grad inside the GEMM. 'auto': on with Transformer Engine layers when APEX's "
        "fused_weight_gradient_mlp_cuda imports (the output layer needs it), else off; true: on in the "
        "Transformer Engine linears, and in the output layer when APEX imports.",
    )
    qkv_fusion: Bool = Field(
        True,
        description="Local path: the split of the fused QKV projection, q/k RMSNorm and RoPE in one "
        "torch.compile'd kernel, with the backward writing the projection's gradient directly "
        "(backends/megatron/qkv.py). Ignored with Transformer Engine.",
    )
    compiled_norm: Bool = Field(
        True,
        description="Local path: torch.compile'd RMSNorm/LayerNorm (backends/megatron/norms.py) in place "
        "of PyTorch's norm kernels. Ignored with Transformer Engine.",
    )
    sdpa_backend: Literal["auto", "flash", "cudnn", "efficient"] = Field(
        "auto",
        description="SDPA kernel tried first on the local+SDPA path (PyTorch falls back when it cannot "
        "take the inputs); 'auto': cuDNN for unmasked bidirectional attention on compute capability 9.0+ "
        "(H100/H200/B200; 12% faster than flash on Qwen3-1.7B at 4k on an H200), else PyTorch's order.",
    )


class TrainSpec(Section):
    """``[train]``: batch, length, budget, optimizer and schedule. Optimizer keys are
    megatron-core ``OptimizerConfig`` fields; schedule keys are Megatron-LM's arguments
    (``OptimizerParamScheduler``)."""

    micro_batch_size: PosInt = 1
    global_batch_size: PosInt
    seq_length: PosInt
    train_iters: PosInt | None = None
    train_tokens: PosInt | None = Field(None, description="Budget in tokens; sets train_iters.")
    seed: Int = 1234
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: PosFloat = 3e-4
    min_lr: Float = Field(3e-5, ge=0.0)
    lr_decay_style: Literal["cosine", "linear", "constant", "WSD", "inverse-square-root", "piecewise"] = Field(
        "cosine",
        description="megatron-core's decay styles, and 'piecewise': the learning rate follows train.lr_points "
        "(LLaDA's schedule, arXiv:2502.09992 sec. 2.2; dlmspec's wrapper of OptimizerParamScheduler.get_lr).",
    )
    lr_points: list[tuple[Int, Float]] | None = Field(
        None,
        description="lr_decay_style = 'piecewise': [[step, lr], ...] with steps non-decreasing in [0, train_iters]; "
        "the lr is linear between points, a step given twice is a jump (the second lr holds from that step on), "
        "the first point's lr holds before it and the last point's after it. The warm-up "
        "(lr_warmup_iters / lr_warmup_fraction) stays megatron's, 0 -> train.lr over its steps, and the points apply "
        "after it; so the first point is [warmup steps, train.lr] for a schedule without a jump. min_lr and lr_decay_iters "
        "are not used. A param group with its own max_lr gets the points scaled by max_lr / lr. Source: LLaDA "
        "(arXiv:2502.09992 sec. 2.2, docs/recipes.md).",
    )
    lr_warmup_iters: Int = Field(0, ge=0)
    lr_warmup_fraction: Float | None = Field(None, ge=0.0, le=1.0)
    lr_decay_iters: PosInt | None = Field(None, description="Default: train_iters.")
    lr_wsd_decay_style: Literal["linear", "cosine", "exponential", "minus_sqrt"] = "exponential"
    lr_wsd_decay_iters: PosInt | None = None
    weight_decay: Float = Field(0.1, ge=0.0)
    adam_beta1: Float = Field(0.9, ge=0.0, lt=1.0)
    adam_beta2: Float = Field(0.95, ge=0.0, lt=1.0)
    adam_eps: PosFloat = 1e-8
    clip_grad: Float = Field(1.0, ge=0.0)
    # Optimizer-state memory (megatron-core OptimizerConfig's precision and offload fields; where
    # each byte goes: dlmspec.plan.optimizer_state; the rules: dlmspec.check.optimizer).
    use_precision_aware_optimizer: Bool | None = Field(
        None,
        description="megatron-core's precision-aware optimizer (OptimizerConfig.use_precision_aware_optimizer): the "
        "master weights, main gradients and Adam moments may be kept in the dtypes below; Adam with "
        "parallel.use_distributed_optimizer only, with Transformer Engine installed (on the local layers too: "
        "megatron-core 0.16.1 reads its version, and builds its FusedAdam unless optimizer_cpu_offload). Unset: false.",
    )
    main_params_dtype: Literal["fp32", "fp16"] | None = Field(
        None, description="Master weights' dtype (OptimizerConfig.main_params_dtype; Megatron-LM's "
        "--main-params-dtype). fp32 with bf16 weights keeps only the 16 low bits (store_param_remainders). Unset: fp32.",
    )
    main_grads_dtype: Literal["fp32", "bf16"] | None = Field(
        None, description="Main gradients' dtype (OptimizerConfig.main_grads_dtype): the DDP gradient buffer, "
        "so bf16 goes with parallel.grad_reduce_in_fp32 = false (Megatron-LM --main-grads-dtype). Unset: fp32.",
    )
    exp_avg_dtype: Literal["fp32", "fp16", "bf16", "fp8"] | None = Field(
        None, description="Adam's first moment's dtype (OptimizerConfig.exp_avg_dtype; fp8 is megatron-core's "
        "torch.uint8, Transformer Engine's scaled fp8). Unset: fp32.",
    )
    exp_avg_sq_dtype: Literal["fp32", "fp16", "bf16", "fp8"] | None = Field(
        None, description="Adam's second moment's dtype (OptimizerConfig.exp_avg_sq_dtype). Unset: fp32.",
    )
    store_param_remainders: Bool | None = Field(
        None, description="With the precision-aware optimizer, fp32 master weights and bf16 weights: keep only the "
        "16 bits the bf16 weight lacks (OptimizerConfig.store_param_remainders; Transformer Engine >= 2.1). "
        "Unset: true.",
    )
    optimizer_cpu_offload: Bool | None = Field(
        None, description="Keep optimizer_offload_fraction of the optimizer's master weights and moments in host "
        "memory and step them there (OptimizerConfig.optimizer_cpu_offload: megatron-core's HybridDeviceOptimizer, "
        "torch AdamW on the CPU, no FusedAdam). Needs use_precision_aware_optimizer. Unset: false.",
    )
    optimizer_offload_fraction: Float | None = Field(
        None, gt=0.0, le=1.0, description="Share of the optimizer state offloaded with optimizer_cpu_offload "
        "(OptimizerConfig.optimizer_offload_fraction). Unset: 1.0 (Megatron-LM's --optimizer-offload-fraction).",
    )
    overlap_cpu_optimizer_d2h_h2d: Bool | None = Field(
        None, description="Overlap the offloaded optimizer's gradient and weight copies with its CPU step, one "
        "CPU optimizer per parameter (OptimizerConfig.overlap_cpu_optimizer_d2h_h2d). Unset: false.",
    )
    eval_interval: PosInt = 1000
    eval_iters: PosInt = 10
    loss_normalization: Literal["global_token", "micro_batch", "sequence", "micro_batch_masked"] | None = Field(
        None,
        description="What the loss is a mean over. 'global_token': every loss-carrying token of the global batch "
        "weighs the same (megatron-core TransformerConfig.calculate_per_token_loss = True). 'micro_batch': each "
        "micro-batch's sum over its own tokens, averaged over micro-batches and data-parallel ranks "
        "(calculate_per_token_loss = False; MegaDLMs pretrain_difflm.py:265-268, megatron-core "
        "schedules.py forward_step_calc_loss; LLaDA GUIDELINES.md). 'sequence': each sequence's mean, then "
        "the mean over sequences (LLaDA's SFT, GUIDELINES.md). 'micro_batch_masked': each micro-batch's weighted sum "
        "over its own masked positions (mdm; ar: its loss tokens), averaged over micro-batches and data-parallel "
        "ranks (calculate_per_token_loss = False; the Dream team's SFT trainers: DreamLM/Dream-Coder "
        "instruct/src/trainer/fsdp_sft_trainer.py:830-831, 850-853). Unset: 'global_token'; for stage.kind = 'sft' "
        "with an mdm objective 'sequence' (LLaDA's SFT normalises each response by its length).",
    )


class BlendEntry(Section):
    """One entry of a blend: an indexed-dataset prefix (``PREFIX.bin``/``PREFIX.idx``), a glob of
    prefixes (``"data/web-*_text_document"``) or a manifest of a sharded output
    (``PREFIX_KEY_document.manifest.json``, a glob of manifests too). A glob's or manifest's
    ``weight`` is the group's share, split over its shards by their tokens; ``compile`` resolves
    them on its machine (:func:`dlmspec.resolve.resolve_blend`) and writes the shards into
    train.py and spec.lock.toml."""

    prefix: str = Field(description="PREFIX of PREFIX.bin/.idx, a glob of prefixes, or a *.manifest.json.")
    weight: PosFloat = Field(1.0, description="Sampling weight (a glob's or manifest's: its group's share).")
    max_unique_tokens: PosInt | None = Field(
        None,
        description="data.train only: train on at most this many unique tokens of this dataset: the longest "
        "prefix of whole documents (megatron-core's sequences, in file order) of its training split whose tokens "
        "do not exceed it; the same documents for every seed and rank count, repeated for as many epochs as the "
        "run draws (data-constrained studies, Muennighoff et al. 2023). One dataset prefix only (not a glob or "
        "manifest); pre-training stages only. Unset: the whole split.",
    )


class TokenizerSpec(Section):
    """``[data.tokenizer]``: Megatron's tokenizer types and files."""

    type: Literal[
        "HuggingFaceTokenizer", "GPT2BPETokenizer", "SentencePieceTokenizer", "TikTokenizer", "NullTokenizer",
        "BertWordPieceLowerCase", "BertWordPieceCase", "GPTSentencePieceTokenizer", "Llama2Tokenizer",
        "MultimodalTokenizer", "NullMultimodalTokenizer",
    ] = "HuggingFaceTokenizer"
    model: str | None = Field(
        None,
        description="--tokenizer-model: tokenizer.json / folder (HuggingFace, Multimodal), .model file "
        "(SentencePiece, GPTSentencePiece, Llama2), tiktoken .json.",
    )
    vocab_file: str | None = Field(None, description="--vocab-file: GPT-2 vocab.json, BERT vocab.txt.")
    merge_file: str | None = Field(None, description="--merge-file: GPT-2 merges.txt.")
    vocab_size: PosInt | None = Field(
        None, description="--vocab-size: NullTokenizer / NullMultimodalTokenizer ids before EOD; TikTokenizer total."
    )
    eod_id: Int | None = Field(
        None,
        ge=0,
        description="End-of-document id that `data prepare --append-eod` wrote (document masks, "
        "eod_mask_loss, mock data). Default: GPT2BPETokenizer 50256, NullTokenizer its vocab_size, "
        "a local Hugging Face folder's eos token (read by `dlmspec compile`).",
    )


class DataSpec(Section):
    """``[data]``: train/valid blends of Megatron indexed datasets (prefixes, globs of shards or
    manifests of a sharded ``data prepare`` output: :class:`BlendEntry`)."""

    train: list[BlendEntry] = Field(default_factory=_empty_list)
    valid: list[BlendEntry] = Field(default_factory=_empty_list)
    split: str = Field("99,1,0", description="train,valid,test split of `train` when `valid` is empty.")
    mock: Bool = Field(False, description="Random tokens (megatron-core MockGPTDataset), for benchmarks.")
    tokenizer: TokenizerSpec = _table()
    num_workers: Int = Field(2, ge=0)
    reset_position_ids: Bool = False
    reset_attention_mask: Bool = False
    eod_mask_loss: Bool = False

    @model_validator(mode="before")
    @classmethod
    def _prefix_strings(cls, data: Any) -> Any:
        """Accept ``train = ["prefix", ...]`` as shorthand for weight-1 entries."""
        return prefix_strings(data)


class CheckpointSpec(Section):
    """``[checkpoint]``: where to save, what to start from, how often."""

    save: str | None = Field(None, description="Checkpoint directory (also resumed from).")
    load: str | None = Field(None, description="Directory to load from; default: save.")
    init_from: str | None = Field(None, description="'hf:PATH' or 'mcore:PATH' to initialise weights.")
    save_interval: PosInt = 1000
    save_at_end: Bool = Field(True, description="Also save when training ends (or is stopped by a signal).")
    format: Literal["torch_dist"] = "torch_dist"
    resume: Bool = Field(True, description="Resume from the latest checkpoint in `save` if any.")
    resume_from_run: str | None = Field(
        None, description="The `name` of another spec whose checkpoints this run may continue. Unset: a resume "
        "from a checkpoint whose spec record holds another name is refused (train.py exits 2), and so is a "
        "checkpoint folder inherited from a spec of another name (rule checkpoint-inherited). Megatron-LM has no "
        "such key (its checkpoints name no run).",
    )
    async_save: Bool = False


class SlurmSpec(Section):
    """``[cluster.slurm]``: sbatch options. Secrets never go here: they are read from the
    environment at run time."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "04:00:00"
    job_name: str = "dlmspec"
    output: str = "slurm-%x-%j.out"
    exclusive: Bool = True
    constraint: str | None = None
    exclude: str | None = None
    cpus_per_task: PosInt | None = None
    mem: str | None = None
    launcher: Literal["torchrun", "srun"] = Field(
        "torchrun",
        description="torchrun: one task per node running torchrun; srun: one task per GPU, "
        "torch's env:// rendezvous from SLURM's variables.",
    )
    gpu_request: Literal["gpus-per-node", "gres", "none"] = Field(
        "gpus-per-node",
        description="How GPUs are asked for: --gpus-per-node=N, --gres=gpu:N, or not at all "
        "(clusters that hand out whole nodes, and CPU check runs).",
    )
    gpu_type: str | None = Field(None, description="GPU type for the request, e.g. 'a100' (gpu:a100:N).")
    container_image: str | None = None
    container_runtime: Literal["pyxis", "apptainer"] = Field(
        "pyxis", description="pyxis/enroot (srun --container-image) or apptainer exec."
    )
    container_mounts: list[str] = Field(default_factory=_empty_list)
    signal_seconds_before_end: PosInt = 300
    requeue: Bool = True
    env: dict[str, str] = Field(default_factory=dict)


class ClusterSpec(Section):
    """``[cluster]``: the hardware the job runs on."""

    gpu: str = Field("h100", description="GPU catalog id (`dlmspec show --gpus`).")
    gpus_per_node: PosInt = 8
    nodes: PosInt = 1
    interconnect: Literal["infiniband", "roce", "ethernet"] = "infiniband"
    inter_node_gbps: PosFloat = Field(400.0, description="Network bandwidth per GPU, Gbit/s.")
    host_launch_us: PosFloat | None = Field(
        None, description="Host (CPU) microseconds per eager CUDA kernel launch on this cluster's nodes, for "
        "`dlmspec plan`'s step time of launch-bound runs. The runtime measures it (backends/megatron/hostbench.py: "
        "median of 5 x 4,000 tiny torch.add launches) before and after training and logs it in metrics.jsonl "
        "(event host_launch, key host_launch_us). Unset: the planner's typical value (dlmspec.plan.calibration)."
    )
    slurm: SlurmSpec | None = None
    allow_memory_overflow: Bool = Field(
        False, description="Accept a planned per-GPU peak above the GPU's memory: the memory-fits error of "
        "`dlmspec validate`/`compile` becomes a warning (the plan is an estimate; set this after measuring). "
        "spec.lock.toml keeps it, so a compiled job records that it was accepted."
    )

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


class LoggingSpec(Section):
    """``[logging]``: console, TensorBoard and Weights & Biases (names only; keys stay in the environment)."""

    log_interval: PosInt = 10
    run_dir: str | None = Field(
        None, description="Directory of the run's metrics.jsonl and exit_status.json. Default: runs/<name>."
    )
    tensorboard_dir: str | None = Field(
        None, description="TensorBoard event directory (unset: no TensorBoard); the runtime writes "
        "events to <run_dir>/tensorboard, so `dlmspec compile` accepts that path only."
    )
    wandb_project: str | None = Field(
        None, description="Weights & Biases project (Megatron-LM's --wandb-project): the logging rank logs the "
        "TensorBoard scalars and the run's provenance there. The API key comes from the environment "
        "(WANDB_API_KEY), never from the spec. Unset: no W&B."
    )
    wandb_exp_name: str | None = Field(None, description="The W&B run's name (--wandb-exp-name). Default: the spec's name.")
    wandb_save_dir: str | None = Field(
        None, description="Where W&B writes its files and the run's id (--wandb-save-dir); a requeued job resumes "
        "the same W&B run from it. Default: <run_dir>/wandb."
    )
    wandb_entity: str | None = Field(None, description="W&B entity (team or user). Default: the API key's own.")
    wandb_mode: Literal["online", "offline"] | None = Field(
        None, description="online (the default): upload as the run goes; offline: files only (`wandb sync` "
        "uploads them), no API key needed."
    )
    wandb_tags: list[str] | None = Field(None, description="Tags of the W&B run.")
    profile: Bool = Field(
        False, description="Record steps profile_step_start .. profile_step_end - 1 with torch.profiler "
        "(Megatron-LM's --profile --use-pytorch-profiler); the trace and a kernel-time summary go to "
        "<run_dir>/profile/."
    )
    profile_step_start: NonNegInt = 10
    profile_step_end: PosInt = 12
    profile_ranks: list[NonNegInt] = Field(default_factory=lambda: [0])


class Spec(Section):
    """A whole training job. ``name`` names the run; every table has defaults except
    ``[model]`` and ``[train]``'s batch and length. The run's paths may hold ``{name}``
    (:mod:`dlmspec.spec.names`): validation expands it, so a ``Spec`` holds the expanded paths."""

    name: str = Field(DEFAULT_NAME, min_length=1)
    description: str | None = None
    model: ModelSpec
    objective: ObjectiveSpec = _table()
    stage: StageSpec = _table()
    parallel: ParallelSpec = _table()
    recompute: RecomputeSpec = _table()
    precision: PrecisionSpec = _table()
    kernels: KernelsSpec = _table()
    train: TrainSpec
    data: DataSpec = _table()
    checkpoint: CheckpointSpec = _table()
    cluster: ClusterSpec = _table()
    logging: LoggingSpec = _table()
    generate: GenerateSpec | None = Field(
        None, description="Sampler settings of `dlmspec generate` / `eval` (left out of the lock file when absent).")
    eval: EvalSpec | None = Field(
        None, description="Evaluations during training besides the validation loss (left out of the lock file when absent).")
    lock: dict[str, Any] | None = Field(
        None,
        description="Written by `dlmspec compile` into spec.lock.toml (content hash, dlmspec version, "
        "derived values); not part of the spec's content, so a lock file compiles to the same output.",
    )

    @model_validator(mode="before")
    @classmethod
    def _expand_name(cls, data: Any) -> Any:
        """Expand ``{name}`` in the keys of :data:`dlmspec.spec.names.NAME_KEYS` to the spec's
        name: :func:`dlmspec.spec.names.expand_names`, the one place it happens.

        Raises:
            PydanticCustomError: ``name_placeholder`` (context ``problems``: ``(key, value,
                fix)`` of each key holding another brace). :mod:`dlmspec.spec.load` checks files
                before validating (the ``name-placeholder`` rule, with file and line).
        """
        try:
            return expand_names(data)
        except PlaceholderError:
            problems = placeholder_problems(data)
            key, value, _ = problems[0]
            raise PydanticCustomError("name_placeholder", "{key} {why}",
                                      {"key": key, "why": problem_message(value), "problems": problems}) from None

    def replace(self, **changes: Any) -> "Spec":
        """Return a validated copy with dotted keys changed, e.g.
        ``spec.replace(**{"parallel.tensor_model_parallel_size": 2})`` or
        ``spec.replace(model={"num_layers": 4})`` (tables are deep-merged). Keys left at their
        defaults stay defaults. Run paths built with ``{name}`` (``Spec.load`` of a bundled spec,
        or written so) follow a changed ``name``; literal paths do not.

        Raises:
            pydantic.ValidationError: the result is not a valid spec.
        """
        data = self.model_dump(exclude_unset=True, exclude_none=True)
        templates = python.templates_of(self)
        for key, template in templates.items():
            set_dotted(data, key, template)
        for key, value in changes.items():
            if "." in key:
                set_dotted(data, key, value)
            elif isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = deep_merge(data[key], value)
            else:
                data[key] = value
        new = Spec.model_validate(data)
        kept = {k: v for k, v in python.templates_in(data).items()}
        if kept:
            python.record_of(new, create=True).templates.update(kept)
        python.note_replace(self, new, changes)
        return new


def objective_model(kind: Any) -> type[ObjectiveSpec]:
    """The spec model ``[objective]`` validates against for ``kind``
    (:func:`dlmspec.spec.objective_union.objective_model`)."""
    return objective_union.objective_model(kind, ObjectiveSpec)


def refresh_objective_kinds() -> None:
    """Rebuild ``objective.kind``'s choices and ``[objective]``'s spec models from the objective
    registry (:mod:`dlmspec.objectives`): :func:`dlmspec.objectives.register` calls it when an
    objective is registered after this module was imported (a plugin, a test's toy). The fast
    checker (:mod:`dlmspec.spec.fast`) knows the built-in kinds only and leaves any other to these
    models; while every registered objective uses :class:`ObjectiveSpec`, ``Spec.objective`` stays
    that model, else it becomes a union discriminated on ``kind``
    (:func:`dlmspec.spec.objective_union.refresh`)."""
    objective_union.refresh(ObjectiveSpec, Spec)
