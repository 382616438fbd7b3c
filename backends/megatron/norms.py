"""``torch.compile``'d RMSNorm and LayerNorm for the local (non-Transformer-Engine) path.

``torch.nn.RMSNorm`` / ``torch.nn.LayerNorm`` subclasses (same parameters and state-dict keys)
whose CUDA forward is one Triton kernel and backward a fused one; on CPU tensors they run
PyTorch's forward. Why (``bench/results/profile_h200x2_2026-11-30.json``): docs/runtime.md,
"Compiled norms".
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch
from torch import Tensor


def rms_norm_fp32(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dimension, computed and returned in fp32.

    Args:
        x: ``[..., h]`` in any float dtype.
        weight: ``[h]`` or ``None`` (no scale).
        eps: Added to the mean square.

    Returns:
        ``[..., h]`` fp32 (:func:`rms_norm_reference` rounds it once to ``x``'s dtype;
        :mod:`dlmspec.backends.megatron.qkv` rotates it first).
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight.float() if weight is not None else y


def rms_norm_reference(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dimension, in fp32, one rounding.

    Zhang & Sennrich 2019 ("Root Mean Square Layer Normalization"), eq. 4, as
    ``torch.nn.functional.rms_norm`` computes it on CUDA (fp32 accumulation, output in
    ``x``'s dtype).

    Args:
        x: ``[..., h]``.
        weight: ``[h]`` or ``None``.
        eps: Added to the mean square.

    Returns:
        ``[..., h]`` in ``x``'s dtype.
    """
    return rms_norm_fp32(x, weight, eps).to(x.dtype)


def layer_norm_reference(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` over the last dimension, in fp32.

    Ba et al. 2016 ("Layer Normalization"), eq. 4, biased variance as
    ``torch.nn.functional.layer_norm``.

    Args:
        x: ``[..., h]``.
        weight, bias: ``[h]`` or ``None``.
        eps: Added to the variance.

    Returns:
        ``[..., h]`` in ``x``'s dtype.
    """
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    centered = xf - mean
    y = centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@functools.lru_cache(maxsize=None)
def compile_static(fn: Callable) -> Callable:
    """``torch.compile(fn, dynamic=False, fullgraph=True)``, once per function: the compiled
    kernels of the local path (this module's norms, :mod:`.qkv`, :mod:`.rope`) share it."""
    return torch.compile(fn, dynamic=False, fullgraph=True)


def rms_eps(eps: Optional[float], dtype: torch.dtype) -> float:
    """``torch.nn.RMSNorm``'s epsilon: ``eps``, or ``torch.finfo(dtype).eps`` when it is None."""
    return float(eps) if eps is not None else float(torch.finfo(dtype).eps)


class CompiledRMSNorm(torch.nn.RMSNorm):
    """``torch.nn.RMSNorm`` with :func:`rms_norm_reference` compiled on CUDA tensors.

    Input ``[..., h]`` -> output of the same shape and dtype.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not x.is_cuda:
            return super().forward(x)
        return compile_static(rms_norm_reference)(x, self.weight, rms_eps(self.eps, x.dtype))


class CompiledLayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` (last dimension) with :func:`layer_norm_reference` compiled on CUDA.

    Input ``[..., h]`` -> output of the same shape and dtype.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not x.is_cuda or len(self.normalized_shape) != 1:
            return super().forward(x)
        return compile_static(layer_norm_reference)(x, self.weight, self.bias, float(self.eps))
