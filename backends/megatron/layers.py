"""Layer specs and model construction on megatron-core.

:func:`build_layer_spec` picks megatron-core's Transformer Engine layer spec when
``transformer_engine`` imports, and otherwise megatron-core's local spec with its
``core_attention`` replaced by :class:`~dlmspec.backends.megatron.attention.SDPACoreAttention`
(or :class:`~dlmspec.backends.megatron.attention.FlexCoreAttention`, ``attention_backend="flex"``).
:func:`build_model` builds the ``GPTModel`` chunk(s) of this pipeline rank and
wraps them like Megatron-LM's ``get_model`` does: ``Float16Module`` for bf16/fp16,
then megatron's ``DistributedDataParallel``.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
from typing import List, Optional

import torch

from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer import transformer_block
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig

from dlmspec.attention import SPEC_ATTENTION_BACKENDS, choose_backend

from .attention import (
    ATTENTION_MODES,
    MODE_TO_MASK_TYPE,
    FlexCoreAttention,
    SDPACoreAttention,
    takes_key_padding,
    with_key_padding,
)
from .norms import CompiledLayerNorm, CompiledRMSNorm
from .qkv import FusedQKVSelfAttention

BACKEND_TRANSFORMER_ENGINE = "transformer_engine"
BACKEND_LOCAL_SDPA = "local+sdpa"

#: The local path's core attention of each ``attention_backend`` (dlmspec.attention's names).
LOCAL_CORE_ATTENTION = {"sdpa": SDPACoreAttention, "flex": FlexCoreAttention}


def transformer_engine_available() -> bool:
    """True when the ``transformer_engine`` package can be imported."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        import transformer_engine  # noqa: F401
    except Exception:  # a broken TE install counts as absent
        return False
    return True


class LocalNorm:
    """PyTorch ``LayerNorm``/``RMSNorm`` for the local spec, sequence parallelism included.

    megatron-core's ``WrappedTorchNorm`` (the local spec's norm without Apex or Transformer
    Engine) asserts ``not config.sequence_parallel``, so TP with sequence parallelism could not
    be built on the local path (seen on two H200s). Under sequence parallelism a norm holds the
    same weights on every tensor-parallel rank but sees a different slice of the sequence, so
    its weight gradients must be summed over the TP group; megatron-core does that for every
    parameter whose ``sequence_parallel`` attribute is true
    (``distributed.finalize_model_grads._allreduce_non_tensor_model_parallel_grads``), which is
    what Transformer Engine's ``TENorm`` sets. This builder sets it likewise; the computation
    is the plain ``torch.nn`` module (an elementwise op on ``[s/tp, b, h]``).

    Called like megatron's norm modules: ``LocalNorm(config, hidden_size, eps=...)``.

    :class:`CompiledLocalNorm` builds the same modules with a ``torch.compile``'d forward
    (:mod:`dlmspec.backends.megatron.norms`), ``kernels.compiled_norm``.

    Returns:
        ``torch.nn.LayerNorm`` or ``torch.nn.RMSNorm`` over the last dimension
        (``hidden_size``), or their compiled subclasses.

    Raises:
        ValueError: For ``layernorm_zero_centered_gamma``, ``persist_layer_norm``,
            ``memory_efficient_layer_norm`` (not in torch's norms) or another normalization.
    """

    compiled = False

    def __new__(
        cls,
        config: TransformerConfig,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "LayerNorm",
    ) -> torch.nn.Module:
        del persist_layer_norm, zero_centered_gamma, normalization  # the config decides
        for knob in ("layernorm_zero_centered_gamma", "persist_layer_norm", "memory_efficient_layer_norm"):
            if getattr(config, knob, False):
                raise ValueError(f"{knob} is not supported by PyTorch's norms (local spec); use Transformer Engine")
        if config.normalization == "LayerNorm":
            norm = (CompiledLayerNorm if cls.compiled else torch.nn.LayerNorm)(hidden_size, eps=eps)
        elif config.normalization == "RMSNorm":
            norm = (CompiledRMSNorm if cls.compiled else torch.nn.RMSNorm)(hidden_size, eps=eps)
        else:
            raise ValueError(f"normalization must be 'LayerNorm' or 'RMSNorm', got {config.normalization!r}")
        for param in norm.parameters():
            setattr(param, "sequence_parallel", bool(config.sequence_parallel))
        return norm


class CompiledLocalNorm(LocalNorm):
    """:class:`LocalNorm` whose modules run a ``torch.compile``'d forward on CUDA."""

    compiled = True


def _layer_norm_class(spec: ModuleSpec) -> type:
    """The :class:`LocalNorm` builder a local layer spec uses (for the block's final norm)."""
    norm = getattr(spec.submodules, "input_layernorm", None)
    module = norm.module if isinstance(norm, ModuleSpec) else norm
    return module if isinstance(module, type) and issubclass(module, LocalNorm) else LocalNorm


def _replace_module(spec, old, new) -> None:
    """Replace ``old`` by ``new`` wherever it is a module in the spec tree (in place)."""
    if isinstance(spec, ModuleSpec):
        if spec.module is old:
            spec.module = new
        _replace_module(spec.submodules, old, new)
        return
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        for f in dataclasses.fields(spec):
            value = getattr(spec, f.name)
            if value is old:
                setattr(spec, f.name, new)
            else:
                _replace_module(value, old, new)


def build_layer_spec(
    *,
    attention: str = "bidirectional",
    block_size: Optional[int] = None,
    num_experts: Optional[int] = None,
    moe_grouped_gemm: bool = False,
    qk_layernorm: bool = False,
    normalization: str = "RMSNorm",
    use_transformer_engine: Optional[bool] = None,
    sdpa_backend: str = "auto",
    qkv_fusion: bool = False,
    compiled_norm: bool = False,
    attention_backend: Optional[str] = None,
) -> ModuleSpec:
    """Return the ``TransformerLayer`` spec for a dlmspec model.

    Args:
        attention: ``"bidirectional"`` (MDM), ``"causal"`` (AR) or
            ``"block_causal"``.
        block_size: Block length for ``"block_causal"``.
        num_experts: Number of MoE experts (``None``: dense MLP).  Uses
            megatron-core's ``MoELayer``; with the local spec the experts are a
            ``SequentialMLP``.
        moe_grouped_gemm: Use grouped GEMM experts (needs Transformer Engine).
        qk_layernorm: Normalise queries and keys per head (Qwen3, OLMo2).
        normalization: ``"RMSNorm"`` or ``"LayerNorm"`` (must equal
            ``TransformerConfig.normalization``).
        use_transformer_engine: ``None`` = TE when it imports; ``True`` forces
            TE (error if absent); ``False`` forces the local + SDPA spec.
        sdpa_backend: SDPA backend tried first on the local + SDPA path
            (:data:`~dlmspec.backends.megatron.attention.SDPA_BACKENDS`); ignored with TE.
        qkv_fusion: On the local path, :class:`~dlmspec.backends.megatron.qkv.FusedQKVSelfAttention`
            (split, q/k RMSNorm and RoPE in one compiled kernel) in place of ``SelfAttention``;
            ignored with TE.
        compiled_norm: On the local path, :class:`CompiledLocalNorm` (``torch.compile``'d
            RMSNorm/LayerNorm) in place of :class:`LocalNorm`; ignored with TE.
        attention_backend: The local path's core attention (``model.attention_backend``):
            ``None``/``"sdpa"`` (:class:`~dlmspec.backends.megatron.attention.SDPACoreAttention`),
            ``"flex"`` (:class:`~dlmspec.backends.megatron.attention.FlexCoreAttention`) or
            ``"auto"`` (:func:`dlmspec.attention.choose_backend` for the layer's pattern). With
            TE only ``None``/``"auto"`` (TE's own attention).

    Returns:
        A megatron ``ModuleSpec``; :func:`layer_spec_backend` tells which path.

    Raises:
        ValueError: For an unknown ``attention``/``normalization``, a missing
            ``block_size``, TE requested but not installed, grouped GEMM
            without TE, or ``block_causal`` on the TE path (TE would need the
            mask passed in by the caller, which the trainer does not do).

    On the TE path the core attention is megatron-core's ``TEDotProductAttention`` made to take
    the key-padding mask of variable-length sequences
    (:func:`~dlmspec.backends.megatron.attention.with_key_padding`: TE's ``padding`` mask type
    for a call that brings one).
    """
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
    if attention_backend is not None and attention_backend not in SPEC_ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {SPEC_ATTENTION_BACKENDS}, got {attention_backend!r}")
    if attention == "block_causal" and (block_size is None or block_size < 1):
        raise ValueError("attention='block_causal' needs block_size >= 1")
    if normalization not in ("RMSNorm", "LayerNorm"):
        raise ValueError(f"normalization must be 'RMSNorm' or 'LayerNorm', got {normalization!r}")
    te_available = transformer_engine_available()
    if use_transformer_engine is None:
        use_transformer_engine = te_available
    if use_transformer_engine and not te_available:
        raise ValueError("use_transformer_engine=True but transformer_engine does not import")

    if use_transformer_engine:
        if attention_backend in ("sdpa", "flex"):
            raise ValueError(f"attention_backend={attention_backend!r} is a core attention of the local layers; "
                             "the Transformer Engine layers run TE's own (use_transformer_engine=False for it)")
        if attention == "block_causal":
            raise ValueError("block_causal attention is only implemented on the local+sdpa path")
        spec = get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts,
            moe_grouped_gemm=moe_grouped_gemm,
            qk_layernorm=qk_layernorm,
        )
        spec = copy.deepcopy(spec)
        spec.submodules.self_attention.params["attn_mask_type"] = MODE_TO_MASK_TYPE[attention]
        # TE's attention with the key-padding mask of variable-length sequences (attention.te_mask_type)
        core = spec.submodules.self_attention.submodules
        if isinstance(core.core_attention, ModuleSpec):
            core.core_attention.module = with_key_padding(core.core_attention.module)
        else:
            core.core_attention = with_key_padding(core.core_attention)
        return spec

    if moe_grouped_gemm:
        raise ValueError("moe_grouped_gemm needs Transformer Engine; set it False for local+sdpa")
    spec = copy.deepcopy(
        get_gpt_layer_local_spec(
            num_experts=num_experts,
            moe_grouped_gemm=False,
            qk_layernorm=qk_layernorm,
            normalization=normalization,
        )
    )
    norm = CompiledLocalNorm if compiled_norm else LocalNorm
    _replace_module(spec, WrappedTorchNorm, norm)  # sequence parallel works on the local path
    self_attention = spec.submodules.self_attention
    if qkv_fusion:
        self_attention.module = FusedQKVSelfAttention
    self_attention.params["attn_mask_type"] = MODE_TO_MASK_TYPE[attention]
    backend = choose_backend(attention_backend, (attention,))
    self_attention.submodules.core_attention = ModuleSpec(
        module=LOCAL_CORE_ATTENTION[backend],
        params={"mode": attention, "block_size": block_size, "sdpa_backend": sdpa_backend},
    )
    return spec


def layer_spec_backend(spec: ModuleSpec) -> str:
    """Name the implementation path of a spec: ``"transformer_engine"`` or ``"local+sdpa"``.

    Raises:
        ValueError: If the spec's core attention is neither ours nor TE's.
    """
    module = _core_attention(spec)
    if module in LOCAL_CORE_ATTENTION.values():
        return BACKEND_LOCAL_SDPA  # the local layers' path (its core attention: layer_spec_attention_backend)
    module = getattr(module, "key_padding_base", module)  # attention.with_key_padding's subclass
    if "transformer_engine" in getattr(module, "__module__", ""):
        return BACKEND_TRANSFORMER_ENGINE
    raise ValueError(f"layer spec has an unrecognised core attention: {module!r}")


def layer_spec_attention_backend(spec: ModuleSpec) -> str:
    """The attention backend of a layer spec, as :data:`dlmspec.attention.BACKENDS` names it:
    ``"sdpa"``, ``"flex"`` or ``"te"``.

    Raises:
        ValueError: If the spec's core attention is neither ours nor TE's.
    """
    module = _core_attention(spec)
    for name, cls in LOCAL_CORE_ATTENTION.items():
        if module is cls:
            return name
    layer_spec_backend(spec)  # raises for an unrecognised module
    return "te"


def _core_attention(spec: ModuleSpec) -> type:
    """The core attention class of a layer spec."""
    core = spec.submodules.self_attention.submodules.core_attention
    return core.module if isinstance(core, ModuleSpec) else core


def layer_spec_takes_key_padding(spec: ModuleSpec) -> bool:
    """True when the spec's core attention applies a ``[b, 1, 1, s]`` key-padding mask
    (variable-length sequences): the local path's SDPA attention, and on the Transformer Engine
    path the :func:`~dlmspec.backends.megatron.attention.with_key_padding` class
    :func:`build_layer_spec` puts in (megatron-core's own ``TEDotProductAttention`` would ignore
    the mask under the spec's ``no_mask`` type)."""
    return takes_key_padding(_core_attention(spec))


def layer_spec_attention(spec: ModuleSpec) -> str:
    """The attention pattern a spec implements (``"bidirectional"``, ``"causal"``, ...)."""
    mask_type = spec.submodules.self_attention.params.get("attn_mask_type")
    for mode, mtype in MODE_TO_MASK_TYPE.items():
        if mtype == mask_type:
            return mode
    raise ValueError(f"layer spec has an unrecognised attn_mask_type: {mask_type!r}")


def layer_spec_fusions(spec: ModuleSpec) -> dict:
    """Which of dlmspec's local-path fusions a layer spec uses (for the run's start record).

    Returns:
        ``{"qkv_fusion": bool, "compiled_norm": bool}`` (:func:`build_layer_spec`'s arguments).
    """
    return {
        "qkv_fusion": spec.submodules.self_attention.module is FusedQKVSelfAttention,
        "compiled_norm": _layer_norm_class(spec).compiled,
    }


def layer_spec_sdpa_backend(spec: ModuleSpec) -> Optional[str]:
    """The SDPA backend a local layer spec pins (``core_attention``'s ``sdpa_backend``), or ``None``."""
    core = spec.submodules.self_attention.submodules.core_attention
    params = getattr(core, "params", None) or {}
    return params.get("sdpa_backend")


def layer_spec_block_size(spec: ModuleSpec) -> Optional[int]:
    """The block size of a ``block_causal`` layer spec (``core_attention``'s ``block_size``), or ``None``."""
    core = spec.submodules.self_attention.submodules.core_attention
    params = getattr(core, "params", None) or {}
    return params.get("block_size")


def pad_vocab_size(vocab_size: int, *, divisible_by: int = 128, tensor_model_parallel_size: int = 1) -> int:
    """Round ``vocab_size`` up to a multiple of ``divisible_by * tensor_model_parallel_size``.

    Same rule as Megatron-LM's ``--make-vocab-size-divisible-by``: the embedding
    and output layer are split over TP ranks along the vocabulary and GEMMs
    prefer multiples of 128 (e.g. Qwen3's 151936 = 1187 * 128 is unchanged).

    Raises:
        ValueError: If an argument is < 1.
    """
    if vocab_size < 1 or divisible_by < 1 or tensor_model_parallel_size < 1:
        raise ValueError("vocab_size, divisible_by and tensor_model_parallel_size must be >= 1")
    multiple = divisible_by * tensor_model_parallel_size
    return ((vocab_size + multiple - 1) // multiple) * multiple


def patch_moe_router_without_te() -> bool:
    """Make megatron-core 0.16.1's MoE router run without Transformer Engine.

    ``megatron/core/transformer/moe/moe_utils.py`` imports ``te_general_gemm`` only inside its
    ``try: import transformer_engine`` block, but ``RouterGatingLinearFunction`` tests
    ``te_general_gemm is not None`` unconditionally, so without TE every MoE forward raises
    ``NameError: name 'te_general_gemm' is not defined`` (seen on the H200 device machine).
    Defining the name as ``None`` selects the function's own ``torch.mm``/``torch.addmm`` path,
    which is what the code intends when TE is absent.

    Returns:
        True when the name had to be defined (TE absent), False otherwise.
    """
    from megatron.core.transformer.moe import moe_utils

    if getattr(moe_utils, "HAVE_TE", True) or hasattr(moe_utils, "te_general_gemm"):
        return False
    moe_utils.te_general_gemm = None
    return True


def build_model(
    config: TransformerConfig,
    *,
    layer_spec: ModuleSpec,
    vocab_size: int,
    max_sequence_length: int,
    position_embedding_type: str = "rope",
    rotary_base: int = 10000,
    rotary_percent: float = 1.0,
    share_embeddings_and_output_weights: bool = False,
    ddp_config: Optional[DistributedDataParallelConfig] = None,
    vp_stage: Optional[int] = None,
) -> List[torch.nn.Module]:
    """Build this rank's ``GPTModel`` chunk(s), optionally wrapped in megatron DDP.

    ``parallel_state.initialize_model_parallel`` must have run.  With virtual
    pipeline parallelism (``parallel_state``'s virtual size set) one chunk per
    virtual stage is built (``vp_stage = 0 .. vpp-1``), otherwise one chunk; each
    gets ``pre_process`` / ``post_process`` from its pipeline position, so only
    the first stage holds the embedding and only the last the output layer.
    Chunks are moved to the current CUDA device unless
    ``config.use_cpu_initialization`` is set and CUDA is unavailable (CPU tests).
    For ``config.bf16`` / ``config.fp16`` each chunk is wrapped in megatron's
    ``Float16Module`` (half-precision weights; the optimizer keeps fp32 main
    weights), then - if ``ddp_config`` is given - in
    ``DistributedDataParallel`` (bucketing only on chunk 0, like Megatron-LM), or with
    ``ddp_config.use_megatron_fsdp`` in megatron-core's ``FullyShardedDataParallel``
    (:func:`dlmspec.backends.megatron.fsdp.wrap`).

    Args:
        config: The ``TransformerConfig`` (its parallel sizes must match
            ``parallel_state``).
        layer_spec: From :func:`build_layer_spec`.
        vocab_size: Padded vocabulary size (:func:`pad_vocab_size`).
        max_sequence_length: Longest sequence (learned position embeddings'
            size; RoPE ignores it).
        position_embedding_type: ``"rope"``, ``"learned_absolute"``, ``"none"``...
        rotary_base: RoPE base (Qwen3: 1_000_000).
        rotary_percent: Fraction of each head's dims that are rotated.
        share_embeddings_and_output_weights: Tie input and output embeddings.
        ddp_config: Wrap chunks in megatron DDP with this config (``None``: no
            DDP wrapper, e.g. for forward-only use).
        vp_stage: Build only this virtual stage's chunk (``None``: all chunks of
            this rank).

    Returns:
        List of model chunks, length = virtual pipeline size (or 1).

    Raises:
        RuntimeError: If model parallel state is not initialised.
    """
    if not parallel_state.model_parallel_is_initialized():
        raise RuntimeError("call parallel_state.initialize_model_parallel before build_model")

    if config.num_moe_experts:
        patch_moe_router_without_te()

    vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size()
    if vpp is not None:
        stages = [vp_stage] if vp_stage is not None else list(range(vpp))
    else:
        stages = [None]

    chunks: List[torch.nn.Module] = []
    for stage in stages:
        pre_process = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage)
        post_process = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)
        block_spec = layer_spec
        if layer_spec_backend(layer_spec) == BACKEND_LOCAL_SDPA and transformer_block.LayerNormImpl is WrappedTorchNorm:
            # The block's final norm is megatron's module-level default (WrappedTorchNorm
            # without Apex/TE); hand the block its submodules with LocalNorm instead.
            block_spec = TransformerBlockSubmodules(
                layer_specs=[layer_spec] * get_num_layers_to_build(config, vp_stage=stage),
                layer_norm=_layer_norm_class(layer_spec),
            )
        model = GPTModel(
            config=config,
            transformer_layer_spec=block_spec,
            vocab_size=vocab_size,
            max_sequence_length=max_sequence_length,
            pre_process=pre_process,
            post_process=post_process,
            share_embeddings_and_output_weights=share_embeddings_and_output_weights,
            position_embedding_type=position_embedding_type,
            rotary_percent=rotary_percent,
            rotary_base=rotary_base,
            vp_stage=stage,
        )
        for param in model.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        chunks.append(model)

    if torch.cuda.is_available():
        chunks = [m.cuda(torch.cuda.current_device()) for m in chunks]
    elif not config.use_cpu_initialization:
        raise RuntimeError("no CUDA device: set TransformerConfig.use_cpu_initialization=True")

    if config.fp16 or config.bf16:
        chunks = [Float16Module(config, m) for m in chunks]

    if ddp_config is not None and getattr(ddp_config, "use_megatron_fsdp", False):
        from .fsdp import wrap  # megatron-core's FullyShardedDataParallel (Megatron-FSDP)

        chunks = wrap(chunks, config, ddp_config)
    elif ddp_config is not None:
        chunks = [
            DistributedDataParallel(
                config=config,
                ddp_config=ddp_config,
                module=m,
                disable_bucketing=(i > 0),
            )
            for i, m in enumerate(chunks)
        ]
    return chunks


def count_parameters(chunks: List[torch.nn.Module]) -> int:
    """Number of parameters held by this rank's chunks (shared weights counted once)."""
    seen = set()
    total = 0
    for chunk in chunks:
        for p in chunk.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total
