"""dlmspec.backends.megatron.profiling: kernel categories, the busy-time union, the step window."""

import gzip
import json

import pytest
import torch

from dlmspec.backends.megatron.profiling import StepProfiler, _merged_busy_us, format_summary, kernel_category, summarize_trace


@pytest.mark.parametrize("name, category", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "matmul"),
    ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "matmul"),
    ("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "communication"),
    ("void at::native::(anonymous namespace)::vectorized_rms_norm_kernel", "norm"),
    ("multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor>", "optimizer"),
    ("_cross_entropy_fwd_kernel", "loss"),
    ("void at::native::vectorized_elementwise_kernel<4, silu>", "elementwise"),
    ("some_unknown_kernel", "other"),
])
def test_kernel_categories(name, category):
    assert kernel_category(name) == category


def test_busy_time_is_the_union_of_overlapping_kernels():
    assert _merged_busy_us([(0, 10), (5, 15), (20, 30)]) == 25
    assert _merged_busy_us([]) == 0


def test_summary_of_a_synthetic_trace(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_x", "ts": 0, "dur": 600},
        {"ph": "X", "cat": "kernel", "name": "flash_fwd_kernel", "ts": 600, "dur": 200},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "ts": 700, "dur": 200},  # overlaps
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # not a kernel
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 0, "dur": 5},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 5},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 20, "dur": 5},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernelExC", "ts": 30, "dur": 5},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 40, "dur": 400},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 900, "dur": 200},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord", "ts": 1200, "dur": 3},
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump({"traceEvents": events}, fh)
    s = summarize_trace(str(path), steps=2, wall_s=0.002)
    assert s["wall_ms_per_step"] == pytest.approx(1.0)
    assert s["gpu_busy_ms_per_step"] == pytest.approx(0.45)  # union 0..900 us over 2 steps
    assert s["gpu_idle_share"] == pytest.approx(0.55)
    assert s["categories"] == pytest.approx({"matmul": 0.3, "attention": 0.1, "communication": 0.1})
    assert s["top_kernels"][0]["name"] == "sm90_xmma_gemm_x"
    host = s["host"]
    assert host["launches_per_step"] == pytest.approx(2.0)  # 4 launches (runtime and driver) over 2 steps
    assert host["waits_per_step"] == pytest.approx(1.0)
    assert host["wait_ms_per_step"] == pytest.approx(0.3)  # (400 + 200) us over 2 steps
    assert host["active_ms_per_step"] == pytest.approx(0.7)  # 1.0 ms wall - 0.3 waiting
    assert host["active_us_per_launch"] == pytest.approx(350.0)
    assert host["runtime_calls"][0] == {"name": "cudaStreamSynchronize", "ms_per_step": 0.2, "calls_per_step": 0.5}
    assert "350.0 us active per launch" in format_summary({**s, "rank": 0, "step_start": 0, "step_end": 2})


def test_step_profiler_writes_trace_and_summary_for_its_window_only(tmp_path):
    prof = StepProfiler(str(tmp_path), start=1, end=3, ranks=[0], rank=0)
    written = []
    x = torch.randn(64, 64)
    for it in range(5):
        prof.before_step(it)
        x = x @ x.T / 64
        written.append(prof.after_step(it + 1))
    assert [w is not None for w in written] == [False, False, True, False, False]
    summary = json.loads((tmp_path / "profile" / "summary_rank0.json").read_text())
    assert summary["steps"] == 2 and summary["step_start"] == 1 and summary["step_end"] == 3
    assert (tmp_path / "profile" / "trace_rank0.json.gz").stat().st_size > 0
    assert not (tmp_path / "profile" / "trace_rank0.json").exists()


def test_step_profiler_off_other_ranks_and_bad_window(tmp_path):
    prof = StepProfiler(str(tmp_path), start=0, end=1, ranks=[1], rank=0)
    prof.before_step(0)
    assert prof.after_step(1) is None and not (tmp_path / "profile").exists()
    with pytest.raises(ValueError, match="must exceed"):
        StepProfiler(str(tmp_path), start=2, end=2, ranks=[0], rank=0)
