"""Calling an exported block-diffusion LM (BD3-LM) outside dlmspec: its input and its mask.

A ``bd3lm`` checkpoint exported by :func:`~dlmspec.backends.convert.api.mcore_to_hf` is a stock
``*ForCausalLM`` with ``"is_causal": false`` and a ``dlmspec`` record (``block_size``,
``clean_attention``; :func:`~dlmspec.backends.convert.objective.diffusion_hf_config`). It was trained
on the noised sequence ``x_t`` and the clean one ``x_0`` side by side, so a caller gives it

* ``input_ids = x_t (+) x_0`` (``[b, 2L]``) and ``position_ids`` ``0 .. L-1`` twice
  (:func:`bd3_inputs`; bd3lms ``models/dit.py`` applies one rotary of length ``L`` to each half);
* the 4-D mask of :func:`bd3_attention_mask` (``[1, 1, 2L, 2L]``): a noised block sees itself and
  the clean blocks before it, the clean half is block-causal (or causal: ``clean_attention =
  "causal"``). ``transformers`` takes a 4-D mask as it is: boolean, ``True`` = attended, for the SDPA
  attention (its default on CPU); additive float (0 attended, the dtype's minimum hidden) for
  ``attn_implementation = "eager"``.

The logits of the ``x_t`` half are the denoiser's (position ``i`` predicts ``x_0[i]``). Sampling
block by block only needs the clean prefix and the current noised block: the same mask over
``[x_t block (+) prefix]`` (Arriola et al. 2025, sec. 4). :func:`megatron_bd3_logits` computes the
same logits with dlmspec's training model (megatron-core ``GPTModel``, RoPE repeated for the two
halves, :func:`dlmspec.backends.megatron.masks.block_diffusion`), which the export is checked
against.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

from dlmspec.backends.convert.dims import ModelDims
from dlmspec.backends.convert.errors import ConversionError


def bd3_inputs(x_t: torch.Tensor, x0: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [b, 2L], position_ids [b, 2L])``: ``x_t (+) x_0`` and ``0 .. L-1`` twice.

    Raises:
        ValueError: ``x_t`` and ``x0`` not the same ``[b, L]`` shape.
    """
    if x_t.shape != x0.shape or x_t.dim() != 2:
        raise ValueError(f"x_t {tuple(x_t.shape)} and x_0 {tuple(x0.shape)} must be the same [b, L]")
    b, n = x_t.shape
    positions = torch.arange(n, device=x_t.device).unsqueeze(0).expand(b, n)
    return torch.cat([x_t, x0], dim=1), torch.cat([positions, positions], dim=1)


def bd3_attention_mask(seq_len: int, block_size: int, *, clean_causal: bool = False,
                       dtype: Optional[torch.dtype] = None, device=None) -> torch.Tensor:
    """The block-diffusion mask over ``2 * seq_len`` positions as ``transformers`` takes a 4-D mask:
    ``[1, 1, 2L, 2L]`` bool, ``True`` = attended (``dtype`` ``None``), or additive ``dtype`` (0 where
    attended, ``torch.finfo(dtype).min`` where hidden). The pattern is
    :func:`dlmspec.backends.megatron.masks.block_diffusion`'s (BD3-LM eq. 8).

    Raises:
        ValueError: ``block_size`` not dividing ``seq_len``.
    """
    from dlmspec.backends.megatron.masks import block_diffusion

    allowed = block_diffusion(seq_len, block_size, clean_causal=clean_causal).allowed(
        2 * seq_len, 2 * seq_len, device)  # [1, 1, 2L, 2L]
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


def megatron_bd3_logits(mcore_path: str | os.PathLike, x_t: torch.Tensor, x0: torch.Tensor, block_size: int, *,
                        clean_causal: bool = False, dims: ModelDims | None = None) -> torch.Tensor:
    """Logits ``[b, 2L, vocab]`` (fp32, CPU) of a block-diffusion checkpoint as dlmspec trains it:
    megatron-core's ``GPTModel`` (local layers) with its RoPE repeated for the two halves
    (:class:`~dlmspec.backends.megatron.objectives.bd3lm.RepeatedHalvesRotary`) on ``x_t (+) x_0``
    under the block-diffusion mask (megatron's convention: ``True`` = hidden).

    Raises:
        ConversionError: as :func:`dlmspec.backends.convert.api.megatron_checkpoint_logits`.
        ValueError: as :func:`bd3_inputs`, :func:`bd3_attention_mask`.
    """
    from megatron.core import parallel_state

    from dlmspec.backends.convert import mcore_io, mcore_model
    from dlmspec.backends.megatron.objectives.bd3lm import repeat_rotary_halves

    input_ids, positions = bd3_inputs(x_t, x0)
    hidden = ~bd3_attention_mask(x_t.shape[1], block_size, clean_causal=clean_causal)
    state, dims = mcore_io.load_mcore_checkpoint(mcore_path, dims)
    if dims.is_moe:
        raise ConversionError(mcore_model.MOE_CPU_REASON, tensor="mlp.router.weight", expected="a CUDA device")
    with mcore_io.process_group():
        own_mp = not parallel_state.model_parallel_is_initialized()
        if own_mp:
            parallel_state.initialize_model_parallel(1, 1)
        try:
            model = mcore_model.build_gpt_model(dims, params_dtype=torch.float32, cpu=True)
            mcore_model.load_into_model(model, state)
            mcore_model.enable_cpu_forward(model, input_ids.shape[0], input_ids.shape[1])
            repeat_rotary_halves(model)
            model.eval()
            with torch.no_grad():
                logits = model(input_ids, positions, hidden)
            return logits[..., : dims.vocab_size].float()
        finally:
            mcore_model.disable_cpu_forward()
            if own_mp:
                parallel_state.destroy_model_parallel()
