"""Fused rotary position embedding for the local (non-Transformer-Engine) path.

megatron-core applies RoPE without Transformer Engine in
``megatron.core.models.common.embeddings.rope_utils._apply_rotary_pos_emb_bshd``: per call a
``cos`` and a ``sin`` of the frequencies, a ``chunk``, a negation, a ``cat`` (rotate-half), two
multiplications, an addition and a final ``cat`` with the (empty) pass-through part - eight
kernels that each read and write the whole query or key tensor, and as many again in the
backward. On Qwen3-1.7B at micro batch 10 x 4096 tokens on one H200, fusing them cut the GPU's
busy time per step from 1188 to 1119 ms, its element-wise and copy kernels from 243 to 161 ms
(``bench/results/profile_h200x2_2026-11-30.json``, cuDNN attention, unfused vs fused RoPE).

:func:`install_fused_rope` replaces that function by one whose arithmetic (the same formula,
``t * cos + rotate_half(t) * sin``, Su et al. 2021, eq. 34) is compiled by ``torch.compile``
into one Triton kernel for the forward and one for the backward - the "torch.compile of the
local modules" route of issue #7, as megatron-core itself does for SwiGLU (``jit_fuser``).
With Transformer Engine, megatron-core's own ``apply_rope_fusion`` (TE's kernel) is used instead
and nothing is replaced.

The fused function also returns its result laid out as ``[b, h, s, d]`` in memory (a
``[s, b, h, d]``-shaped view of it): the attention module
(:class:`dlmspec.backends.megatron.attention.SDPACoreAttention`) permutes queries and keys to
``[b, h, s, d]``, and cuDNN attention needs them dense in that order, so the permute-and-copy
before cuDNN becomes free.

Only the common case is fused: not interleaved, no multi-latent attention, ``mscale == 1``,
rotary dimension equal to the head dimension, CUDA tensors. Every other call goes to
megatron-core's function unchanged.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from .norms import compile_static

_ORIGINAL: Optional[Callable] = None


def rope_reference(t: Tensor, freqs: Tensor) -> Tensor:
    """RoPE as megatron-core computes it (not interleaved): ``t * cos + rotate_half(t) * sin``.

    Args:
        t: ``[s, b, h, d]`` queries or keys (bf16/fp16/fp32).
        freqs: ``[s, 1, 1, d]`` angles in radians (fp32), as
            ``megatron.core.models.common.embeddings.rotary_pos_embedding.RotaryEmbedding`` returns.

    Returns:
        ``[s, b, h, d]`` in ``t``'s dtype, laid out ``[b, h, s, d]`` in memory.
    """
    cos = torch.cos(freqs).to(t.dtype)
    sin = torch.sin(freqs).to(t.dtype)
    x1, x2 = torch.chunk(t, 2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    out = t * cos + rotated * sin
    return out.permute(1, 2, 0, 3).contiguous().permute(2, 0, 1, 3)


def _fused_bshd(
    t: Tensor,
    freqs: Tensor,
    rotary_interleaved: bool = False,
    multi_latent_attention: bool = False,
    mscale: float = 1.0,
) -> Tensor:
    """Drop-in for megatron's ``_apply_rotary_pos_emb_bshd``: fused in the common case."""
    if (
        t.is_cuda
        and not rotary_interleaved
        and not multi_latent_attention
        and mscale == 1.0
        and t.dim() == 4
        and freqs.shape[-1] == t.shape[-1]
    ):
        return compile_static(rope_reference)(t, freqs)
    return _ORIGINAL(t, freqs, rotary_interleaved=rotary_interleaved,
                     multi_latent_attention=multi_latent_attention, mscale=mscale)


def install_fused_rope() -> bool:
    """Route megatron-core's unfused RoPE through :func:`_fused_bshd` (idempotent).

    Replaces ``rope_utils._apply_rotary_pos_emb_bshd``, which megatron-core's
    ``apply_rotary_pos_emb`` looks up at every call when ``config.apply_rope_fusion`` is false.

    Returns:
        True when installed now or before.
    """
    global _ORIGINAL
    from megatron.core.models.common.embeddings import rope_utils

    if _ORIGINAL is None:
        _ORIGINAL = rope_utils._apply_rotary_pos_emb_bshd
        rope_utils._apply_rotary_pos_emb_bshd = _fused_bshd
    return True


def uninstall_fused_rope() -> None:
    """Restore megatron-core's function (tests)."""
    global _ORIGINAL
    from megatron.core.models.common.embeddings import rope_utils

    if _ORIGINAL is not None:
        rope_utils._apply_rotary_pos_emb_bshd = _ORIGINAL
        _ORIGINAL = None
