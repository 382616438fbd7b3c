"""Planner FLOPs and step time: hand-checked FLOPs, the MFU definition, and the time model's
directions (bubble, recomputation, communication)."""

from __future__ import annotations

import pytest

from dlmspec.plan import make_plan, model_flops_per_token
from dlmspec.plan.compute import attended_keys
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec
from spec_kit import spec_dict


def test_model_flops_per_token_by_hand():
    # L=2, h=64, f=256 (SwiGLU), a=4, g=2, d=16, V=1024, s=256, causal (s/2 keys per query)
    h, f, a, g, d, V, s, L = 64, 256, 4, 2, 16, 1024, 256, 2
    qkv = 2 * h * (a + 2 * g) * d  # linear_qkv, 2mnk per token
    proj = 2 * a * d * h
    scores = 4 * a * d * (s // 2)  # QK^T and PV over s/2 keys
    mlp = 3 * 2 * h * f  # fc1 [2f, h] + fc2 [h, f]
    logits = 2 * h * V
    expected = 3 * (L * (qkv + proj + scores + mlp) + logits)  # fwd + bwd = 3x fwd
    assert expected == 1327104
    assert model_flops_per_token(L, h, f, a, g, d, V, s, attention="causal") == expected
    # Bidirectional attention (masked diffusion) counts all s keys: the score term doubles.
    bidir = model_flops_per_token(L, h, f, a, g, d, V, s, attention="bidirectional")
    assert bidir - expected == 3 * L * scores


def test_model_flops_moe_counts_active_experts():
    dense = model_flops_per_token(4, 128, 512, 4, 4, 32, 1024, 128)
    moe = model_flops_per_token(4, 128, 512, 4, 4, 32, 1024, 128, num_experts=8, moe_router_topk=2,
                                moe_ffn_hidden_size=512, num_moe_layers=4)
    # Two experts of the dense MLP's size per token, plus the router (2*h*E), per layer, x3.
    assert moe - dense == 3 * 4 * (3 * 2 * 128 * 512 + 2 * 128 * 8)


def test_attended_keys():
    assert attended_keys(8, "bidirectional") == 8
    assert attended_keys(8, "causal") == 4
    # blocks of 4: queries 0-3 see 4 keys, 4-7 see 8 -> 6 on average
    assert attended_keys(8, "block_causal", 4) == 6
    with pytest.raises(ValueError):
        attended_keys(8, "block_causal")
    with pytest.raises(ValueError):
        attended_keys(8, "sliding")


BASE = spec_dict({
    "name": None,
    "data": None,
    "model": {"preset": "qwen3-1.7b"},
    "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 4096, "train_iters": 1000},
})


def _plan(**overrides):
    return make_plan(resolve(Spec.model_validate(BASE).replace(**overrides)))


def test_mfu_is_model_flops_over_peak():
    plan = _plan()
    t = plan.time
    tokens = 64 * 4096
    assert t.flops.model_per_step == pytest.approx(t.flops.model_per_token * tokens)
    assert t.tokens_per_second == pytest.approx(tokens / t.step_seconds)
    assert t.model_tflops_per_gpu == pytest.approx(t.flops.model_per_step / t.step_seconds / 8 / 1e12)
    assert t.mfu == pytest.approx(t.model_tflops_per_gpu / 989)
    assert t.to_train_seconds == pytest.approx(1000 * t.step_seconds)
    assert t.gpu_hours == pytest.approx(t.to_train_seconds * 8 / 3600)
    assert sum(t.breakdown.values()) == pytest.approx(t.step_seconds)


def test_recompute_adds_hardware_flops_not_model_flops():
    none = _plan()
    full = _plan(**{"recompute.granularity": "full", "recompute.method": "uniform", "recompute.num_layers": 1})
    assert full.time.flops.model_per_step == none.time.flops.model_per_step
    assert full.time.flops.hardware_per_step > none.time.flops.hardware_per_step
    assert full.time.step_seconds > none.time.step_seconds
    assert full.time.mfu < none.time.mfu


def test_pipeline_bubble_shrinks_with_microbatches_and_interleaving():
    few = _plan(**{"parallel.pipeline_model_parallel_size": 4, "train.global_batch_size": 8})
    many = _plan(**{"parallel.pipeline_model_parallel_size": 4, "train.global_batch_size": 64})
    inter = _plan(**{"parallel.pipeline_model_parallel_size": 4, "train.global_batch_size": 64,
                     "parallel.virtual_pipeline_model_parallel_size": 7})

    def share(p):
        return p.time.breakdown["pipeline_bubble"] / p.time.step_seconds

    assert share(many) < share(few)
    assert share(inter) < share(many)


def test_tp_adds_exposed_communication():
    tp1 = _plan()
    tp2 = _plan(**{"parallel.tensor_model_parallel_size": 2, "parallel.sequence_parallel": True})
    assert tp1.time.breakdown["tp_communication"] == 0
    assert tp2.time.breakdown["tp_communication"] > 0


def test_slower_network_slows_multinode_data_parallel():
    spec = {**BASE, "cluster": {"gpu": "h100", "gpus_per_node": 8, "nodes": 2}, "train": {**BASE["train"], "global_batch_size": 128}}
    fast = make_plan(resolve(Spec.model_validate(spec).replace(**{"cluster.inter_node_gbps": 400.0,
                                                                  "parallel.overlap_grad_reduce": False})))
    slow = make_plan(resolve(Spec.model_validate(spec).replace(**{"cluster.inter_node_gbps": 25.0,
                                                                  "parallel.overlap_grad_reduce": False})))
    assert slow.time.breakdown["dp_communication"] == pytest.approx(16 * fast.time.breakdown["dp_communication"])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(attention="bidirectional"),
        dict(attention="causal"),
        dict(attention="block_causal", block_size=64),
        dict(attention="bidirectional", num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=256,
             moe_shared_expert_intermediate_size=128),
    ],
)
def test_runtime_mfu_formula_matches_the_planner(kwargs):
    """backends/megatron computes MFU with its own copy of the formula; both must agree."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from dlmspec.backends.megatron import metrics

    dims = dict(num_layers=4, hidden_size=256, ffn_hidden_size=704, num_attention_heads=8, num_query_groups=2,
                kv_channels=32, vocab_size=50304, seq_length=1024)
    moe_layers = 4 if kwargs.get("num_experts") else 0
    ours = model_flops_per_token(*dims.values(), num_moe_layers=moe_layers, **kwargs)
    theirs = metrics.model_flops_per_token(**dims, gated_mlp=True, **kwargs)
    assert theirs == pytest.approx(ours, rel=1e-9, abs=1)


def test_flops_module_imports_without_pydantic():
    """The runtime and the benchmarks import dlmspec.flops on the GPU machine, which has no
    pydantic: it must pull in nothing but the standard library."""
    import subprocess
    import sys

    code = "import sys, dlmspec.flops; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'typer', 'rich', 'torch', 'numpy')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
