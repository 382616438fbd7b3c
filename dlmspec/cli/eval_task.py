"""``dlmspec eval --task FILE``: generation accuracy of a model on a task's prompts (JSONL of
``{"prompt", "answer"}``, as ``dlmspec task make`` writes), with its Wilson 95 % interval, ``n``
and the generation settings used (and where each came from). The same scoring as the runtime's
``[eval.generation]`` (:func:`dlmspec.backends.megatron.generation_eval.score_prompts`): the
sampler on each prompt, the completion cut at EOS, the checker of :mod:`dlmspec.tasks.check`.

The settings, lowest first (as ``dlmspec generate``'s): ``GenerateConfig``'s defaults, the
checkpoint's ``[generate]``, ``--spec``'s ``[generate]`` (a ``preset`` is resolved there), then
the flags. Without ``--task``, ``--spec``'s ``[eval.generation] prompts`` (and its
``max_prompts``) is the task. torch is imported inside the functions.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from dlmspec.cli.generate_options import _issue

#: The checker of ``dlmspec eval --task`` (the only one today; ``[eval.generation] checker``'s).
CHECKER = "exact_match"


def task_source(task: Optional[str], spec: Optional[str], max_prompts: Optional[int]) -> tuple[Optional[str], Optional[int]]:
    """``(prompts file, max_prompts)``: ``--task`` (with ``--max-prompts``), else ``--spec``'s
    ``[eval.generation]`` (its ``max_prompts`` unless the flag is given); ``(None, None)`` for no task."""
    if task is not None or spec is None:
        return task, max_prompts
    from dlmspec.spec.load import load

    loaded = load(spec)
    table = loaded.spec.eval.generation if loaded.spec.eval is not None else None
    if table is None:
        return None, max_prompts
    return table.prompts, max_prompts if max_prompts is not None else table.max_prompts


def read_rows(path: str, max_prompts: Optional[int]) -> list[dict[str, Any]]:
    """The task's rows (:func:`dlmspec.tasks.rows.read_task_rows`), before a checkpoint is read.

    Raises:
        SpecError: ``--task`` with the file (and line) and why (exit code 2).
    """
    from dlmspec.tasks.rows import TaskFileError, read_task_rows

    try:
        return read_task_rows(path, max_rows=max_prompts)
    except TaskFileError as exc:
        where = f"{exc.path}:{exc.line}" if exc.line is not None else exc.path
        raise _issue("--task", where, exc.why, exc.fix, file=exc.path, line=exc.line) from None


def score_task(model: Any, rows: list[dict[str, Any]], *, path: str, config: Any, settings: Any,
               batch_size: int) -> dict[str, Any]:
    """Sample and score ``rows`` with the loaded ``model`` (``LoadedModel``) and ``config``; the
    ``task`` result: accuracy, Wilson 95 % interval, n, correct, the settings (with their origins and
    the preset), forward passes, seconds and the first five completions.

    Raises:
        SpecError: the model has no tokenizer, or a prompt does not fit its positions.
    """
    import torch

    from dlmspec.backends.generate.likelihood import wilson_interval
    from dlmspec.backends.megatron.generation_eval import CHECKERS, score_prompts

    if model.tokenizer is None:
        raise _issue("RUN_OR_CHECKPOINT", model.path, f"--task needs the model's tokenizer ({model.tokenizer_error})",
                     "run from the folder the training ran in")
    for number, row in enumerate(rows, 1):
        ids = model.encode(row["prompt"])
        if model.max_length and len(ids) + config.gen_length > model.max_length:
            raise _issue("--task", f"{path}:{number}", f"a prompt of {len(ids)} tokens plus gen_length = "
                         f"{config.gen_length} exceeds the model's max_position_embeddings = {model.max_length}",
                         "shorter prompts or a smaller --gen-length", file=path, line=number)
    start = time.perf_counter()
    out = score_prompts(model.logits_fn, rows, encode=model.encode, decode=model.decode, config=config,
                        batch_size=batch_size, device=torch.device(model.device), checker=CHECKERS[CHECKER],
                        noise_schedule=getattr(model, "noise_schedule", None))
    seconds = time.perf_counter() - start
    n, correct = out["count"], out["correct"]
    low, high = wilson_interval(correct, n)
    return {"file": path, "n": n, "correct": correct, "accuracy": correct / n, "interval_95": [low, high],
            "interval_method": "wilson", "checker": CHECKER, "preset": settings.preset, "settings": config.to_dict(),
            "origins": settings.origins, "batch_size": batch_size, "forward_passes": out["forward_passes"],
            "seconds": seconds, "decoding": ("masked diffusion" if model.kind != "ar" else "left to right, full recompute"),
            "examples": [{**rows[c["index"]], **c} for c in out["completions"][:5]]}


def task_line(t: dict[str, Any]) -> str:
    """The line ``dlmspec eval`` prints for a task result."""
    lo, hi = t["interval_95"]
    shown = ", ".join(f"{k} = {v}" for k, v in t["settings"].items() if v is not None)
    preset = f"preset {t['preset']}; " if t["preset"] else ""
    return (f"task {t['file']}: accuracy {t['accuracy']:.3f} (Wilson 95 % interval {lo:.3f}-{hi:.3f}), n = {t['n']}, "
            f"{t['checker']}; {preset}settings: {shown}; {t['forward_passes']} forward passes in {t['seconds']:.1f} s")
