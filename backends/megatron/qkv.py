"""One compiled kernel from the fused QKV projection to attention's inputs (local path).

:func:`qkv_norm_rope_reference` is the arithmetic megatron-core's ``SelfAttention`` runs between
``linear_qkv`` and the attention kernel (split, per-head RMSNorm, RoPE, the ``[b, h, s, d]``
layout), written once for ``torch.compile``: one Triton kernel forward, one backward.
:class:`FusedQKVSelfAttention` takes that path for the training case it covers and otherwise
runs megatron-core's ``forward`` (``kernels.qkv_fusion``). What it replaces and what that cost
(``bench/results/profile_h200x2_2026-11-30.json``): docs/runtime.md, "Fused QKV, norm and RoPE".
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.identity_op import IdentityOp

from .norms import compile_static, rms_eps, rms_norm_fp32

#: The fused path runs on CUDA tensors only (tests on CPU set this False to run it eagerly).
REQUIRE_CUDA = True


def _rms(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    """fp32 RMSNorm over the last dimension (:func:`.norms.rms_norm_fp32`); no weight: no norm."""
    return rms_norm_fp32(x, weight, eps) if weight is not None else x.float()


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x * cos + rotate_half(x) * sin`` in fp32 (megatron-core's non-interleaved RoPE)."""
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _bhsd(t: Tensor) -> Tensor:
    """``[s, b, h, d]`` values laid out ``[b, h, s, d]`` in memory (an ``[s, b, h, d]`` view)."""
    return t.permute(1, 2, 0, 3).contiguous().permute(2, 0, 1, 3)


def qkv_norm_rope_reference(
    mixed_qkv: Tensor,
    q_weight: Optional[Tensor],
    k_weight: Optional[Tensor],
    freqs: Optional[Tensor],
    groups: int,
    heads_per_group: int,
    head_dim: int,
    q_eps: float = 1e-6,
    k_eps: float = 1e-6,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Split the QKV projection, normalise q and k per head, rotate them; attention's layout.

    Args:
        mixed_qkv: ``[s, b, ng * (np/ng + 2) * hn]``, the output of ``linear_qkv`` (megatron's
            interleaved order: per query group ``np/ng`` query heads, one key, one value).
        q_weight, k_weight: ``[hn]`` RMSNorm weights of ``q_layernorm``/``k_layernorm``, or
            ``None`` for no normalisation.
        freqs: ``[s, 1, 1, hn]`` RoPE angles in radians (megatron's ``RotaryEmbedding``), or
            ``None`` for no rotation.
        groups: ``ng``, query groups on this tensor-parallel rank.
        heads_per_group: ``np/ng``.
        head_dim: ``hn``.
        q_eps, k_eps: The norms' epsilons.

    Returns:
        ``(query [s, b, np, hn], key [s, b, ng, hn], value [s, b, ng, hn])`` in
        ``mixed_qkv``'s dtype, each laid out ``[b, h, s, d]`` in memory. Equal to megatron-core's
        split + ``q_layernorm``/``k_layernorm`` + ``apply_rotary_pos_emb`` up to one rounding
        (megatron rounds after the norm and after each RoPE operation).
    """
    s, b = mixed_qkv.shape[0], mixed_qkv.shape[1]
    x = mixed_qkv.view(s, b, groups, (heads_per_group + 2) * head_dim)
    q, k, v = torch.split(x, [heads_per_group * head_dim, head_dim, head_dim], dim=3)
    q = q.reshape(s, b, groups * heads_per_group, head_dim)
    qf = _rms(q, q_weight, q_eps)
    kf = _rms(k, k_weight, k_eps)
    if freqs is not None:
        cos, sin = torch.cos(freqs), torch.sin(freqs)
        qf = _rope(qf, cos, sin)
        kf = _rope(kf, cos, sin)
    dtype = mixed_qkv.dtype
    return _bhsd(qf.to(dtype)), _bhsd(kf.to(dtype)), _bhsd(v)


def qkv_norm_rope(*args, compiled: Optional[bool] = None, **kwargs) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`qkv_norm_rope_reference`, compiled by ``torch.compile`` on CUDA tensors.

    Args:
        compiled: Force (``True``) or skip (``False``) the compiled function; ``None``: compiled
            when ``mixed_qkv`` is on a CUDA device.
    """
    mixed = args[0] if args else kwargs["mixed_qkv"]
    if compiled is None:
        compiled = mixed.is_cuda
    fn = compile_static(qkv_norm_rope_reference) if compiled else qkv_norm_rope_reference
    return fn(*args, **kwargs)


def _rms_weight_eps(norm: Optional[torch.nn.Module]) -> Tuple[bool, Optional[Tensor], float]:
    """``(supported, weight, eps)`` of a q/k norm module: RMSNorm, identity or none."""
    if norm is None or isinstance(norm, IdentityOp):
        return True, None, 0.0
    if isinstance(norm, torch.nn.RMSNorm) and norm.elementwise_affine:
        return True, norm.weight, rms_eps(norm.eps, norm.weight.dtype)
    return False, None, 0.0


class FusedQKVSelfAttention(SelfAttention):
    """megatron-core's ``SelfAttention`` with split, q/k norm and RoPE in one compiled kernel.

    Built like ``SelfAttention`` (same submodules, parameters and state-dict keys, so
    checkpoints are interchangeable). :meth:`forward` runs ``linear_qkv``,
    :func:`qkv_norm_rope`, ``core_attention`` (checkpointed under selective recompute, as
    megatron does) and ``linear_proj``; whenever :meth:`fast_path_reason` names a reason,
    megatron-core's ``SelfAttention.forward`` runs instead.
    """

    def fast_path_reason(
        self,
        hidden_states: Tensor,
        key_value_states: Optional[Tensor],
        inference_context,
        rotary_pos_emb,
        rotary_pos_cos,
        rotary_pos_sin,
        packed_seq_params,
    ) -> Optional[str]:
        """Why this call cannot take the fused path (``None``: it can)."""
        cfg = self.config
        if REQUIRE_CUDA and not hidden_states.is_cuda:
            return "not a CUDA tensor"
        if key_value_states is not None or inference_context is not None:
            return "cross attention or inference"
        if packed_seq_params is not None:
            return "packed sequences"
        if rotary_pos_cos is not None or rotary_pos_sin is not None:
            return "precomputed RoPE cos/sin"
        if cfg.attention_output_gate or cfg.test_mode or cfg.flash_decode:
            return "output gate, test mode or flash decode"
        if cfg.num_query_groups is None or cfg.num_query_groups < self.world_size:
            return "fewer query groups than tensor-parallel ranks"
        if cfg.no_rope_freq or cfg.rotary_interleaved or cfg.multi_latent_attention:
            return "no_rope_freq, interleaved RoPE or MLA"
        if getattr(cfg, "yarn_rotary_scaling_factor", None) is not None:
            return "YaRN (mscale)"
        if any(getattr(self, name, False) for name in ("offload_qkv_linear", "offload_core_attention", "offload_attn_proj")):
            return "activation offloading"
        for norm in (self.q_layernorm, self.k_layernorm):
            if not _rms_weight_eps(norm)[0]:
                return "q/k norm is not RMSNorm"
        if rotary_pos_emb is not None:
            freqs = rotary_pos_emb[0] if isinstance(rotary_pos_emb, tuple) else rotary_pos_emb
            if isinstance(rotary_pos_emb, tuple) and rotary_pos_emb[1] is not rotary_pos_emb[0]:
                return "different query and key RoPE"
            if freqs is None or freqs.dim() != 4 or freqs.shape[-1] != self.hidden_size_per_attention_head:
                return "partial rotary dimension"
        return None

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor,
        key_value_states: Optional[Tensor] = None,
        inference_context=None,
        rotary_pos_emb=None,
        rotary_pos_cos: Optional[Tensor] = None,
        rotary_pos_sin: Optional[Tensor] = None,
        rotary_pos_cos_sin: Optional[Tensor] = None,
        attention_bias: Optional[Tensor] = None,
        packed_seq_params=None,
        sequence_len_offset: Optional[int] = None,
        *,
        inference_params=None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """``[sq, b, h]`` hidden states -> ``([sq, b, h] output, bias)``, as ``SelfAttention``."""
        reason = self.fast_path_reason(
            hidden_states, key_value_states, inference_context or inference_params,
            rotary_pos_emb, rotary_pos_cos, rotary_pos_sin, packed_seq_params,
        )
        if reason is not None or rotary_pos_cos_sin is not None:
            return super().forward(
                hidden_states, attention_mask, key_value_states=key_value_states,
                inference_context=inference_context, rotary_pos_emb=rotary_pos_emb,
                rotary_pos_cos=rotary_pos_cos, rotary_pos_sin=rotary_pos_sin,
                rotary_pos_cos_sin=rotary_pos_cos_sin, attention_bias=attention_bias,
                packed_seq_params=packed_seq_params, sequence_len_offset=sequence_len_offset,
                inference_params=inference_params,
            )
        freqs = rotary_pos_emb[0] if isinstance(rotary_pos_emb, tuple) else rotary_pos_emb
        _, q_weight, q_eps = _rms_weight_eps(self.q_layernorm)
        _, k_weight, k_eps = _rms_weight_eps(self.k_layernorm)
        mixed_qkv, _ = self.linear_qkv(hidden_states)
        groups = self.num_query_groups_per_partition
        query, key, value = qkv_norm_rope(
            mixed_qkv, q_weight, k_weight, freqs, groups,
            self.num_attention_heads_per_partition // groups,
            self.hidden_size_per_attention_head, q_eps, k_eps,
        )
        if self.checkpoint_core_attention and self.training:
            core_attn_out = self._checkpointed_attention_forward(
                query, key, value, attention_mask, attn_mask_type=self.attn_mask_type,
                attention_bias=attention_bias, packed_seq_params=None,
            )
        else:
            core_attn_out = self.core_attention(
                query, key, value, attention_mask, attn_mask_type=self.attn_mask_type,
                attention_bias=attention_bias, packed_seq_params=None,
            )
        return self.linear_proj(core_attn_out)
