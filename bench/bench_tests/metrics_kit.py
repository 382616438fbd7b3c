"""A run folder's ``metrics.jsonl`` as the runtime writes it (``backends/megatron/metrics.py``:
one JSON object a line, ``{"event": ..., "time": ..., **values}``), made in a test's ``tmp_path``.

:func:`run_records` is a run of 12 iterations logged every step with a validation every 4, a
checkpoint, the host-launch measurement and an exit record; :func:`write_run_folder` writes them
(and, with ``cut``, a last line cut mid-record: a run killed while it wrote)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The last iteration of :func:`run_records`.
ITERS = 12


def run_records(*, start_time: float = 1000.0, rl: bool = False) -> list[dict[str, Any]]:
    """The records of one launch: start, host_launch, 12 train (loss falling, the first step slow:
    start-up; every 4th with a ``generation_accuracy``; with ``rl`` the RL stage's ``rl/...``
    values too), a valid every 4 iterations (iteration 12's an ``eval`` record of the end), a
    checkpoint at 12 and the exit."""
    t = start_time
    rows: list[dict[str, Any]] = [
        {"event": "start", "time": t, "iteration": 0, "name": "kit-run", "layer_spec": "local",
         "attention": "sdpa", "weights": {"source": "random"}, "model_flops_per_token": 1.5e9,
         "params_on_logging_rank": 123456, "provenance": {"spec_hash": "abc"}},
        {"event": "host_launch", "time": t + 1.0, "host_launch_us": 7.25},
    ]
    t += 30.0
    for it in range(1, ITERS + 1):
        step = 0.9 if it == 1 else 0.1 + 0.001 * (it % 3)
        t += step
        record = {"event": "train", "time": round(t, 4), "iteration": it, "train_iters": ITERS,
                  "loss": round(10.0 / it, 6), "grad_norm": 1.0 + 0.1 * it, "lr": 1e-4, "step_time_s": step,
                  "tokens_per_s": round(4096 / step, 3), "mfu": 0.3, "peak_mem_gib": 1.0 + 0.01 * it,
                  "peak_reserved_gib": 2.0}
        if it % 4 == 0:  # the in-training generation score of an evaluation
            record["generation_accuracy"] = 0.1 * (it // 4)
        if rl:
            record.update({"rl/reward_mean": 0.4 + 0.01 * it, "rl/accuracy": 0.3 + 0.02 * it, "rl/kl": 1e-3 * it,
                           "rl/clip_fraction": 0.0, "rl/rollout_tokens_per_s": 5000.0 + it,
                           "rl/rollout_seconds": 0.05, "rl/update_seconds": 0.04})
        rows.append(record)
        if it % 4 == 0:
            rows.append({"event": "valid" if it < ITERS else "eval", "time": round(t + 0.5, 4), "iteration": it,
                         "loss": round(9.0 / it, 6)})
    rows.append({"event": "checkpoint", "time": round(t + 1.0, 4), "iteration": ITERS, "path": "checkpoints/iter_0000012",
                 "reason": "end"})
    rows.append({"event": "exit", "time": round(t + 2.0, 4), "iteration": ITERS, "reason": "done"})
    return rows


def write_run_folder(folder: Path, *, cut: bool = True, name: str = "metrics.jsonl", rl: bool = False) -> Path:
    """``folder/name`` holding :func:`run_records` (``rl``: the RL stage's), then (``cut``) half of
    one more train record without its newline; returns the file."""
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in run_records(rl=rl))
    if cut:
        text += json.dumps({"event": "train", "iteration": ITERS + 1, "loss": 0.5, "step_time_s": 0.1})[:30]
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path
