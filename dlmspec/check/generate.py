"""Rules of the ``[generate]`` table (the sampler's settings of ``dlmspec generate`` / ``eval``):
the values that join fields are checked by the sampler's own settings class,
``dlmspec.generate_settings.GenerateConfig`` (plain Python, no torch), so ``validate`` and
``generate`` cannot disagree."""

from __future__ import annotations

import re
from typing import Any, Iterator

from dlmspec import objectives
from dlmspec.generate_settings import GenerateConfig, GenerateConfigError
from dlmspec.check.registry import Context, Finding, Fix, rule


def _fix_value(field: str, fix: str) -> Any:
    """The value in a ``GenerateConfigError.fix`` such as ``"block_length = 16"``, or ``None``."""
    match = re.fullmatch(rf"{field} = ([0-9.]+)(?: \(.*\))?", fix)
    if match is None:
        return None
    text = match.group(1)
    return float(text) if "." in text else int(text)


@rule(
    "generate-settings",
    "error",
    "dlmspec.generate_settings.GenerateConfig (LLaDA generate.py: block_length divides gen_length, "
    "steps a multiple of the blocks and at most gen_length; guidance is for mdm only)",
    "[generate] holds settings the sampler can run",
)
def _generate_settings(ctx: Context) -> Iterator[Finding]:
    table = ctx.spec.generate
    if table is None:
        return
    kind = ctx.spec.objective.kind
    values = table.model_dump(exclude={"preset"})  # the preset's settings are filled in already
    # GenerateConfig stops at its first error: apply each fix and check again, so every finding (and
    # the fix of each, given the fixes before it) is reported at once
    for _ in range(len(values)):
        try:
            GenerateConfig(kind=kind, mask_token_id=0 if objectives.get(kind).diffusion else None, **values)
            return
        except GenerateConfigError as exc:
            key = f"generate.{exc.field}"
            value = _fix_value(exc.field, exc.fix)
            why = str(exc).split(": ", 1)[-1].split("; use ")[0]
            yield Finding(key, why, f"use {exc.fix}", value=exc.value,
                          fix=Fix({key: value}) if value is not None else None)
            if value is None or exc.field not in values:
                return
            values[exc.field] = value


@rule(
    "generate-pipeline",
    "error",
    "dlmspec.backends.generate (sampler.generate, models.gpt_logits_fn): every denoising step calls the whole "
    "model and reads its logits on the same rank; pipeline-parallel generation (stages passing activations "
    "per step) is not built",
    "[generate] runs on a model of one pipeline stage (tensor parallelism is supported)",
)
def _generate_pipeline(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.generate is None or ctx.r.pp <= 1:
        return
    yield Finding(
        "parallel.pipeline_model_parallel_size",
        f"generation runs the model on one pipeline stage (embedding, every layer and the output layer on each "
        f"rank: each denoising step calls the whole model); this spec splits it over PP = {ctx.r.pp} stages",
        "remove generate from this spec and generate from its checkpoint loaded on one stage (`dlmspec generate` "
        "reads a checkpoint saved at any PP into one stage), or set "
        "parallel.pipeline_model_parallel_size = 1 and fit the model with tensor_model_parallel_size",
        fix=Fix(unset=("generate",)),
    )
