"""Build a megatron-core GPTModel for :class:`ModelDims` and run it (CPU or CUDA).

Used by :func:`dlmspec.backends.convert.api.verify` and ``bench/convert/verify_gpu.py``. The
TransformerConfig (:func:`dlmspec.backends.model_config.transformer_config_from_record`, the one
generate builds too) mirrors the Hugging Face families: RMSNorm, SwiGLU
(``gated_linear_unit`` + SiLU), no linear biases except optional q/k/v biases, optional
per-head q/k RMSNorm, RoPE (non-interleaved), MoE routers that take top-k then softmax
(normalised top-k probabilities) or softmax then top-k (``moe_router_pre_softmax``).

Running megatron-core 0.16.1 on a CPU-only torch hits three CUDA-only spots;
:func:`enable_cpu_forward` works around exactly those, leaving the math of every layer to
megatron:

1. ``RotaryEmbedding.get_emb`` moves ``inv_freq`` to ``torch.cuda.current_device()`` when it
   is on CPU -> the instance's ``get_emb`` is replaced by the same computation without the
   move (non-interleaved RoPE only);
2. ``DotProductAttention`` takes its score buffer from megatron's global memory buffer,
   which allocates on ``torch.cuda.current_device()`` -> the buffer is pre-filled with a CPU
   tensor large enough for the batch;
3. attention dropout forks the CUDA RNG tracker -> megatron's inference RNG tracker
   (``initialize_rng_tracker(inference_rng_tracker=True)``, whose fork is a no-op) is used.

MoE layers cannot run on CPU: ``Router.gating`` (megatron/core/transformer/moe/router.py)
moves the router weight to ``torch.cuda.current_device()`` whenever it is on CPU.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import torch

from dlmspec.backends.convert.dims import ModelDims
from dlmspec.backends.convert.errors import ConversionError
from dlmspec.backends.model_config import record_from_dims, transformer_config_from_record, transformer_config_kwargs_from_record

#: Why a MoE GPTModel cannot run a forward pass on a CPU-only torch.
MOE_CPU_REASON = (
    "megatron-core 0.16.1 MoE cannot run on CPU: Router.gating "
    "(megatron/core/transformer/moe/router.py) moves the router weight to "
    "torch.cuda.current_device() whenever it is on CPU"
)


def transformer_config_kwargs(
    dims: ModelDims, *, tp: int = 1, params_dtype: torch.dtype = torch.float32, cpu: bool = True
) -> dict[str, Any]:
    """Keyword arguments of megatron ``TransformerConfig`` for ``dims``: those of its record
    (:func:`dlmspec.backends.model_config.record_from_dims`), as generate builds them
    (:func:`dlmspec.backends.model_config.transformer_config_kwargs_from_record`).

    Fusions that need CUDA kernels are off; dropout is 0 (for logit comparison).

    Args:
        dims: model dimensions.
        tp: tensor-parallel size.
        params_dtype: parameter dtype.
        cpu: build parameters on CPU (``use_cpu_initialization``) and pick the MoE dispatcher
            that does not create CUDA streams.
    """
    return transformer_config_kwargs_from_record(record_from_dims(dims), tp=tp, params_dtype=params_dtype, cpu=cpu)


def gpt_model_kwargs(dims: ModelDims) -> dict[str, Any]:
    """Keyword arguments of megatron ``GPTModel`` (besides config and spec) for ``dims``."""
    return dict(
        vocab_size=dims.padded_vocab_size,
        max_sequence_length=dims.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=dims.rotary_base,
        rope_scaling=dims.rope_scaling_factor is not None,
        rope_scaling_factor=dims.rope_scaling_factor or 8.0,
        share_embeddings_and_output_weights=dims.tied,
    )


def layer_spec(dims: ModelDims, spec: str = "local") -> Any:
    """The megatron layer ``ModuleSpec`` for ``dims`` (``"local"`` or ``"te"``)."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    experts = dims.num_experts or None
    if spec == "local":
        return get_gpt_layer_local_spec(num_experts=experts, qk_layernorm=dims.qk_layernorm, normalization="RMSNorm")
    if spec == "te":
        return get_gpt_layer_with_transformer_engine_spec(num_experts=experts, qk_layernorm=dims.qk_layernorm)
    raise ConversionError(f"unknown layer spec {spec!r}", tensor="spec", expected=("local", "te"))


def build_gpt_model(
    dims: ModelDims,
    *,
    spec: str = "local",
    tp: int = 1,
    params_dtype: torch.dtype = torch.float32,
    cpu: bool = True,
) -> torch.nn.Module:
    """A megatron GPTModel for ``dims`` (needs ``parallel_state`` initialised).

    Raises:
        ConversionError: unknown ``spec``.
    """
    from megatron.core.models.gpt import GPTModel

    config = transformer_config_from_record(record_from_dims(dims), tp=tp, params_dtype=params_dtype, cpu=cpu)
    if config.num_moe_experts:
        from dlmspec.backends.megatron.layers import patch_moe_router_without_te

        patch_moe_router_without_te()  # megatron-core 0.16.1's router needs this without TE
    return GPTModel(config=config, transformer_layer_spec=layer_spec(dims, spec), **gpt_model_kwargs(dims))


def load_into_model(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy a (TP-local) megatron state dict into ``model``, casting to its dtypes.

    Raises:
        ConversionError: a model parameter has no tensor, or a tensor has no parameter (named).
    """
    own = model.state_dict()
    sd = {k: (v.to(own[k].dtype) if isinstance(v, torch.Tensor) and k in own else v) for k, v in state_dict.items()}
    for k, v in own.items():
        if k.endswith("_extra_state") and k not in sd:
            sd[k] = v
    result = model.load_state_dict(sd, strict=False)
    if result.missing_keys:
        k = result.missing_keys[0]
        raise ConversionError(f"megatron model parameter {k!r} has no tensor in the checkpoint", tensor=k,
                              expected=tuple(own[k].shape))
    if result.unexpected_keys:
        k = result.unexpected_keys[0]
        raise ConversionError(f"checkpoint tensor {k!r} has no parameter in the megatron model", tensor=k,
                              expected=None)


def enable_cpu_forward(model: torch.nn.Module, max_batch: int, max_seq: int) -> None:
    """Make a dense megatron GPTModel runnable on a CPU-only torch (see module docstring).

    Call inside an initialised ``parallel_state``; undo the RNG tracker with
    :func:`disable_cpu_forward`.

    Raises:
        ConversionError: the model has MoE layers (:data:`MOE_CPU_REASON`).
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    if getattr(model.config, "num_moe_experts", None):
        raise ConversionError(MOE_CPU_REASON, tensor="mlp.router.weight", expected="a CUDA device")
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    cfg = model.config
    heads = cfg.num_attention_heads // cfg.tensor_model_parallel_size
    numel = max_batch * heads * max_seq * max_seq
    buf = parallel_state.get_global_memory_buffer()
    for dtype in (cfg.params_dtype, torch.float32):
        key = ("mpu", dtype)
        if buf.buffer.get(key) is None or buf.buffer[key].numel() < numel:
            buf.buffer[key] = torch.empty(numel, dtype=dtype)
    rope = model.rotary_pos_emb
    if rope.rotary_interleaved:
        raise ConversionError("interleaved RoPE is not supported on CPU", tensor="rotary_interleaved", expected=False)

    def get_emb(self: Any, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        return torch.cat((freqs, freqs), dim=-1)[:, None, None, :]

    rope.get_emb = types.MethodType(get_emb, rope)


def disable_cpu_forward() -> None:
    """Restore megatron's default (training) RNG tracker after :func:`enable_cpu_forward`."""
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    initialize_rng_tracker(force_reset=True)


def megatron_logits(model: torch.nn.Module, input_ids: torch.Tensor, *, causal: bool = True) -> torch.Tensor:
    """Logits of a megatron GPTModel, causal (an AR LM) or bidirectional (``causal=False``, a diffusion LM).

    Args:
        model: GPTModel (eval mode is set here).
        input_ids: ``[batch, seq]`` int64 on the model's device.
        causal: hide later keys (default), or hide none: an explicit all-``False`` mask, which
            megatron's softmax uses instead of its default causal one.

    Returns:
        ``[batch, seq, vocab_per_tp_rank]`` logits (the padded vocabulary, this rank's
        slice when TP > 1 with ``parallel_output``).
    """
    model.eval()
    b, s = input_ids.shape
    pos = torch.arange(s, device=input_ids.device).unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=input_ids.device), diagonal=1)[None, None]
    if not causal:
        mask = torch.zeros_like(mask)
    with torch.no_grad():
        return model(input_ids, pos, mask)
