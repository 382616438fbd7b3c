"""The output layer and cross entropy fused, on the positions that carry loss only.

:func:`defer_output_projection` makes a model chunk's output layer hand back the final hidden
states; :func:`linear_cross_entropy` computes ``sum_i w_i * CE(h_i W^T, y_i)`` over the rows with a
non-zero loss weight, in chunks of rows (Liger Kernel when it imports, else
:class:`ChunkedLinearCrossEntropy`), never holding the ``[s, b, V]`` logits. Tensor-parallel
size 1 only. Why, and the sources: docs/runtime.md, "Fused output layer and cross entropy".
"""

from __future__ import annotations

import importlib.util
import types
from typing import Optional, Tuple

import torch
from torch import Tensor

#: Cross-entropy implementations the runtime accepts (``KernelConfig.cross_entropy``).
CROSS_ENTROPY_IMPLS = ("megatron", "fused_linear")
#: Backends of the fused linear cross entropy.
FUSED_LINEAR_IMPLS = ("auto", "liger", "torch")
#: Rows per chunk of :class:`ChunkedLinearCrossEntropy` (4096 x 151936 fp32 = 2.5 GB).
DEFAULT_CHUNK_ROWS = 4096


def liger_available() -> bool:
    """True when Liger Kernel's fused linear cross entropy can be imported (needs Triton)."""
    if importlib.util.find_spec("liger_kernel") is None:
        return False
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # noqa: F401
    except Exception:  # a broken or CPU-only install counts as absent
        return False
    return True


def resolve_fused_linear_impl(impl: str, device: torch.device) -> str:
    """``"liger"`` or ``"torch"`` for ``impl`` on ``device``.

    ``"auto"`` picks Liger on CUDA when it imports, else the PyTorch implementation.

    Raises:
        ValueError: For an unknown ``impl``, or ``"liger"`` when it is absent or off CUDA.
    """
    if impl not in FUSED_LINEAR_IMPLS:
        raise ValueError(f"fused linear cross entropy impl must be one of {FUSED_LINEAR_IMPLS}, got {impl!r}")
    usable = device.type == "cuda" and liger_available()
    if impl == "auto":
        return "liger" if usable else "torch"
    if impl == "liger" and not usable:
        raise ValueError("fused_linear_impl='liger' needs liger-kernel (and Triton) on a CUDA device")
    return impl


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """``sum_i w_i * CE(x_i W^T, y_i)`` in row chunks; gradients computed in the forward.

    Forward, per chunk of ``C`` rows: ``z = x_c W^T`` in the input dtype, then in fp32
    ``lse = logsumexp(z)``, ``CE = lse - z[y]``, and the gradient of the weighted sum with
    respect to the logits, ``g = w * (softmax(z) - onehot(y))``, which gives
    ``dx_c = g W`` and ``dW += g^T x_c`` (fp32 accumulator). Backward only scales the stored
    gradients by the incoming scalar. Peak extra memory: one chunk's ``C x V`` logits in fp32
    plus ``dW`` in fp32 (``V x h x 4`` bytes) and ``dx`` (``N x h``).

    Args (to ``apply``):
        x: ``[N, h]`` rows (bf16/fp16/fp32).
        weight: ``[V, h]`` output projection (same dtype as ``x``).
        labels: ``[N]`` int64 targets in ``[0, V)``.
        token_weights: ``[N]`` fp32 loss weights.
        chunk_rows: Rows per chunk.

    Returns:
        fp32 scalar ``sum_i w_i CE_i``.
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, labels: Tensor, token_weights: Tensor, chunk_rows: int) -> Tensor:
        n = x.shape[0]
        grad_x = torch.empty_like(x) if x.requires_grad else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if weight.requires_grad else None
        total = torch.zeros((), dtype=torch.float32, device=x.device)
        for start in range(0, n, chunk_rows):
            end = min(start + chunk_rows, n)
            xc, yc = x[start:end], labels[start:end]
            wc = token_weights[start:end].to(torch.float32)
            logits = (xc @ weight.t()).float()  # [C, V]
            lse = torch.logsumexp(logits, dim=-1)
            target = logits.gather(1, yc.unsqueeze(1)).squeeze(1)
            total += ((lse - target) * wc).sum()
            if grad_x is None and grad_w is None:
                continue
            # d(sum w CE)/dz = w * (softmax(z) - onehot(y)), computed in place on the logits
            logits.sub_(lse.unsqueeze(1)).exp_()
            logits.scatter_add_(1, yc.unsqueeze(1), torch.full_like(target, -1.0).unsqueeze(1))
            logits.mul_(wc.unsqueeze(1))
            g = logits.to(x.dtype)
            if grad_x is not None:
                grad_x[start:end] = g @ weight
            if grad_w is not None:
                grad_w.add_(g.t() @ xc)  # bf16 GEMM, fp32 accumulation (as megatron's main_grad)
        ctx.save_for_backward(grad_x if grad_x is not None else torch.empty(0), grad_w if grad_w is not None else torch.empty(0))
        ctx.has = (grad_x is not None, grad_w is not None)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        grad_x, grad_w = ctx.saved_tensors
        has_x, has_w = ctx.has
        dx = (grad_x * grad_output.to(grad_x.dtype)) if has_x else None
        dw = (grad_w * grad_output).to(ctx.weight_dtype) if has_w else None
        return dx, dw, None, None, None


def _liger_weighted_sum(x: Tensor, weight: Tensor, labels: Tensor, token_weights: Tensor) -> Tensor:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    per_token = liger_fused_linear_cross_entropy(x, weight, labels, reduction="none")
    return (per_token.float() * token_weights.float()).sum()


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    labels: Tensor,
    loss_weights: Tensor,
    *,
    impl: str = "torch",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> Tensor:
    """Weighted cross entropy of the output projection, on rows with a non-zero weight only.

    Args:
        hidden: ``[b, s, h]`` final hidden states (any float dtype; cast to ``weight``'s).
        weight: ``[V, h]`` output projection (the output layer's or the tied embedding's).
        labels: ``[b, s]`` int targets.
        loss_weights: ``[b, s]`` fp32 weights; rows with weight 0 are skipped entirely.
        impl: ``"liger"`` or ``"torch"`` (see :func:`resolve_fused_linear_impl`).
        chunk_rows: Rows per chunk of the PyTorch implementation.

    Returns:
        fp32 scalar ``sum_{b,s} loss_weights * CE`` (nats), differentiable with respect to
        ``hidden`` and ``weight``.

    Raises:
        ValueError: On mismatched shapes or an unknown ``impl``.
    """
    if hidden.shape[:2] != labels.shape or labels.shape != loss_weights.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)}, labels {tuple(labels.shape)} and loss weights "
            f"{tuple(loss_weights.shape)} must agree on [b, s]"
        )
    if hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(f"hidden size {hidden.shape[-1]} != output weight's {weight.shape[-1]}")
    keep = (loss_weights != 0).reshape(-1).nonzero().squeeze(1)
    x = hidden.reshape(-1, hidden.shape[-1]).index_select(0, keep).to(weight.dtype)
    y = labels.reshape(-1).index_select(0, keep).long()
    w = loss_weights.reshape(-1).index_select(0, keep).float()
    if x.shape[0] == 0:
        return (hidden.sum() * 0.0).float() + (weight.sum() * 0.0).float()  # keeps the graph connected
    if impl == "liger":
        return _liger_weighted_sum(x, weight, y, w)
    if impl == "torch":
        return ChunkedLinearCrossEntropy.apply(x, weight, y, w, chunk_rows)
    raise ValueError(f"impl must be 'liger' or 'torch', got {impl!r}")


def _hidden_passthrough(self, input_: Tensor, weight: Optional[Tensor] = None, runtime_gather_output=None) -> Tuple[Tensor, None]:
    """Replacement ``forward`` of a ``ColumnParallelLinear`` output layer: return the input."""
    del weight, runtime_gather_output
    return input_, None


def defer_output_projection(model_chunk: torch.nn.Module) -> Optional[Tensor]:
    """Make ``model_chunk`` return final hidden states; return the output projection weight.

    ``model_chunk`` is a ``GPTModel`` (possibly wrapped in DDP / ``Float16Module``). On the
    last pipeline stage (``post_process``) the output layer's ``forward`` is replaced on that
    instance by one that returns its input, so ``GPTModel.forward(..., labels=None)`` returns
    ``[b, s, h]`` hidden states (``Float16Module`` casts them to fp32). The weight to project
    with is returned: the tied input embedding when ``share_embeddings_and_output_weights``,
    else ``output_layer.weight``. Other stages are left alone (``None`` is returned).

    Raises:
        ValueError: If the output layer is split over tensor-parallel ranks.
    """
    from megatron.core.utils import unwrap_model

    model = unwrap_model(model_chunk)
    if not getattr(model, "post_process", False):
        return None
    layer = model.output_layer
    if getattr(layer, "output_size_per_partition", None) != getattr(layer, "output_size", None):
        raise ValueError("the fused linear cross entropy needs tensor_model_parallel_size=1")
    layer.forward = types.MethodType(_hidden_passthrough, layer)
    if model.share_embeddings_and_output_weights:
        return model.shared_embedding_or_output_weight()
    return layer.weight
