"""FlexAttention against SDPA: forward + backward time of attention at Qwen3-1.7B's shape.

One command on a GPU machine with PyTorch only (from the repository root)::

    python3 bench/attention/flex_vs_sdpa.py --out bench/results/attention_flex_vs_sdpa_<gpu>.json

Two measurements, each SDPA against FlexAttention (``torch.compile(flex_attention)`` with a
``BlockMask`` of :mod:`backends/megatron/masks.py <dlmspec.backends.megatron.masks>`):

* ``kernel``: the attention call alone, ``q [b, 16, s, 128]``, ``k``/``v [b, 8, s, 128]`` (Qwen3-1.7B:
  16 query heads, 8 key/value groups, head dim 128), bf16, forward and forward + backward.
* ``layer``: one self-attention layer as the local layer spec runs it (fused QKV projection of
  hidden 2048, per-head q/k RMSNorm, attention, output projection), forward + backward.

Masks (``--masks``): ``bidirectional`` (masked diffusion: the default of ``model.attention_backend``
is decided on this one), ``causal``, ``block_causal`` (block 128), ``document`` (four documents
per row: SDPA gets the dense ``[b, 1, s, s]`` mask the data pipeline builds) and
``block_diffusion`` (BD3-LM's x_t ⊕ x_0 mask over ``2 s`` positions, block 128: SDPA dense).
SDPA runs PyTorch's own kernel choice and, for the unmasked bidirectional case, each of
cuDNN, flash and memory-efficient attention pinned (``sdpa_kernel``); a kernel that refuses the
inputs is recorded as such. Before timing, each FlexAttention output is compared with SDPA's
(max abs difference, recorded).

Timing: CUDA events around each call, ``--warmup`` untimed then ``--iters`` timed calls; the
median is reported, with TFLOP/s from the mask's density (forward ``4 b h s^2 d * density``,
backward 2.5 x forward: FlashAttention-2's count). Peak memory per case
(``torch.cuda.max_memory_allocated``). The JSON (``--out``) holds the device, PyTorch version,
shapes and one row per (measurement, mask, backend).

``--dry``: tiny shapes in float32 on the CPU (FlexAttention uncompiled), two iterations: checks
the script end to end (bench/bench_tests/test_attention_flex_vs_sdpa.py), measures nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]


def _load_masks():
    """``backends/megatron/masks.py`` loaded by path (it needs torch and ``dlmspec.attention``
    only, not megatron-core)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location("dlm_bench_masks", ROOT / "backends/megatron/masks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["dlm_bench_masks"] = module
    spec.loader.exec_module(module)
    return module


masks = _load_masks()

#: Qwen3-1.7B's attention (bench/throughput/throughput_common.QWEN3_1_7B).
QWEN3_1_7B = {"hidden": 2048, "heads": 16, "groups": 8, "head_dim": 128}
TINY = {"hidden": 64, "heads": 4, "groups": 2, "head_dim": 16}
MASKS = ("bidirectional", "causal", "block_causal", "document", "block_diffusion")
SDPA_PINNED = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def make_mask(kind: str, b: int, s: int, block: int, device) -> tuple:
    """``(mask_object, query_length)`` of a mask kind: ``block_diffusion`` is over ``2 s``."""
    if kind == "bidirectional":
        return masks.Bidirectional(), s
    if kind == "causal":
        return masks.Causal(), s
    if kind == "block_causal":
        return masks.BlockCausal(block), s
    if kind == "document":
        seg = (torch.arange(s, device=device) * 4 // s).expand(b, s).contiguous()
        return masks.Document(seg), s
    if kind == "block_diffusion":
        return masks.block_diffusion(s, block), 2 * s
    raise ValueError(f"unknown mask {kind!r}; one of {MASKS}")


def density(mask, L: int) -> float:
    """Share of (query, key) pairs the mask attends (its dense form; ``L <= 8192`` only)."""
    if isinstance(mask, masks.Bidirectional):
        return 1.0
    if isinstance(mask, masks.Causal):
        return (L + 1) / (2 * L)
    allowed = mask.allowed(L, L)
    return float(allowed.float().mean())


def flex_call(compiled: bool) -> Callable:
    """FlexAttention: compiled on CUDA; on CPU the operator's eager forward and backward (the
    public function refuses backward on CPU, see attention.flex_attention_eager)."""
    from torch.nn.attention import flex_attention as fa

    if compiled:
        # one compiled graph per mask and shape: more than dynamo's default of 8
        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 64)
        fn = torch.compile(fa.flex_attention, dynamic=False)
        return lambda q, k, v, bm, scale: fn(q, k, v, block_mask=bm, scale=scale, enable_gqa=q.size(1) != k.size(1))
    from torch._higher_order_ops.flex_attention import flex_attention as op

    def eager(q, k, v, bm, scale):
        options = fa._apply_kernel_options(q, k, v, False, None, None)
        return op(q, k, v, fa._identity, bm.as_tuple(), scale, options)[0]

    return eager


def sdpa_call(pinned: Optional[str]) -> Callable:
    """SDPA with PyTorch's kernel order, or one kernel only (``sdpa_kernel``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call(q, k, v, lowered, scale):
        attn_mask, is_causal = lowered
        gqa = q.size(1) != k.size(1)
        if gqa and (attn_mask is not None or pinned == "efficient"):
            rep = q.size(1) // k.size(1)
            k, v, gqa = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), False
        ctx = sdpa_kernel([getattr(SDPBackend, SDPA_PINNED[pinned])]) if pinned else contextlib.nullcontext()
        with ctx:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                                  enable_gqa=gqa)

    return call


def timed(fn: Callable[[], None], warmup: int, iters: int, cuda: bool) -> list[float]:
    """Milliseconds of each of ``iters`` calls after ``warmup`` calls (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return out


class AttentionLayer(torch.nn.Module):
    """The local layer spec's self-attention, torch only: fused QKV projection, per-head q/k
    RMSNorm (Qwen3), attention (``attend``), output projection. ``x [b, s, hidden]``."""

    def __init__(self, dims: dict, attend: Callable, dtype, device):
        super().__init__()
        h, g, d = dims["heads"], dims["groups"], dims["head_dim"]
        self.h, self.g, self.d, self.attend = h, g, d, attend
        self.qkv = torch.nn.Linear(dims["hidden"], (h + 2 * g) * d, bias=False, dtype=dtype, device=device)
        self.q_norm = torch.nn.RMSNorm(d, dtype=dtype, device=device)
        self.k_norm = torch.nn.RMSNorm(d, dtype=dtype, device=device)
        self.proj = torch.nn.Linear(h * d, dims["hidden"], bias=False, dtype=dtype, device=device)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, self.h + 2 * self.g, self.d).split([self.h, self.g, self.g], dim=2)
        q, k = self.q_norm(q), self.k_norm(k)
        out = self.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.proj(out.transpose(1, 2).reshape(b, s, self.h * self.d))


def run(args) -> dict:
    cuda = not args.dry
    if cuda and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --dry for the CPU check")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    dims = QWEN3_1_7B if cuda else TINY
    b, s, block = (args.batch, args.seq, args.block) if cuda else (2, 64, 16)
    warmup, iters = (args.warmup, args.iters) if cuda else (1, 2)
    h, g, d = dims["heads"], dims["groups"], dims["head_dim"]
    scale = 1.0 / math.sqrt(d)
    flex = flex_call(compiled=cuda)
    rows = []
    for kind in args.masks:
        mask, L = make_mask(kind, b, s, block, device)
        dens = density(mask, L) if L <= 8192 else None
        t0 = time.perf_counter()
        bm = mask.block_mask(L, L, device)
        bm_ms = (time.perf_counter() - t0) * 1e3
        lowered = mask.sdpa(L, L, device)
        gen = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(b, h, L, d, device=device, dtype=dtype, generator=gen).requires_grad_(True)
        k = torch.randn(b, g, L, d, device=device, dtype=dtype, generator=gen).requires_grad_(True)
        v = torch.randn(b, g, L, d, device=device, dtype=dtype, generator=gen).requires_grad_(True)
        grad = torch.randn(b, h, L, d, device=device, dtype=dtype, generator=gen)
        fwd_flops = 4.0 * b * h * L * L * d * (dens if dens is not None else float("nan"))
        backends = [("sdpa", sdpa_call(None))]
        if kind == "bidirectional" and cuda:
            backends += [(f"sdpa-{name}", sdpa_call(name)) for name in SDPA_PINNED]
        backends.append(("flex", None))
        reference = None
        for name, call in backends:
            attend = (lambda q_, k_, v_: flex(q_, k_, v_, bm, scale)) if name == "flex" else (
                lambda q_, k_, v_, c=call: c(q_, k_, v_, lowered, scale))
            row = {"measure": "kernel", "mask": kind, "backend": name, "batch": b, "query_length": L,
                   "density": dens, "block_mask_build_ms": bm_ms if name == "flex" else None}
            try:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                with torch.no_grad():
                    out = attend(q, k, v)
                if name == "sdpa":
                    reference = out.float()
                elif reference is not None:
                    row["max_abs_diff_vs_sdpa"] = float((out.float() - reference).abs().max())
                fwd = timed(lambda: attend(q, k, v), warmup, iters, cuda)

                def fwd_bwd():
                    o = attend(q, k, v)
                    torch.autograd.grad(o, (q, k, v), grad)

                both = timed(fwd_bwd, warmup, iters, cuda)
                row.update(status="ok", forward_ms=statistics.median(fwd), forward_backward_ms=statistics.median(both),
                           forward_tflops=fwd_flops / statistics.median(fwd) / 1e9,
                           forward_backward_tflops=3.5 * fwd_flops / statistics.median(both) / 1e9,
                           peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None)
            except (RuntimeError, ValueError, NotImplementedError) as exc:  # a kernel that refuses the inputs
                row.update(status="refused", error=f"{type(exc).__name__}: {str(exc)[:300]}")
            rows.append(row)
            print(json.dumps(row), flush=True)
        if not args.layer or kind not in args.layer_masks:
            continue
        x = torch.randn(b, L, dims["hidden"], device=device, dtype=dtype, generator=gen, requires_grad=True)
        for name in ("sdpa", "flex"):
            if name == "flex":
                attend = lambda q_, k_, v_: flex(q_, k_, v_, bm, scale)  # noqa: E731
            else:  # dense operands, as SDPACoreAttention hands cuDNN
                attend = lambda q_, k_, v_: sdpa_call(None)(  # noqa: E731
                    q_.contiguous(), k_.contiguous(), v_.contiguous(), lowered, scale)
            torch.manual_seed(0)
            layer = AttentionLayer(dims, attend, dtype, device)
            row = {"measure": "layer", "mask": kind, "backend": name, "batch": b, "query_length": L}
            try:
                if cuda:
                    torch.cuda.reset_peak_memory_stats()

                def step():
                    layer(x).sum().backward()

                both = timed(step, warmup, iters, cuda)
                row.update(status="ok", forward_backward_ms=statistics.median(both),
                           tokens_per_s=b * L / (statistics.median(both) / 1e3),
                           peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None)
            except (RuntimeError, ValueError, NotImplementedError) as exc:
                row.update(status="refused", error=f"{type(exc).__name__}: {str(exc)[:300]}")
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {
        "benchmark": "bench/attention/flex_vs_sdpa.py",
        "dry": bool(args.dry),
        "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "shape": {**dims, "batch": b, "seq_length": s, "block": block},
        "warmup": warmup, "iters": iters,
        "flops_note": "forward 4*b*h*L^2*d*density, forward+backward 3.5 x forward (FlashAttention-2's count)",
        "rows": rows,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write (its folder is created)")
    p.add_argument("--dry", action="store_true", help="tiny float32 shapes on the CPU: checks the script only")
    p.add_argument("--batch", type=int, default=8, help="micro batch (default 8: the throughput spec's)")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--block", type=int, default=128, help="block of block_causal and block_diffusion")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--masks", nargs="+", default=list(MASKS), choices=MASKS)
    p.add_argument("--no-layer", dest="layer", action="store_false", help="leave out the layer measurement")
    p.add_argument("--layer-masks", nargs="+", default=["bidirectional"], choices=MASKS)
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_file():
        print(f"--out {out}: exists and is not a file", file=sys.stderr)
        return 2
    result = run(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
