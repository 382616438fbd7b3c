"""Which SDPA backend PyTorch picks for the demo's attention shapes, in a fresh process, with
and without an earlier masked call (the first forward after a resume took another
backend than the uninterrupted run). Prints one JSON line per case; bench-only."""
import json
import subprocess
import sys

import torch


def case(order: str) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.use_deterministic_algorithms(True)
    g = torch.Generator(device="cuda").manual_seed(0)
    s, b, h, d = 512, 32, 12, 64
    prio = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
    out = []
    for kind in order.split(","):
        if kind == "warm":  # what backends/megatron/attention.py's initialise_sdpa_dispatch does
            from dlmspec.backends.megatron.attention import initialise_sdpa_dispatch
            initialise_sdpa_dispatch(torch.device("cuda", torch.cuda.current_device()))
            out.append({"call": kind})
            continue
        q = torch.randn(s, b, h, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
        k = torch.randn(s, b, h, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
        v = torch.randn(s, b, h, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
        qp, kp, vp = (t.permute(1, 2, 0, 3) for t in (q, k, v))
        mask = None
        if kind == "mask":
            mask = torch.ones(b, 1, 1, s, dtype=torch.bool, device="cuda")
            mask[:, :, :, s // 2:] = False
        with sdpa_kernel(prio, set_priority=True):
            choice = torch._fused_sdp_choice(qp, kp, vp, mask, 0.0, False, scale=None, enable_gqa=False)
            o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)
        o.sum().backward()
        out.append({"call": kind, "choice": int(choice), "out_stride": o.stride()})
    return {"order": order, "calls": out, "torch": torch.__version__}


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(json.dumps(case(sys.argv[1])))
    else:
        for order in ("plain", "mask,plain", "plain,plain", "mask,mask,plain", "warm,plain", "warm,plain,plain"):
            subprocess.run([sys.executable, __file__, order], check=False)
