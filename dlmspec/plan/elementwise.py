"""Bytes the memory-bound work of a training step reads and writes: the element-wise kernels of a
microbatch (norms, residual adds, RoPE, activations, MoE permutes, cross entropy, the local path's
gradient accumulation) and the optimizer's pass over its parameters.
:mod:`dlmspec.plan.time` divides them by the HBM bandwidth.

The bytes are counted per kernel from its operands; the effective-bytes factors of the small
kernels around attention are measured (``bench/results/throughput_qwen3_1.7b_h200_reference_vs_hf_repeat.json``;
how, in docs/planner-methods.md, *Time model*).
"""

from __future__ import annotations

from dlmspec.plan.memory import expert_tokens, linear_params
from dlmspec.plan.shape import DTYPE_BYTES, Layout, ModelShape, input_length, norms_compiled, output_rows, qkv_fused

#: Effective-bytes factors of the small element-wise kernels around attention on the local path:
#: how many times their counted bytes (reads + writes) they take at the HBM bandwidth. Measured on
#: Qwen3-1.7B: ``bench/results/throughput_qwen3_1.7b_h200_reference_vs_hf_repeat.json``
#: (``profile_mb10_one_microbatch``) and ``bench/results/profile_h200x2_2026-11-30.json``; the
#: derivation is in docs/planner-methods.md (*Time model*). The rest of the element-wise bytes stays at
#: factor 1 (``Calibration.memory_efficiency`` is fitted on top); Transformer Engine fuses its
#: norms into the GEMMs: no factor there, but RoPE keeps its two.
ELEMENTWISE_BYTES_FACTOR = {"norm": 3.7, "copies": 3.7, "rope_fused": 4.1, "rope_unfused": 6.0, "compiled": 3.2}
#: Elements per q/k/v channel pass of the copies and ``cat`` that qkv_fusion removes, per token:
#: the query's reshape copy (read + write ``a d``) and its gradient's copy (``a d`` again), the
#: value's contiguous copy (``g d``), the ``cat`` of the gradients (``(a + 2g) d`` read and written):
#: ``(6a + 6g) d``, as a multiple of ``(a + g) d``.
QKV_COPY_ELEMENTS = 6
#: Element passes of the fused QKV function per q/k/v channel and token: forward reads the
#: projection and writes q, k, v; backward reads their gradients and the saved projection and
#: writes the projection's gradient: 5 x ``(a + 2g) d``.
QKV_FUSED_PASSES = 5
#: Element-wise bytes per q/k element of RoPE, forward + backward (y = 2): unfused, its eight-odd
#: kernels read and write the tensor several times (12 bytes per element counted); fused, one
#: read and one write forward and backward (4).
ROPE_BYTES_PER_ELEMENT = {False: 12, True: 4}

#: Bytes the cross entropy reads and writes per logit element (megatron-core
#: ``vocab_parallel_cross_entropy``): forward ``.float()`` 2+4, max 4, subtract 4+4, exp 4+4,
#: sum 4, normalise 4+4; backward scale 4+4, cast to bf16 4+2.
CE_BYTES_PER_LOGIT = 52
#: The fused linear cross entropy (``[kernels] cross_entropy = "fused_linear"``,
#: ``backends/megatron/output_loss.py``) projects only the rows that carry loss: each objective
#: registers that share (``dlmspec.objectives``, read as ``ModelShape.loss_row_fraction``): MDM
#: masks each token with probability ``1 - alpha(t)``, half of them on average for the linear
#: schedule; AR all of them.
#: Its output-layer GEMM passes per projected row (``2 h V`` FLOPs each): Liger with per-token
#: weights computes the logits again in backward (forward, recomputed forward, two gradients:
#: 4), the PyTorch chunks compute the gradients in the forward pass (3).
FUSED_CE_GEMM_PASSES = {"liger": 4, "torch": 3}
#: Bytes per logit element: Liger's one Triton kernel reads the bf16 chunk and writes the
#: gradient in place, twice (forward and recompute): 8; the PyTorch chunks' fp32 passes
#: (``.float()``, ``logsumexp`` and its temporary, ``exp_``, ``scatter_add_``, ``mul_``, the bf16
#: cast): about 34.
FUSED_CE_BYTES_PER_LOGIT = {"liger": 8, "torch": 34}

#: Optimizer bytes per owned parameter and step: fused Adam reads master, grad, m, v and
#: writes master, m, v (4 bytes each) and the bf16 parameter (2): 30. torch's foreach AdamW makes
#: ~9 passes (lerp, mul, addcmul, sqrt, div, add, addcdiv, weight decay, copy): ~86.
OPTIMIZER_BYTES = {"transformer_engine": 30, "local+sdpa": 86}


def elementwise_bytes(shape: ModelShape, lay: Layout, stage: int, counts: tuple[int, int]) -> float:
    """Bytes the element-wise kernels of one microbatch read and write on rank ``stage``
    (forward + backward), counted per kernel as reads + writes of its operands:
    RMSNorm/LayerNorm 5 (forward read/write, backward read x, dy, write dx) per element, two
    per layer; residual adds 6 (two per layer); RoPE 12 (fused: 4, :data:`ROPE_BYTES_PER_ELEMENT`) and
    q/k norm 5 per q/k element; the
    fused SwiGLU 8 (GELU 5) per ``f`` element; dropout 10 per element
    with dropout; MoE permute/unpermute 8 per routed token copy; the local path's weight-
    gradient accumulation into ``main_grad`` (bf16 gradient written and read, fp32 read and
    written: ``2y + 8`` per weight); the embedding's dense gradient (``2y + 8`` per entry); the
    cross entropy :data:`CE_BYTES_PER_LOGIT` per logit, on the rows that reach the output layer
    (:func:`~dlmspec.plan.shape.output_rows`; the fused one's ``(4 + 3y) h`` hidden-state hand-over
    too). The norms, q/k norms, RoPE and the QKV
    copies are :func:`attention_block_bytes` (effective bytes on the local path).
    """
    dense_n, moe_n = counts
    h, a, g, d = shape.hidden, shape.heads, shape.groups, shape.head_dim
    t, r = lay.tp, lay.sequence_divisor
    y = DTYPE_BYTES[lay.dtype]
    T = lay.micro_batch * input_length(shape, lay) / lay.cp
    local = lay.impl != "transformer_engine"
    per_tok = 12 * h * y / r + attention_block_bytes(shape, lay)
    if shape.hidden_dropout > 0:
        per_tok += 20 * h * y / r
    act = 8 if shape.gated else 5
    dense_tok = per_tok + act * shape.ffn * y / t
    layers = dense_n * dense_tok * T
    if moe_n:
        N = expert_tokens(shape, lay)
        moe_bytes = per_tok * T + act * shape.expert_ffn * y / lay.etp * N + 8 * N * h * y
        if shape.shared_ffn:
            moe_bytes += act * shape.shared_ffn * y / t * T
        layers += moe_n * moe_bytes
    total = layers
    if local:
        total += (2 * y + 8) * linear_params(shape, lay, counts)
    V = shape.vocab / t
    out = output_rows(shape, lay)  # rows reaching the output layer (the final norm runs on all T)
    if stage == 0:
        total += 2 * h * y * T + (2 * y + 8) * V * h
    if stage == lay.pp - 1 and lay.fused_linear_ce:
        rows = shape.loss_row_fraction * T
        total += FUSED_CE_BYTES_PER_LOGIT[lay.fused_linear_backend] * rows * V + (4 + 3 * y) * h * out
        if local:
            total += (2 * y + 8) * V * h
    elif stage == lay.pp - 1:
        total += CE_BYTES_PER_LOGIT * out * V + 5 * h * y * T / r * _norm_factor(lay)
        if local:
            total += (2 * y + 8) * V * h
    return total


def _norm_factor(lay: Layout) -> float:
    """Effective-bytes factor of a norm (:data:`ELEMENTWISE_BYTES_FACTOR`): 1 on the TE path."""
    if lay.impl == "transformer_engine":
        return 1.0
    return ELEMENTWISE_BYTES_FACTOR["compiled" if norms_compiled(lay) else "norm"]


def attention_block_bytes(shape: ModelShape, lay: Layout) -> float:
    """Effective element-wise bytes per token of one layer's two norms and its q/k/v handling
    (forward + backward) on this rank: the norms 5 passes of ``h`` each; with the fused QKV
    function (:func:`~dlmspec.plan.shape.qkv_fused`) :data:`QKV_FUSED_PASSES` of ``(a + 2g) d``;
    else the q/k norms (5 passes of ``(a + g) d``), RoPE (:data:`ROPE_BYTES_PER_ELEMENT`) and the
    copies and ``cat`` (:data:`QKV_COPY_ELEMENTS`) - each times its
    :data:`ELEMENTWISE_BYTES_FACTOR` on the local path; on the TE path RoPE keeps its factor, the
    norms and q/k norms have factor 1 and there are no copies."""
    h, a, g, d = shape.hidden, shape.heads, shape.groups, shape.head_dim
    t, r = lay.tp, lay.sequence_divisor
    y = DTYPE_BYTES[lay.dtype]
    qk = (a + g) * d * y / t
    f = ELEMENTWISE_BYTES_FACTOR
    rope = (ROPE_BYTES_PER_ELEMENT[lay.rope_fusion] * qk * f["rope_fused" if lay.rope_fusion else "rope_unfused"]
            if shape.rope else 0.0)
    if lay.impl == "transformer_engine":
        # RoPE keeps its factors on TE: unfused it is the same megatron-core PyTorch kernels as on
        # the local path (fused: TE's kernel, assumed alike; docs/planner-methods.md, "Kernels on TE")
        out = 10 * h * y / r + rope
        if shape.qk_norm:
            out += 5 * qk
        return out
    norm = _norm_factor(lay)
    out = 10 * h * y / r * norm
    if qkv_fused(shape, lay):
        return out + QKV_FUSED_PASSES * (a + 2 * g) * d * y / t * f["compiled"]
    out += rope
    if shape.qk_norm:
        out += 5 * qk * norm
    return out + QKV_COPY_ELEMENTS * qk * f["copies"]
