"""Planner memory model: hand-checked numbers for a small model, and monotonicity.

The hand-checked numbers are written out from the formulas (Korthikanti et al. 2022, Table 2,
with the flash-attention, GQA and SwiGLU terms the planner documents), not read from the
planner's code path.
"""

from __future__ import annotations

import pytest

from dlmspec.plan import make_plan
from dlmspec.plan.calibration import Calibration
from dlmspec.plan.memory import in_flight, stage_layer_counts
from dlmspec.plan.megatron_formula import in_flight_interleaved_megatron
from dlmspec.plan.shape import layout, model_shape
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec
from spec_kit import spec_dict

#: No constant overheads and no fitted activation scale: the test checks the counted terms only.
BARE = Calibration(allocated_overhead_bytes=0, cuda_context_bytes=0, nccl_bytes_per_group=0,
                   allocator_reserve_fraction=0.0, activation_scale=1.0)

SMALL = spec_dict({
    "data": None,
    "name": "small",
    "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 256, "num_attention_heads": 4, "num_query_groups": 2, "vocab_size": 1000, "max_position_embeddings": 256, "kv_channels": 16, "normalization": "RMSNorm", "activation": "swiglu", "transformer_impl": "local"},
    "train": {"micro_batch_size": 2, "global_batch_size": 2, "seq_length": 256, "train_iters": 10},
    "cluster.gpus_per_node": 1,
    "objective": {"kind": "ar"},
    "kernels": {"cross_entropy": "megatron"},
})


def _resolved(overrides: dict | None = None, base: dict = SMALL):
    spec = Spec.model_validate(base)
    if overrides:
        spec = spec.replace(**overrides)
    return resolve(spec)


def test_small_model_by_hand():
    plan = make_plan(_resolved(), BARE)
    b = plan.memory.peak.breakdown
    h, f, a, g, d, V, L = 64, 256, 4, 2, 16, 1024, 2  # V: 1000 padded to a multiple of 128
    params = L * (h * (a + 2 * g) * d + a * d * h + 2 * h + 3 * h * f) + 2 * V * h + h
    assert params == 254272
    assert b["weights"] == 2 * params  # bf16
    assert b["gradients"] == 4 * params  # fp32 main_grad (grad_reduce_in_fp32)
    assert b["optimizer_states"] == 12 * params  # fp32 master + 2 Adam moments, dp = 1

    T, y = 2 * 256, 2  # tokens per microbatch, bytes per bf16 element
    per_layer = (
        2 * (y * T * h + 4 * T)  # input and pre-MLP norm inputs + fp32 rstd (Korthikanti: 4sbh)
        + y * T * h  # linear_qkv input (2sbh)
        + y * T * (a + 2 * g) * d  # mixed QKV output, held by the v view
        + y * T * (a + g) * d  # RoPE-rotated q and k
        + 4 * y * 256 * d  # RoPE's cos and sin, for q and for k ([s, 1, 1, d] each)
        + y * T * a * d + 4 * T * a  # SDPA output (linear_proj saves a view) + fp32 log-sum-exp
        + y * T * h  # linear_fc1 input (2sbh)
        + y * T * 2 * f  # SwiGLU input [T, 2f]
        + y * T * f  # linear_fc2 input
    )
    assert per_layer == 1388544  # also what autograd saves on CPU: tests/integration/plan/test_plan_saved_tensors.py
    assert b["activations"] == L * per_layer
    output = (y * T * h + 4 * T) + y * T * h  # final norm input (+ rstd), output-layer input
    assert b["embedding_output_activations"] == output
    assert b["batch_and_objective"] == (16 + 20) * T
    # vocab_parallel_cross_entropy: bf16 logits and their fp32 copy (the softmax kept for backward)
    assert b["loss_logits"] == (2 + 4) * T * V
    assert b["backward_transient"] == 0 and b["optimizer_step_transient"] == 0
    assert plan.memory.peak.phase == "forward_backward"
    assert plan.peak_allocated_bytes == 2 * params + 4 * params + 12 * params + L * per_layer + output + 36 * T + 6 * T * V


@pytest.mark.parametrize("impl", ["liger", "torch"])
def test_fused_linear_cross_entropy_replaces_the_logits(impl):
    # [kernels] cross_entropy = "fused_linear": no [T, V] logits; what is alive around the loss is
    # the fp32 model output, the selected rows and their gradient, the weight gradient and one
    # chunk of logits (backends/megatron/output_loss.py, Liger's chunking).
    megatron = make_plan(_resolved(), BARE).memory.peak.breakdown
    fused = make_plan(_resolved({"kernels.cross_entropy": "fused_linear", "kernels.fused_linear_impl": impl}), BARE)
    b = fused.memory.peak.breakdown
    h, V, T, y = 64, 1024, 2 * 256, 2
    if impl == "liger":
        chunk = 32  # next power of two of ceil(T / ceil(V / h)) = ceil(512 / 16)
        expected = 4 * T * h + 2 * y * T * h + y * V * h + y * chunk * V
    else:
        expected = 4 * T * h + 2 * y * T * h + 4 * V * h + (8 + y) * T * V  # T < 4096 rows: one chunk
    assert expected < megatron["loss_logits"] or impl == "torch"
    # the loss term, unless the layers' backward workspace is the larger transient
    assert b["loss_logits"] == expected or (b["loss_logits"] == 0 and b["backward_transient"] >= expected)
    others = {k: v for k, v in b.items() if k not in ("loss_logits", "backward_transient")}
    assert others == {k: v for k, v in megatron.items() if k not in ("loss_logits", "backward_transient")}
    # "auto" is the fused path at TP = 1 only
    auto = make_plan(_resolved({"kernels.cross_entropy": "auto"}), BARE).memory.peak.breakdown
    assert auto["loss_logits"] != megatron["loss_logits"]


def test_breakdown_sums_to_peaks():
    plan = make_plan(_resolved())
    peak = plan.memory.peak
    allocated = sum(peak.breakdown[k] for k in plan.to_dict()["memory"]["allocated_terms"])
    assert peak.peak_allocated_bytes == pytest.approx(allocated)
    assert peak.peak_bytes == pytest.approx(sum(peak.breakdown.values()))
    assert peak.peak_bytes > peak.peak_allocated_bytes  # CUDA context and reserve are extra


QWEN = spec_dict({
    "name": None,
    "data": None,
    "model": {"preset": "qwen3-1.7b"},
    "train": {"micro_batch_size": 4, "global_batch_size": 64, "seq_length": 4096, "train_iters": 10},
})


def _activations(overrides: dict) -> float:
    plan = make_plan(_resolved(overrides, QWEN))
    b = plan.memory.peak.breakdown
    return b["activations"]


def test_recompute_orders_activations():
    none = _activations({"recompute.granularity": "none"})
    selective = _activations({"recompute.granularity": "selective"})
    full = _activations({"recompute.granularity": "full", "recompute.method": "uniform", "recompute.num_layers": 1})
    assert full < selective < none
    assert full < none / 10  # only each layer's input survives


def test_recompute_full_block_between_uniform_and_none():
    uniform = _activations({"recompute.granularity": "full", "recompute.method": "uniform", "recompute.num_layers": 1})
    block = _activations({"recompute.granularity": "full", "recompute.method": "block", "recompute.num_layers": 14})
    none = _activations({"recompute.granularity": "none"})
    assert uniform < block < none


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_more_tp_less_memory_per_gpu(tp):
    sp = {"parallel.sequence_parallel": True} if tp > 1 else {}
    lower = make_plan(_resolved({"parallel.tensor_model_parallel_size": tp, **sp}, QWEN))
    higher = make_plan(_resolved({"parallel.tensor_model_parallel_size": 2 * tp, "parallel.sequence_parallel": True}, QWEN))
    assert higher.peak_bytes < lower.peak_bytes
    assert higher.memory.peak.breakdown["weights"] < lower.memory.peak.breakdown["weights"]
    assert higher.memory.peak.breakdown["activations"] < lower.memory.peak.breakdown["activations"]


def test_distributed_optimizer_shards_state_by_dp():
    on = make_plan(_resolved({"parallel.use_distributed_optimizer": True}, QWEN))
    off = make_plan(_resolved({"parallel.use_distributed_optimizer": False}, QWEN))
    assert on.layout.dp == 8
    assert on.memory.peak.breakdown["optimizer_states"] * 8 == pytest.approx(off.memory.peak.breakdown["optimizer_states"])
    assert on.memory.peak.breakdown["weights"] == off.memory.peak.breakdown["weights"]


def test_micro_batch_scales_activations_linearly():
    one = _activations({"train.micro_batch_size": 1})
    four = _activations({"train.micro_batch_size": 4})
    # Everything per token scales by 4; the SDPA output copy exists only for b > 1.
    assert 3.9 * one < four < 4.6 * one


def test_grad_dtype_key():
    fp32 = make_plan(_resolved({"parallel.grad_reduce_in_fp32": True}, QWEN)).memory.peak.breakdown["gradients"]
    bf16 = make_plan(_resolved({"parallel.grad_reduce_in_fp32": False}, QWEN)).memory.peak.breakdown["gradients"]
    assert fp32 == 2 * bf16


def test_pipeline_in_flight_1f1b_and_interleaved():
    r = _resolved({"parallel.pipeline_model_parallel_size": 4, "train.micro_batch_size": 1}, QWEN)
    lay = layout(r)
    assert lay.num_microbatches == 32
    assert [in_flight(lay, i) for i in range(4)] == [4, 3, 2, 1]  # 1F1B: pp - stage
    r = _resolved({"parallel.pipeline_model_parallel_size": 4, "parallel.virtual_pipeline_model_parallel_size": 7,
                   "train.micro_batch_size": 1}, QWEN)
    lay = layout(r)
    # megatron-core interleaved warm-up: 2*(pp-1-stage) + (vpp-1)*pp chunk-microbatches, +1
    assert in_flight(lay, 0) == pytest.approx((2 * 3 + 6 * 4 + 1) / 7)
    assert in_flight(lay, 0) * 7 <= in_flight_interleaved_megatron(4, 7) * 7
    assert in_flight_interleaved_megatron(4, 7) == 5  # ceil((1 + 3/28) * 4)
    shape = model_shape(r)
    # 28 layers over 4 ranks x 7 chunks: one layer per chunk, 7 per rank
    assert [stage_layer_counts(shape, lay, i) for i in range(4)] == [(7, 0)] * 4


def test_pipeline_first_stage_holds_most_activations_last_the_logits():
    plan = make_plan(_resolved({"parallel.pipeline_model_parallel_size": 4, "train.micro_batch_size": 1}, QWEN))
    stages = plan.memory.stages
    acts = [s.breakdown["activations"] for s in stages]
    assert acts == sorted(acts, reverse=True)
    assert stages[-1].breakdown["loss_logits"] > 0 and stages[0].breakdown["loss_logits"] == 0


def test_moe_experts_split_by_ep():
    base = {"model": {"preset": "mixtral-8x7b"},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096, "train_iters": 10},
            "cluster": {"gpu": "h200", "gpus_per_node": 8, "nodes": 1}}
    ep2 = make_plan(_resolved({"parallel.expert_model_parallel_size": 2}, base))
    ep8 = make_plan(_resolved({"parallel.expert_model_parallel_size": 8}, base))
    assert ep8.memory.peak.params[1] * 4 == pytest.approx(ep2.memory.peak.params[1])
    assert ep8.memory.peak.breakdown["weights"] < ep2.memory.peak.breakdown["weights"]
    assert ep2.to_dict()["memory"]["activation_per_layer"]["moe"]["expert_input"] > 0


def test_diffusion_variable_length_adds_mask_path():
    fixed = _activations({"objective.variable_length_prob": 0.0, "model.transformer_impl": "local"})
    varlen = _activations({"objective.variable_length_prob": 0.01, "model.transformer_impl": "local"})
    assert varlen > fixed
