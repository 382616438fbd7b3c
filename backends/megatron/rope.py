"""Fused rotary position embedding for the local (non-Transformer-Engine) path.

:func:`install_fused_rope` replaces megatron-core's ``_apply_rotary_pos_emb_bshd`` (eight
element-wise kernels forward, as many backward) by one ``torch.compile``'d kernel each way,
whose output is laid out as the attention kernel wants it; only the common case (not
interleaved, no MLA, ``mscale == 1``, full rotary dimension, CUDA), every other call goes to
megatron-core's function. With Transformer Engine megatron-core's ``apply_rope_fusion`` is used
instead. Measurements (``bench/results/profile_h200x2_2026-11-30.json``): docs/runtime.md,
"Fused RoPE".
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
