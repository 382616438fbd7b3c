"""Context parallelism of the SDPA core attention on GPUs: CP = N against CP = 1, per kernel path.

``tests/integration/runtime/test_runtime_context_parallel.py`` checks the arithmetic on CPU (gloo, float64, SDPA's
math kernel). This runs the same comparison where the GPU kernels are picked: NCCL all-gather /
reduce-scatter, flash for bidirectional attention and the sequence-opening causal chunk, the
memory-efficient kernel with a mask for the other causal / block-causal chunks, in bf16 at a
realistic size. Every rank compares its output and dQ/dK/dV with the CP = 1 result on the whole
sequence (computed on every rank) and rank 0 writes one JSON line per case.

Usage (one node, from the repository root)::

    python3 -m torch.distributed.run --standalone --nproc_per_node=2 bench/runtime/cp_attention_gpu.py OUT.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from megatron.core import parallel_state  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: E402

from dlmspec.backends.megatron.attention import SDPACoreAttention, cp_rank_positions  # noqa: E402

#: (mode, block size, query groups): GQA 16/8 heads of 128 as Qwen3-1.7B, and MHA.
CASES = [("bidirectional", None, 8), ("bidirectional", None, 16), ("causal", None, 8), ("causal", None, 16),
         ("block_causal", 64, 8)]
S, B, HEADS, HN = 8192, 1, 16, 128
#: Largest |CP - CP1| / max |CP1| accepted, per tensor (bf16 has an 8-bit mantissa: 2**-8 = 0.4%).
TOLERANCE = 0.02


def _module(mode, block_size, groups, cp, cp_group):
    config = TransformerConfig(num_layers=1, hidden_size=HEADS * HN, num_attention_heads=HEADS,
                               num_query_groups=groups, kv_channels=HN, attention_dropout=0.0,
                               context_parallel_size=cp, cp_comm_type="all_gather" if cp > 1 else None, bf16=True)
    pg = SimpleNamespace(tp=SimpleNamespace(size=lambda: 1), cp=cp_group)
    return SDPACoreAttention(config=config, layer_number=1, attn_mask_type=AttnMaskType.no_mask,
                             attention_type="self", cp_comm_type=config.cp_comm_type, pg_collection=pg,
                             mode=mode, block_size=block_size)


def _timed(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    parallel_state.initialize_model_parallel(1, 1, context_parallel_size=world)
    group = parallel_state.get_context_parallel_group()
    positions = cp_rank_positions(S // world, world, rank, device="cuda")
    lines = []
    for seed, (mode, block_size, groups) in enumerate(CASES):
        g = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn(S, B, HEADS, HN, generator=g, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(S, B, groups, HN, generator=g, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(S, B, groups, HN, generator=g, device="cuda", dtype=torch.bfloat16)
        dout = torch.randn(S, B, HEADS * HN, generator=g, device="cuda", dtype=torch.bfloat16)
        ref_mod, cp_mod = _module(mode, block_size, groups, 1, group), _module(mode, block_size, groups, world, group)

        full = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref = ref_mod(*full, None)
        ref.backward(dout)
        local = [t[positions].clone().requires_grad_(True) for t in (q, k, v)]
        got = cp_mod(*local, None)
        got.backward(dout[positions])

        def rel(a, b):
            return round(((a.float() - b.float()).abs().max() / b.float().abs().max()).item(), 5)

        errors = {"out": rel(got, ref[positions])}
        for name, mine, theirs in zip("qkv", local, full):
            errors[f"d{name}"] = rel(mine.grad, theirs.grad[positions])
        # bf16 tensors; different kernels and summation orders in the two paths.
        ok = all(err < TOLERANCE for err in errors.values())

        def step(mod, tensors, grad):
            o = mod(*tensors, None)
            o.backward(grad)

        t_cp = _timed(lambda: step(cp_mod, local, dout[positions]))
        t_ref = _timed(lambda: step(ref_mod, full, dout))
        flag = torch.tensor([0 if ok else 1], device="cuda")
        dist.all_reduce(flag)
        line = {"mode": mode, "block_size": block_size, "heads": HEADS, "groups": groups, "seq": S, "cp": world,
                "max_rel_err_rank0": errors, "all_ranks_ok": int(flag.item()) == 0, "tolerance": TOLERANCE,
                "fwd_bwd_ms_cp": round(t_cp * 1e3, 3), "fwd_bwd_ms_cp1_whole_sequence": round(t_ref * 1e3, 3)}
        lines.append(line)
        if rank == 0:
            print(json.dumps(line), flush=True)
    if rank == 0 and out is not None:
        out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0 if all(line["all_ranks_ok"] for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
