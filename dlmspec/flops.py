"""Model FLOPs per token: the numerator of MFU, from plain model dimensions.

Counting rules (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", sec. 5.1 / appendix; Chowdhery et al. 2022, PaLM, appendix B for
MFU):

* a GEMM of ``[m, k] x [k, n]`` is ``2*m*n*k`` FLOPs forward; backward computes the input and
  the weight gradients, twice the forward, so training is ``3x`` the forward;
* attention's ``Q K^T`` and ``P V`` are ``2 * 2 * a * d`` FLOPs per (query, key) pair, summed
  over the keys a query attends: all ``s`` keys for bidirectional attention (masked
  diffusion), ``s/2`` on average for causal attention (the convention of FlashAttention-2 and
  Megatron-LM's ``num_floating_point_operations`` with causal masking, which flash kernels
  actually skip), and the exact average for block-causal attention;
* MoE layers count the router (``2*h*E``) and ``topk`` routed experts plus the shared expert
  per token (active parameters, not all experts);
* the logits GEMM ``2*h*V`` (padded vocabulary) is counted; norms, activations, softmax and
  the loss are element-wise and not counted (memory-bound; :mod:`dlmspec.plan.time` times them
  from their bytes).

:func:`model_flops_per_token` is the single definition of MFU's numerator for the planner
(:mod:`dlmspec.plan.compute`), the runtime (``backends/megatron/metrics.py``) and the benchmarks;
:func:`model_flops_per_data_token` is the same count per data token for an objective whose model
input is longer than its data (block diffusion's ``x_t (+) x_0``), which the runtime logs.
This module imports nothing but the standard library (no pydantic), so the GPU machine, which
has neither pydantic nor the spec models, imports it too.
"""

from __future__ import annotations


def attended_keys(seq_length: int, attention: str = "bidirectional", block_size: int | None = None) -> float:
    """Average number of keys a query attends to.

    Args:
        seq_length: tokens per sequence ``s``.
        attention: ``"bidirectional"`` (``s``), ``"causal"`` (``s/2``, FlashAttention-2's
            convention) or ``"block_causal"`` (query in block ``j`` attends blocks ``0..j``:
            the exact average of ``min(s, (j+1)*B)`` over queries).
        block_size: ``B`` for block-causal attention.

    Raises:
        ValueError: unknown ``attention`` or a block-causal call without ``block_size >= 1``.
    """
    s = seq_length
    if attention == "bidirectional":
        return float(s)
    if attention == "causal":
        return s / 2
    if attention == "block_causal":
        if not block_size or block_size < 1:
            raise ValueError("block_causal attention needs block_size >= 1")
        B = block_size
        total = 0
        for start in range(0, s, B):
            size = min(B, s - start)
            total += size * min(s, start + B)
        return total / s
    raise ValueError(f"unknown attention {attention!r}: use bidirectional, causal or block_causal")


def forward_flops_per_token(
    num_layers: int,
    hidden_size: int,
    ffn_hidden_size: int,
    num_attention_heads: int,
    num_query_groups: int,
    kv_channels: int,
    vocab_size: int,
    seq_length: int,
    *,
    gated: bool = True,
    attention: str = "bidirectional",
    block_size: int | None = None,
    num_experts: int = 0,
    moe_router_topk: int = 0,
    moe_ffn_hidden_size: int = 0,
    moe_shared_expert_intermediate_size: int = 0,
    num_moe_layers: int = 0,
    keys: float | None = None,
) -> dict[str, float]:
    """Forward FLOPs per token, by part (see the module docstring for the rules).

    Returns:
        ``{"attention_linear", "attention_core", "mlp", "moe", "logits"}`` summed over layers:
        ``attention_linear`` = ``L * 2*h*(a + 2g)*d`` (linear_qkv) ``+ L * 2*a*d*h``
        (linear_proj); ``attention_core`` = ``L * 4*a*d*keys``; ``mlp`` = dense layers' ``2*h*f``
        per GEMM (three GEMMs when gated); ``moe`` = MoE layers' router, ``topk`` experts and
        shared expert; ``logits`` = ``2*h*V``. ``keys`` (optional) replaces
        :func:`attended_keys` where an objective's own mask sets the keys per query (block
        diffusion's ``x_t (+) x_0``).
    """
    h, a, g, d = hidden_size, num_attention_heads, num_query_groups, kv_channels
    mult = 3 if gated else 2
    dense_layers = num_layers - num_moe_layers
    if keys is None:
        keys = attended_keys(seq_length, attention, block_size)
    moe = 0.0
    if num_moe_layers:
        per = 2 * h * num_experts + moe_router_topk * mult * 2 * h * moe_ffn_hidden_size
        per += mult * 2 * h * moe_shared_expert_intermediate_size
        moe = num_moe_layers * per
    return {
        "attention_linear": float(num_layers * (2 * h * (a + 2 * g) * d + 2 * a * d * h)),
        "attention_core": num_layers * 4 * a * d * keys,
        "mlp": float(dense_layers * mult * 2 * h * ffn_hidden_size),
        "moe": float(moe),
        "logits": float(2 * h * vocab_size),
    }


def model_flops_per_token(
    num_layers: int,
    hidden_size: int,
    ffn_hidden_size: int,
    num_attention_heads: int,
    num_query_groups: int,
    kv_channels: int,
    vocab_size: int,
    seq_length: int,
    *,
    gated: bool = True,
    attention: str = "bidirectional",
    block_size: int | None = None,
    num_experts: int = 0,
    moe_router_topk: int = 0,
    moe_ffn_hidden_size: int = 0,
    moe_shared_expert_intermediate_size: int = 0,
    num_moe_layers: int = 0,
) -> float:
    """Model FLOPs of one training token (forward + backward = 3x forward), without
    recomputation: the numerator of MFU.

    ``MFU = model_flops_per_token * tokens_per_second / (num_gpus * peak_flops)``; tokens are
    every input position (``global_batch_size * seq_length`` per step, for masked diffusion as
    for AR: every position runs through the network).

    Args:
        num_layers, hidden_size, ffn_hidden_size: ``L, h, f``.
        num_attention_heads, num_query_groups, kv_channels: ``a, g, d`` (GQA: ``g < a``).
        vocab_size: the padded vocabulary the output layer has (Megatron's
            ``padded_vocab_size``).
        seq_length: ``s``, for the attention term.
        gated: SwiGLU/GeGLU MLP (fc1 is ``[2f, h]``).
        attention: ``bidirectional`` (masked diffusion), ``causal`` (AR) or ``block_causal``.
        block_size: block length for ``block_causal``.
        num_experts, moe_router_topk, moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size, num_moe_layers: MoE sizes (0 = dense).

    Returns:
        FLOPs per token (a float: causal and block-causal attention average fractional keys).

    Example (dense, bidirectional): ``3 * (L*(2h(a+2g)d + 2adh + 4ads + 3*2hf) + 2hV)``.
    """
    parts = forward_flops_per_token(
        num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups, kv_channels,
        vocab_size, seq_length, gated=gated, attention=attention, block_size=block_size,
        num_experts=num_experts, moe_router_topk=moe_router_topk, moe_ffn_hidden_size=moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=moe_shared_expert_intermediate_size, num_moe_layers=num_moe_layers,
    )
    return 3 * sum(parts.values())


def model_flops_per_data_token(
    num_layers: int,
    hidden_size: int,
    ffn_hidden_size: int,
    num_attention_heads: int,
    num_query_groups: int,
    kv_channels: int,
    vocab_size: int,
    seq_length: int,
    *,
    extra_seq_length: int = 0,
    keys: float | None = None,
    output_length: int | None = None,
    gated: bool = True,
    attention: str = "bidirectional",
    block_size: int | None = None,
    num_experts: int = 0,
    moe_router_topk: int = 0,
    moe_ffn_hidden_size: int = 0,
    moe_shared_expert_intermediate_size: int = 0,
    num_moe_layers: int = 0,
) -> float:
    """Model FLOPs of a training step per data token, for an objective whose model input is longer
    than its data: MFU's numerator when tokens/s counts the data (``global_batch * seq_length``
    per step), and the ``C = flops_per_token * tokens`` of a scaling fit.

    Each sequence of ``seq_length = L`` data tokens runs ``n = L + extra_seq_length`` positions
    through the decoder (block diffusion's ``x_t (+) x_0``: ``n = 2 L``), each query attending
    ``keys`` keys (the objective's mask; default :func:`attended_keys` of ``n`` under
    ``attention``), and ``output_length`` rows (default ``n``) through the output layer (block
    diffusion without an AR loss: the ``L`` rows of ``x_t``). With the parts of
    :func:`forward_flops_per_token` at ``n`` positions:

    ``3 * (n * (attention_linear + attention_core + mlp + moe) + output_length * logits) / L``

    the planner's count of the same step (:func:`dlmspec.plan.compute.step_flops`:
    ``model_per_step / (global_batch * L)``). With no extra positions it is
    :func:`model_flops_per_token`.

    Example: the demo BD3-LM model (``L = 512``, blocks of 16, no AR loss): ``n = 1024``, ``keys =
    (L + B) / 2 = 264``, the logits on 512 rows.

    Raises:
        ValueError: ``seq_length < 1``, ``extra_seq_length < 0``, or an ``output_length`` outside
            ``1 .. n``; as :func:`attended_keys` for ``attention`` / ``block_size``.
    """
    if seq_length < 1 or extra_seq_length < 0:
        raise ValueError(f"seq_length must be >= 1 and extra_seq_length >= 0, got {seq_length}, {extra_seq_length}")
    n = seq_length + extra_seq_length
    rows = n if output_length is None else output_length
    if not 1 <= rows <= n:
        raise ValueError(f"output_length must lie in 1 .. {n} (the input positions), got {output_length}")
    parts = forward_flops_per_token(
        num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups, kv_channels,
        vocab_size, n, gated=gated, attention=attention, block_size=block_size,
        num_experts=num_experts, moe_router_topk=moe_router_topk, moe_ffn_hidden_size=moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=moe_shared_expert_intermediate_size, num_moe_layers=num_moe_layers,
        keys=keys,
    )
    decoder = sum(v for k, v in parts.items() if k != "logits")
    return 3 * (n * decoder + rows * parts["logits"]) / seq_length
