"""Which SDPA backend is fastest for bidirectional attention at the benchmark's shape?

One Qwen3-1.7B attention layer (16 query heads, 8 key/value groups, head dim 128) at micro batch
8 x 4096 tokens, bf16, no mask: forward + backward through ``F.scaled_dot_product_attention``
with each backend forced (``torch.nn.attention.sdpa_kernel``), GQA either through
``enable_gqa=True`` or with keys/values expanded to every head (what
``dlmspec.backends.megatron.attention.SDPACoreAttention`` does for cuDNN and memory-efficient attention).
Outputs and gradients are compared with the flash result (bf16 tolerance).

    python3 bench/throughput/sdpa_backends.py [--batch 8] [--seq 4096] [--json OUT]

FLOPs: forward ``4 b h s^2 d`` (QK^T and PV), backward 2.5x forward (FlashAttention-2's
convention), so one forward + backward is ``14 b h s^2 d``.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def run(backend, q, k, v, gqa: bool, steps: int, warmup: int, layout: str = "bhsd"):
    """Median seconds of forward + backward. ``layout="sbhd"`` feeds the operands the way
    ``SDPACoreAttention`` does: megatron's ``[s, b, h, d]`` tensors permuted to ``[b, h, s, d]``
    views (made dense for cuDNN), and the output permuted back to ``[s, b, h * d]``, so the
    backward receives a strided output gradient."""
    heads, groups = q.shape[1], k.shape[1]
    if not gqa and heads != groups:
        k = k.repeat_interleave(heads // groups, dim=1)
        v = v.repeat_interleave(heads // groups, dim=1)
    if layout == "sbhd":
        q, k, v = (t.permute(2, 0, 1, 3).contiguous() for t in (q, k, v))  # [s, b, h, d] leaves
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    if layout == "sbhd":
        grad = torch.randn(q.shape[0], q.shape[1], q.shape[2] * q.shape[3], device=q.device, dtype=q.dtype)
    else:
        grad = torch.randn_like(q)
    times = []
    with sdpa_kernel([backend]):
        for i in range(warmup + steps):
            for t in (q, k, v):
                t.grad = None
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if layout == "sbhd":
                qq, kk, vv = (t.permute(1, 2, 0, 3) for t in (q, k, v))
                if backend == SDPBackend.CUDNN_ATTENTION:
                    qq, kk, vv = qq.contiguous(), kk.contiguous(), vv.contiguous()
                ctx = F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=gqa and heads != groups)
                out = ctx.permute(2, 0, 1, 3).reshape(q.shape[0], q.shape[1], -1)
            else:
                out = F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa and heads != groups)
            out.backward(grad)
            end.record()
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return out.detach(), q.grad, times[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layout", choices=["bhsd", "sbhd"], default="bhsd",
                   help="sbhd: operands and output as SDPACoreAttention passes them (megatron layout)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    shape_q = (a.batch, a.heads, a.seq, a.head_dim)
    shape_kv = (a.batch, a.groups, a.seq, a.head_dim)
    q = torch.randn(shape_q, device=dev, dtype=torch.bfloat16)
    k = torch.randn(shape_kv, device=dev, dtype=torch.bfloat16)
    v = torch.randn(shape_kv, device=dev, dtype=torch.bfloat16)
    flops = 14 * a.batch * a.heads * a.seq * a.seq * a.head_dim
    cases = [
        ("flash", SDPBackend.FLASH_ATTENTION, True),
        ("flash", SDPBackend.FLASH_ATTENTION, False),
        ("cudnn", SDPBackend.CUDNN_ATTENTION, True),
        ("cudnn", SDPBackend.CUDNN_ATTENTION, False),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION, False),
    ]
    results, ref = [], None
    for name, backend, gqa in cases:
        row = {"backend": name, "gqa": "enable_gqa" if gqa else "expanded"}
        try:
            out, gq, seconds = run(backend, q, k, v, gqa, a.steps, a.warmup, a.layout)
            if ref is None:
                ref = (out, gq)
            row.update(seconds=seconds, tflops=flops / seconds / 1e12,
                       max_abs_out_diff=float((out.float() - ref[0].float()).abs().max()),
                       max_abs_dq_diff=float((gq.float() - ref[1].float()).abs().max()))
        except Exception as exc:  # a backend that cannot take these inputs
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        results.append(row)
        print(json.dumps(row), flush=True)
    out = {"layout": a.layout, "shape": {"batch": a.batch, "seq": a.seq, "heads": a.heads, "groups": a.groups, "head_dim": a.head_dim},
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "cudnn": torch.backends.cudnn.version(),
           "flops_fwd_bwd": flops, "results": results,
           "command": "python3 " + " ".join(sys.argv)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
