"""Rules of the planned memory per GPU (scope ``memory``): the peak of :func:`dlmspec.plan.make_plan`
against the GPU's memory. They run only on a spec the rules before them found no error in (a
spec that breaks a rule may have no layout to plan) and a GPU of the catalog (``unknown-gpu``
reports the others)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterator

from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.plan import HEADROOM_WARNING, Plan, PlanError, gib_text, make_plan, memory_fits

_SOURCE = "dlmspec.plan.memory (Korthikanti et al. 2022; megatron-core DDP and DistributedOptimizer)"


def _plan(ctx: Context) -> Plan | PlanError | None:
    """The spec's plan (made once per :class:`Context`), the :class:`PlanError` that stopped it,
    or None for a GPU outside the catalog."""
    if ctx.r.gpu is None:
        return None
    if "plan" not in ctx.cache:
        try:
            ctx.cache["plan"] = make_plan(ctx.r)
        except PlanError as exc:  # a spec the planner cannot model: what compile's plan.json would hit
            ctx.cache["plan"] = exc
    return ctx.cache["plan"]


def _summary(plan: Plan) -> str:
    """The peak's parts: weights, gradients, optimizer, activations, logits, transients, other."""
    b = plan.memory.peak.breakdown
    parts = [
        ("weights", b["weights"]),
        ("gradients", b["gradients"]),
        ("optimizer", b["optimizer_states"]),
        ("activations", b["activations"] + b["embedding_output_activations"] + b["batch_and_objective"]),
        ("logits", b["loss_logits"]),
        ("transients", b["backward_transient"] + b["optimizer_step_transient"]),
    ]
    rest = plan.peak_bytes - sum(v for _, v in parts)
    text = ", ".join(f"{name} {gib_text(v)}" for name, v in parts if v > 0)
    return f"{text}, other {gib_text(rest)}"


#: One ``--set key=value`` of the planner's advice (:func:`dlmspec.plan.memory_fits`).
_SET_ARG = re.compile(r"--set ([\w.]+)=(\S+)")


def _advice_fix(advice: list[str]) -> Fix | None:
    """The first (fastest) change of the planner's advice as a :class:`Fix`: its ``--set``
    arguments (values as :func:`dlmspec.plan.set_args` writes them: true/false, integers,
    bare words). None when the advice holds no change."""
    for line in advice:
        pairs = _SET_ARG.findall(line)
        if not pairs:
            continue
        values: dict[str, Any] = {}
        for key, text in pairs:
            values[key] = (text == "true") if text in ("true", "false") else int(text) if text.isdigit() else text
        return Fix(values)
    return None


def _where(plan: Plan) -> str:
    return f" on pipeline stage {plan.memory.peak.stage}" if plan.layout.pp > 1 else ""


@rule(
    "memory-fits",
    "error",
    _SOURCE,
    "the planned peak memory per GPU fits the GPU (a warning with cluster.allow_memory_overflow = true)",
    scope="memory",
    only_if_clean=True,
)
def _memory_fits(ctx: Context) -> Iterator[Finding]:
    plan = _plan(ctx)
    if not isinstance(plan, Plan):
        return
    fits, advice = memory_fits(plan)
    if fits:
        return
    gpu = plan.gpu
    accepted = ctx.spec.cluster.allow_memory_overflow
    fix = _advice_fix(advice)
    yield Finding(
        "cluster.gpu",
        f"planned peak memory {gib_text(plan.peak_bytes)} per GPU{_where(plan)} ({_summary(plan)}) exceeds "
        f"the {gib_text(gpu.memory_bytes)} of one {gpu.name}"
        + ("; accepted: cluster.allow_memory_overflow = true" if accepted else ""),
        "; or ".join(advice) + ("" if accepted else "; or, if a measured run fits, set cluster.allow_memory_overflow = true"),
        severity="warning" if accepted else "error",
        fix=fix,
    )


@rule(
    "memory-headroom",
    "warning",
    _SOURCE,
    f"the planned peak memory per GPU is at most {HEADROOM_WARNING:.0%} of the GPU's (allocator fragmentation "
    "and unplanned workspaces need the rest)",
    scope="memory",
    only_if_clean=True,
)
def _memory_headroom(ctx: Context) -> Iterator[Finding]:
    plan = _plan(ctx)
    if not isinstance(plan, Plan) or not plan.fits:
        return
    gpu = plan.gpu
    if plan.peak_bytes > HEADROOM_WARNING * gpu.memory_bytes:
        # the planner's advice for a GPU of HEADROOM_WARNING of this one's memory: changes that leave headroom
        within = dataclasses.replace(gpu, memory_bytes=int(HEADROOM_WARNING * gpu.memory_bytes))
        _, advice = memory_fits(dataclasses.replace(plan, gpu=within))
        fix = _advice_fix(advice)
        yield Finding(
            "cluster.gpu",
            f"planned peak memory {gib_text(plan.peak_bytes)} per GPU{_where(plan)} is within "
            f"{100 * (1 - HEADROOM_WARNING):.0f}% of the {gib_text(gpu.memory_bytes)} of one {gpu.name}",
            "leave headroom: enable recomputation or a smaller micro batch (dlmspec plan SPEC shows the breakdown)"
            + (f"; the fastest that does: {advice[0]}" if fix else ""),
            fix=fix,
        )


@rule(
    "plan",
    "error",
    "dlmspec.plan.make_plan",
    "the planner can model the spec (compile writes its plan.json)",
    scope="memory",
    only_if_clean=True,
)
def _plannable(ctx: Context) -> Iterator[Finding]:
    plan = _plan(ctx)
    if isinstance(plan, PlanError):
        yield Finding("<plan>", f"cannot plan this spec: {plan}", value=None)
