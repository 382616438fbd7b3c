"""Rules of ``[eval.generation]`` (generation accuracy during training,
backends/megatron/generation_eval.py): when it runs, the layout the sampler can run on, and the
prompts file."""

from __future__ import annotations

import os
from typing import Iterator

from dlmspec.check.registry import Context, Finding, Fix, rule


@rule(
    "eval-generation-every",
    "error",
    "backends/megatron/training.py: the generation evaluation runs inside the evaluation at train.eval_interval",
    "[eval.generation] every is a multiple of train.eval_interval",
)
def _every(ctx: Context) -> Iterator[Finding]:
    table = ctx.spec.eval.generation if ctx.spec.eval is not None else None
    if table is None or table.every is None:
        return
    interval = ctx.spec.train.eval_interval
    if table.every % interval:
        good = max(interval, table.every // interval * interval)
        yield Finding("eval.generation.every", f"not a multiple of train.eval_interval = {interval}",
                      f"every = {good}", fix=Fix({"eval.generation.every": good}))


@rule(
    "eval-generation-layout",
    "error",
    "dlmspec.backends.generate.models.gpt_logits_fn: one pipeline stage holding the embedding and the output layer",
    "[eval.generation] runs on a layout the sampler can run (pipeline parallel size 1, a text tokenizer)",
    scope="runtime",
)
def _layout(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.eval is None or ctx.spec.eval.generation is None:
        return
    if ctx.spec.parallel.pipeline_model_parallel_size > 1:
        yield Finding("parallel.pipeline_model_parallel_size",
                      "[eval.generation] samples with the whole model on each rank's pipeline stage; the sampler "
                      "does not run pipeline-parallel models",
                      "pipeline_model_parallel_size = 1, or leave [eval.generation] out and run `dlmspec eval "
                      "--task` on the checkpoints", fix=Fix({"parallel.pipeline_model_parallel_size": 1}))
    if ctx.spec.data.tokenizer.type == "NullTokenizer":
        yield Finding("data.tokenizer.type", "[eval.generation] prompts are text: the runtime encodes them and decodes "
                      "the completions with [data.tokenizer], and NullTokenizer has no text",
                      "a text tokenizer (GPT2BPETokenizer, HuggingFaceTokenizer, ...), or leave [eval.generation] out",
                      value="NullTokenizer")


@rule(
    "eval-generation-prompts",
    "error",
    "dlmspec.tasks.rows.read_task_rows (the runtime reads the file with it at the first evaluation)",
    "[eval.generation] prompts, where it exists on this machine, is a JSONL of {\"prompt\", \"answer\"} rows",
    scope="paths",
)
def _prompts(ctx: Context) -> Iterator[Finding]:
    from dlmspec.tasks.rows import TaskFileError, read_task_rows

    table = ctx.spec.eval.generation if ctx.spec.eval is not None else None
    if table is None:
        return
    path = table.prompts
    try:
        missing = not os.path.lexists(path)
    except (OSError, ValueError):
        missing = True
    if missing:  # reported by the rule path-not-found (it may exist where the job runs)
        return
    try:
        read_task_rows(path)
    except TaskFileError as exc:
        where = f"{exc.path}:{exc.line}" if exc.line is not None else exc.path
        yield Finding("eval.generation.prompts", f"{where}: {exc.why}", exc.fix)
