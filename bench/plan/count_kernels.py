"""Count the kernels one microbatch launches on the local layer path (the planner's
``KERNELS_PER_*`` constants in :mod:`dlmspec.plan.launches`).

Builds megatron-core GPT models with this project's local layer spec
(``backends/megatron/layers.py``) on CPU in a one-process gloo world, as
``tests/integration/plan/test_plan_saved_tensors.py`` does, and counts every ATen operator a forward and a
backward pass dispatch (``TorchDispatchMode``), leaving out operators that launch no CUDA kernel
(views, reshapes, allocations, metadata). Differences between this CPU run and the CUDA run are
emulated so that the count is the CUDA one:

* RMSNorm runs CUDA's fused ``_fused_rms_norm`` (1 kernel forward, 2 backward: input and weight
  gradients) where PyTorch's CPU build runs a composite of five operators;
* megatron's ``bias_swiglu_impl`` and the experts' ``weighted_bias_swiglu_impl`` are
  ``torch.compile``'d on CUDA (``megatron.core.jit``): one fused kernel forward, one backward;
* SDPA takes the flash kernel: 1 kernel forward, 3 backward (``dot(dO, O)``, the backward
  kernel, the dq conversion);
* the local path accumulates each weight's bf16 gradient into the fp32 ``main_grad`` in a DDP
  hook (``gradient_accumulation_fusion=False``): one ``add_`` per parameter per microbatch
  (no DDP wrapper here, so they are added by count).

The MoE layer is megatron-core's ``MoELayer`` with the ``alltoall`` dispatcher and
``SequentialMLP`` experts at expert-parallel size 1 (the dispatcher's CUDA side streams are
stubbed; at ``ep > 1`` it adds the all-gather and four all-to-alls, which the time model counts
as collectives). Differences of models with 1 and 2 layers, and of MoE layers with 2 and 4
experts, give the per-layer and per-expert counts; what a 1-layer model launches besides its
layer is the per-microbatch count (embedding, final norm, output layer, cross entropy), to which
the MDM objective's preparation and the loss (``backends/megatron/objective.py``) are added.

Run: ``.venv/bin/python bench/plan/count_kernels.py`` (needs torch and megatron-core; CPU only,
a few seconds). The counts are printed as JSON; ``dlmspec.plan.launches`` holds them rounded.
"""

from __future__ import annotations

import collections
import contextlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils._mode_utils import no_dispatch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

#: Operators that launch no kernel on CUDA (views, metadata, allocations without a fill).
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "as_strided", "t", "transpose", "permute", "expand", "detach", "alias",
    "slice", "select", "split", "split_with_sizes", "unsqueeze", "squeeze", "_reshape_alias", "unbind", "chunk",
    "narrow", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "is_same_size",
    "size", "stride", "numel", "dim", "sym_size", "sym_stride", "sym_numel", "resolve_conj", "resolve_neg",
    "_local_scalar_dense", "set_", "view_as", "flatten", "_has_compatible_shallow_copy_type", "unflatten",
}


class Counter(TorchDispatchMode):
    """Counts kernel-launching ATen operators; ``extra`` takes emulated fused kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def add(self, name: str, n: int) -> None:
        self.ops[name] += n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


ACTIVE: list[Counter] = []


def _fused(name: str, n: int, fn):
    """``fn`` counted as ``n`` kernels (what CUDA's fused kernel launches), its insides not counted."""

    while hasattr(fn, "_torchdynamo_orig_callable"):  # the eager function behind torch.compile
        fn = fn._torchdynamo_orig_callable

    def wrapper(*args, **kwargs):
        if ACTIVE:
            ACTIVE[-1].add(name, n)
        with no_dispatch():
            return fn(*args, **kwargs)

    return wrapper


class _FusedRMSNorm(torch.autograd.Function):
    """CUDA's ``_fused_rms_norm`` on CPU: saves what it saves (the input, fp32 rstd, the weight)
    and counts one kernel forward, two backward (also used by tests/integration/plan/test_plan_saved_tensors.py)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        if ACTIVE:
            ACTIVE[-1].add("fused_rms_norm", 1)
        with no_dispatch():
            xf = x.float()
            rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            ctx.save_for_backward(x, rstd, weight)
            out = (xf * rstd).to(x.dtype)
            return out * weight if weight is not None else out

    @staticmethod
    def backward(ctx, grad):
        if ACTIVE:
            ACTIVE[-1].add("fused_rms_norm_backward", 2)
        x, rstd, weight = ctx.saved_tensors
        with no_dispatch():
            g = grad * weight if weight is not None else grad
            xhat = x.float() * rstd
            dx = (rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))).to(x.dtype)
            dw = (grad * xhat).sum(dim=tuple(range(grad.dim() - 1))).to(weight.dtype) if weight is not None else None
        return dx, dw, None


def _rms_norm(x, normalized_shape, weight=None, eps=None):
    return _FusedRMSNorm.apply(x, weight, 1e-6 if eps is None else eps)


class _Stream:
    """Stand-in for torch.cuda.Stream/Event on CPU (the MoE dispatcher's D2H side stream)."""

    def wait_stream(self, other):
        """Nothing to wait for: one stream on CPU."""

    def record_event(self, *args):
        return self

    def synchronize(self):
        """Nothing to wait for: one stream on CPU."""

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


@contextlib.contextmanager
def cpu_megatron():
    from megatron.core import parallel_state
    from megatron.core.fusions import fused_bias_swiglu
    from megatron.core.tensor_parallel import random as mcore_random

    store = Path(tempfile.mkdtemp()) / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    stream = _Stream()
    patches = [
        (torch.cuda, "current_device", lambda: "cpu"),
        (torch.cuda, "Stream", lambda *a, **k: stream),
        (torch.cuda, "current_stream", lambda *a, **k: stream),
        (torch.cuda, "stream", lambda *a, **k: contextlib.nullcontext()),
        (F, "rms_norm", _rms_norm),
        (fused_bias_swiglu, "swiglu", _fused("fused_swiglu", 1, fused_bias_swiglu.swiglu)),
        (fused_bias_swiglu, "swiglu_back", _fused("fused_swiglu_back", 1, fused_bias_swiglu.swiglu_back)),
        (fused_bias_swiglu, "weighted_swiglu", _fused("fused_swiglu", 1, fused_bias_swiglu.weighted_swiglu)),
        (fused_bias_swiglu, "weighted_swiglu_back",
         _fused("fused_swiglu_back", 1, fused_bias_swiglu.weighted_swiglu_back)),
        (F, "scaled_dot_product_attention", None),
        # recomputation saves and restores the CUDA RNG state: the CPU one here (no kernels)
        (mcore_random, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state()),
        (mcore_random, "_set_cuda_rng_state", lambda *a, **k: None),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    sdpa = F.scaled_dot_product_attention
    try:
        for obj, name, value in patches:
            if name == "scaled_dot_product_attention":
                value = _sdpa(sdpa)
            setattr(obj, name, value)
        parallel_state.initialize_model_parallel(1, 1)
        torch.manual_seed(0)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        for obj, name, value in saved:
            setattr(obj, name, value)
        dist.destroy_process_group()


class _SDPA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, q, k, v, kwargs):
        if ACTIVE:
            ACTIVE[-1].add("flash_attention", 1)
        with torch.enable_grad(), no_dispatch():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            out = fn(qq, kk, vv, **kwargs)
        ctx.save_for_backward(qq, kk, vv, out)
        return out.detach()

    @staticmethod
    def backward(ctx, grad):
        if ACTIVE:
            ACTIVE[-1].add("flash_attention_backward", 3)
        qq, kk, vv, out = ctx.saved_tensors
        with no_dispatch():
            dq, dk, dv = torch.autograd.grad(out, (qq, kk, vv), grad)
        return None, dq, dk, dv, None


def _sdpa(fn):
    def wrapper(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        kwargs = dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return _SDPA.apply(fn, q, k, v, kwargs)

    return wrapper


def build(layers: int, experts: int | None = None, recompute: str | None = None, position: str = "rope"):
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.layers import build_layer_spec, build_model

    kw: dict = {}
    if experts:
        kw.update(num_moe_experts=experts, moe_router_topk=2, moe_ffn_hidden_size=64,
                  moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False)
    if recompute == "selective":
        kw.update(recompute_granularity="selective")
    config = TransformerConfig(
        num_layers=layers, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
        kv_channels=16, normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, qk_layernorm=True, hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, bf16=False, params_dtype=torch.float32,
        bias_activation_fusion=True, bias_dropout_fusion=True, masked_softmax_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, calculate_per_token_loss=True, **kw,
    )
    spec = build_layer_spec(attention="bidirectional", qk_layernorm=True, use_transformer_engine=False,
                            num_experts=experts, moe_grouped_gemm=False)
    return build_model(config, layer_spec=spec, vocab_size=256, max_sequence_length=64,
                       position_embedding_type=position, rotary_base=10000, ddp_config=None)[0]


def count(model) -> tuple[int, int]:
    """(forward, backward) kernels of one microbatch, with the main_grad accumulation hooks."""
    tokens = torch.randint(0, 256, (2, 64))
    positions = torch.arange(64).expand(2, 64)
    model(tokens, positions, None, labels=tokens).float().sum().backward()  # warm-up
    model.zero_grad(set_to_none=True)
    fwd, bwd = Counter(), Counter()
    ACTIVE.append(fwd)
    with fwd:
        loss = model(tokens, positions, None, labels=tokens).float().sum()
    ACTIVE[-1] = bwd
    with bwd:
        loss.backward()
    ACTIVE.pop()
    grads = sum(1 for p in model.parameters() if p.requires_grad)
    return fwd.total, bwd.total + grads


def objective_kernels() -> int:
    """Kernels of the MDM objective's preparation and loss reduction per microbatch."""
    from dlmspec.backends.megatron.objective import build_objective, reduce_loss

    objective = build_objective("mdm", mask_token_id=255, eps=1e-3, variable_length_prob=0.0)
    tokens = torch.randint(0, 255, (2, 64))
    gen = torch.Generator().manual_seed(0)
    c = Counter()
    with c:
        ob = objective.prepare({"tokens": tokens}, gen)
        per_token = torch.rand(2, 64, requires_grad=True)
        loss, _, _ = reduce_loss(per_token, ob)
    with c:
        loss.backward()
    return c.total + 4  # + the four host-to-device copies of the batch (tokens, labels, loss mask, positions)


def main() -> int:
    with cpu_megatron():
        one, two = count(build(1)), count(build(2))
        sel1, sel2 = count(build(1, recompute="selective")), count(build(2, recompute="selective"))
        moe2 = [count(build(1, experts=e)) for e in (2, 4)]
        moe2b = [count(build(2, experts=e)) for e in (2, 4)]
        objective = objective_kernels()
        # megatron-core's unfused RoPE (apply_rope_fusion=False): what a layer launches with
        # rotary embeddings beyond the same layer without (learned absolute positions).
        nope1, nope2 = count(build(1, position="learned_absolute")), count(build(2, position="learned_absolute"))
    dense = (two[0] - one[0], two[1] - one[1])
    moe_layer = {e: (b[0] - a[0], b[1] - a[1]) for e, a, b in zip((2, 4), moe2, moe2b)}
    per_expert = tuple((moe_layer[4][i] - moe_layer[2][i]) / 2 for i in range(2))
    moe_fixed = tuple(moe_layer[2][i] - 2 * per_expert[i] for i in range(2))
    out = {
        "dense_layer": {"forward": dense[0], "backward": dense[1]},
        "selective_core_attn_extra_per_layer": (sel2[0] + sel2[1] - sel1[0] - sel1[1]) - sum(dense),
        "moe_layer_without_experts": {"forward": moe_fixed[0], "backward": moe_fixed[1]},
        "per_local_expert": {"forward": per_expert[0], "backward": per_expert[1]},
        "unfused_rope_per_layer": {"forward": dense[0] - (nope2[0] - nope1[0]),
                                   "backward": dense[1] - (nope2[1] - nope1[1])},
        "per_microbatch_outside_layers": {"model": one[0] + one[1] - sum(dense), "objective_and_loss": objective},
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
