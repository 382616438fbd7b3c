"""The planner's model of [kernels] qkv_fusion and compiled_norm: the layout carries them, the
kernel and compiled-call counts, the effective element-wise bytes, the report's kernels line and
the launch-bound hint."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest

from dlmspec.spec.load import load
from dlmspec.plan import DEFAULT_CALIBRATION, make_plan
from dlmspec.plan.launches import COMPILED_CALLS_NORM, compiled_calls_per_microbatch, kernels_per_microbatch, layer_kernels
from dlmspec.plan.memory import stage_layer_counts
from dlmspec.plan.shape import kernels_path, qkv_fused
from dlmspec.plan.time import time_plan
from dlmspec.resolve import resolve

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "specs" / "demo-dlm.toml"
OFF = ["kernels.qkv_fusion=false", "kernels.compiled_norm=false"]
QWEN = ["model.num_layers=28", "model.hidden_size=2048", "model.ffn_hidden_size=6144",
        "model.num_attention_heads=16", "model.num_query_groups=8", "model.kv_channels=128",
        "model.max_position_embeddings=4096", "train.seq_length=4096", "train.micro_batch_size=10",
        "train.global_batch_size=10", 'kernels.sdpa_backend="cudnn"', "kernels.apply_rope_fusion=true"]


#: The library's defaults (the demo spec turns all three off: it is launch-bound).
DEFAULTS = ["kernels.qkv_fusion=true", "kernels.compiled_norm=true", "kernels.apply_rope_fusion=true"]


def _plan(*overrides, impl=None):
    """The demo with the library's kernel defaults, then ``overrides`` (later --set wins)."""
    return make_plan(resolve(load(DEMO, [*DEFAULTS, *overrides]).spec), DEFAULT_CALIBRATION, impl=impl)


def test_layout_carries_the_options():
    on, off = _plan(), _plan(*OFF)
    assert on.layout.qkv_fusion and on.layout.compiled_norm  # the defaults
    assert not off.layout.qkv_fusion and not off.layout.compiled_norm
    assert qkv_fused(on.shape, on.layout) and not qkv_fused(off.shape, off.layout)


def test_profile_kernel_total():
    """Qwen3-1.7B with fused RoPE: +86 kernels per microbatch with both options (the profile's
    4547.5 -> 4633.5)."""
    on, off = _plan(*QWEN), _plan(*QWEN, *OFF)
    counts = stage_layer_counts(on.shape, on.layout, 0)
    delta = kernels_per_microbatch(on.shape, on.layout, counts) - kernels_per_microbatch(off.shape, off.layout, counts)
    assert delta == 86
    assert layer_kernels(off.shape, off.layout) == (78 - 34 + 4, 33 - 20 + 2)  # the counted layer, fused RoPE


def test_compiled_calls():
    on = _plan()
    counts = stage_layer_counts(on.shape, on.layout, 0)
    layers = on.shape.num_layers
    assert compiled_calls_per_microbatch(on.shape, on.layout, counts) == layers * (2 + 2 * 2) + COMPILED_CALLS_NORM
    rope_only = _plan(*OFF, "kernels.apply_rope_fusion=true")
    assert compiled_calls_per_microbatch(rope_only.shape, rope_only.layout, counts) == layers * 4
    none = _plan(*OFF, "kernels.apply_rope_fusion=false")
    assert compiled_calls_per_microbatch(none.shape, none.layout, counts) == 0
    norm_only = _plan("kernels.qkv_fusion=false", "kernels.apply_rope_fusion=false")
    # the q/k norms are compiled too when the QKV function does not run them
    assert compiled_calls_per_microbatch(norm_only.shape, norm_only.layout, counts) == layers * 8 + 2


def test_transformer_engine_ignores_the_options():
    te = _plan(impl="transformer_engine")
    te_off = _plan(*OFF, impl="transformer_engine")
    assert te.time.step_seconds == pytest.approx(te_off.time.step_seconds)
    assert te.time.features["compiled_calls"] == 0
    assert "local path only" in te.runtime["kernels"]


def test_fused_path_is_faster_on_the_gpu_at_scale():
    """At micro batch 10 x 4096 (GPU-bound) the planned element-wise time falls by about the
    measured 58 ms of GPU busy time."""
    on, off = _plan(*QWEN), _plan(*QWEN, *OFF)
    assert on.time.features["gemm"] > 0 and off.time.features["gemm"] > 0
    saved = off.time.breakdown["elementwise"] - on.time.breakdown["elementwise"]
    assert 0.040 < saved < 0.075
    assert on.time.step_seconds < off.time.step_seconds
    assert "kernels_hint" not in on.runtime


def test_launch_bound_hint():
    plan = _plan("cluster.host_launch_us=10")
    assert plan.time.features["gemm"] == 0.0  # launch-bound
    hint = plan.runtime["kernels_hint"]
    assert "kernels.qkv_fusion=false" in hint and "kernels.compiled_norm=false" in hint
    off = time_plan(plan.shape, replace(plan.layout, qkv_fusion=False, compiled_norm=False), plan.gpu, plan.calibration)
    assert f"{off.step_seconds:.4f}" in hint and off.step_seconds < plan.time.step_seconds
    assert "kernels_hint" not in _plan(*OFF).runtime
    assert plan.to_dict()["runtime"]["kernels_hint"] == hint


def test_report_names_the_path():
    on, off = _plan(), _plan(*OFF)
    assert "qkv_fusion on" in on.runtime["kernels"] and "compiled_norm on" in on.runtime["kernels"]
    assert "qkv_fusion off" in off.runtime["kernels"] and "compiled_norm off" in off.runtime["kernels"]
    assert "inside the fused QKV kernel" in on.runtime["attention"]
    assert on.to_dict()["runtime"]["kernels"] == on.runtime["kernels"]


def test_qkv_fusion_falls_back_where_the_runtime_does():
    plan = _plan()
    partial = replace(plan.shape, rotary_dim=plan.shape.head_dim // 2)
    assert not qkv_fused(partial, plan.layout)
    layernorm = replace(plan.shape, layernorm=True)
    assert not qkv_fused(layernorm, plan.layout)
    assert "not taken" in kernels_path(partial, plan.layout)


def test_plan_stays_fast():
    resolved = resolve(load(DEMO, []).spec)
    make_plan(resolved)
    start = time.perf_counter()
    make_plan(resolved)
    assert time.perf_counter() - start < 0.3
