"""Shared pieces of the throughput benchmark: model sizes, the FLOP count, the
summary of a list of step times, and provenance.

No torch import at module level: ``bench/throughput/run.py --dry-run`` must work without it.

The FLOP count is :func:`dlmspec.flops.model_flops_per_token` (the number MFU is quoted in
everywhere in dlmspec: planner and runtime alike), so both sides of the comparison use the same
numerator; it needs no pydantic, so it imports on the GPU machine too.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

#: Repository root (``bench/throughput/`` is two levels down).
ROOT = Path(__file__).resolve().parent.parent.parent

#: Dense bf16 peak of one H100/H200 SXM in TFLOP/s, the MFU denominator of the throughput suite and of the
#: runtime's ``LoggingConfig.peak_tflops_per_gpu`` in ``bench/runtime/train_reference.py``.
PEAK_TFLOPS = 989.0

#: Qwen3-1.7B architecture (Qwen/Qwen3-1.7B config.json), as the ``qwen3-1.7b`` preset of
#: ``bench/runtime/train_reference.py``: untied embeddings, QK-norm, GQA 16/8, head dim 128.
#: ``tokenizer_vocab`` ids exist in the tokenizer, ``mask_token_id`` is the first unused id
#: (the MDM mask token), ``vocab_size`` is the embedding / output-layer size.
QWEN3_1_7B: Dict[str, Any] = dict(
    num_layers=28,
    hidden_size=2048,
    ffn_hidden_size=6144,
    num_attention_heads=16,
    num_query_groups=8,
    kv_channels=128,
    vocab_size=151936,
    tokenizer_vocab=151669,
    mask_token_id=151669,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)

#: The ``tiny`` preset of ``bench/runtime/train_reference.py`` (same structure: GQA, QK-norm,
#: untied, SwiGLU), small enough for CPU tests of both sides.
TINY: Dict[str, Any] = dict(
    num_layers=2,
    hidden_size=128,
    ffn_hidden_size=384,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=32,
    vocab_size=1024,
    tokenizer_vocab=1000,
    mask_token_id=1000,
    rope_theta=10_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)

PRESETS: Dict[str, Dict[str, Any]] = {"qwen3-1.7b": QWEN3_1_7B, "tiny": TINY}
#: Sequence length of each preset in train_reference.py (the benchmark measures 4096).
PRESET_SEQ_LENGTH: Dict[str, int] = {"qwen3-1.7b": 4096, "tiny": 128}


def flops_per_token(arch: Dict[str, Any], seq_length: int) -> Dict[str, Any]:
    """``{"flops_per_token": float, "flops_source": str}`` for ``arch`` at ``seq_length``.

    Source: :func:`dlmspec.flops.model_flops_per_token`, the count the planner and the runtime use
    (bidirectional attention, gated MLP, padded vocabulary ``vocab_size``). :mod:`dlmspec.flops`
    needs no pydantic, so this works on the GPU machine too.
    """
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from dlmspec.flops import model_flops_per_token

    value = model_flops_per_token(
        arch["num_layers"], arch["hidden_size"], arch["ffn_hidden_size"], arch["num_attention_heads"],
        arch["num_query_groups"], arch["kv_channels"], arch["vocab_size"], seq_length,
        gated=True, attention="bidirectional",
    )
    return {"flops_per_token": float(value), "flops_source": "dlmspec.flops.model_flops_per_token"}


def summarize(
    step_times_s: Sequence[float],
    *,
    tokens_per_step: int,
    flops_per_token: float,
    num_gpus: int = 1,
    peak_tflops: float = PEAK_TFLOPS,
) -> Dict[str, Any]:
    """Throughput of a run from its timed steps.

    Args:
        step_times_s: seconds of each timed step (warm-up steps already removed).
        tokens_per_step: tokens of one optimizer step over all GPUs (global batch * seq).
        flops_per_token: model FLOPs of one training token (:func:`flops_per_token`).
        num_gpus: GPUs the step ran on (MFU is per GPU).
        peak_tflops: dense bf16 peak of one GPU, TFLOP/s.

    Returns:
        ``median_step_time_s``, ``mean_step_time_s``, ``min_step_time_s``, ``max_step_time_s``,
        ``tokens_per_s`` (from the median step: ``tokens_per_step / median``),
        ``tflops_per_gpu`` (``flops_per_token * tokens_per_s / num_gpus / 1e12``) and ``mfu``
        (``tflops_per_gpu / peak_tflops``, a fraction).

    Raises:
        ValueError: with no step times or a non-positive one.
    """
    times = [float(t) for t in step_times_s]
    if not times:
        raise ValueError("no timed steps")
    if min(times) <= 0:
        raise ValueError(f"non-positive step time in {times}")
    median = statistics.median(times)
    tokens_per_s = tokens_per_step / median
    tflops = flops_per_token * tokens_per_s / num_gpus / 1e12
    return {
        "median_step_time_s": median,
        "mean_step_time_s": statistics.fmean(times),
        "min_step_time_s": min(times),
        "max_step_time_s": max(times),
        "tokens_per_s": tokens_per_s,
        "tflops_per_gpu": tflops,
        "mfu": tflops / peak_tflops,
    }


def best_attempt(attempts: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The attempt with the most tokens/s among those with ``status == "ok"`` (``None`` if none)."""
    ok = [a for a in attempts if a.get("status") == "ok" and a.get("tokens_per_s")]
    return max(ok, key=lambda a: a["tokens_per_s"]) if ok else None


def parse_int_list(text: str) -> List[int]:
    """``"2,4, 6"`` -> ``[2, 4, 6]``; raises ``ValueError`` on an empty list or a value < 1."""
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise ValueError(f"expected a comma-separated list of positive integers, got {text!r}")
    return values


def host_info() -> Dict[str, Any]:
    """Python version, platform and the allocator setting (no torch import)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
