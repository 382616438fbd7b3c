"""Training stages by ``[stage] kind``: the compiler's half of the stage seam.

A stage is one entry here (:class:`StageKind`) plus its runtime class in
:data:`dlmspec.backends.megatron.stages.STAGES` under the same kind. The entry says what the
compiled ``train.py`` needs to build the stage: the imports of its options (``[stage.sft]`` ->
``SftConfig``), the template partial that writes the options builder, and the call that gives the
options to ``STAGES[kind](run, options)``. Its planner terms (e.g. a frozen reference model's
memory) register in :mod:`dlmspec.plan.memory` (:func:`~dlmspec.plan.memory.register_stage_memory_term`).
``validate`` refuses a kind that is not registered (rule ``stage-kind-known``) and a kind the
runtime cannot train (``runtime = False``: rule ``stage-kind-known``).

Pure Python (no torch, no pydantic): the fast ``validate`` path imports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CALL = re.compile(r"^(None|[A-Za-z_][A-Za-z0-9_]*\(\))$")
_KIND = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclass(frozen=True)
class StageKind:
    """One ``[stage] kind`` the compiler knows.

    Attributes:
        kind: The spec value (lowercase letters, digits, ``_`` and ``-``).
        summary: One line for messages (``validate`` lists the known kinds with it).
        runtime: Whether the runtime trains it (``False``: ``validate`` refuses it, rule ``stage-kind-known``).
        imports: ``(module, name)`` pairs ``train.py`` imports, as ``from module import name``;
            ``name = ""`` imports the module alone (a module that registers a runtime stage of
            another package with :func:`dlmspec.backends.megatron.stages.register_stage`).
        template: A template under ``templates/`` included into ``train.py`` that defines the
            options builder (it reads ``stage.table``), or ``None``.
        options_call: The expression ``train.py`` passes as the stage's options: ``"None"`` or a
            call of a function without arguments that ``template`` defines (``"build_sft()"``).
        template_values: ``resolved -> stage.table`` for ``template`` (``None``: no values).
        section: The ``[stage.<section>]`` table of the kind's options (``None``: it has none) and
            the name of its model in :mod:`dlmspec.spec.models` (``"SFTSpec"``).
        resolve_values: ``(spec, table, defaults) -> values`` that :func:`dlmspec.resolve.resolve`
            keeps (``Resolved.stage_values``), ``table`` being the ``section`` table with its
            defaults filled (``None`` without a section) and ``defaults(model_name)`` another
            section's defaults (``"GenerateSpec"``); ``None``: the stage keeps no values.
    """

    kind: str
    summary: str
    runtime: bool = True
    imports: Tuple[Tuple[str, str], ...] = ()
    template: Optional[str] = None
    options_call: str = "None"
    template_values: Optional[Callable[[Any], Any]] = None
    section: Optional[Tuple[str, str]] = None
    resolve_values: Optional[Callable[[Any, Any, Callable[[str], Any]], Any]] = None


#: ``[stage] kind`` -> :class:`StageKind`, in registration order.
STAGE_KINDS: Dict[str, StageKind] = {}


def register_stage_kind(entry: StageKind) -> StageKind:
    """Add ``entry`` (replacing one of the same kind: a module imported twice registers again).

    What reaches ``train.py`` is checked here, since it is written there as code: module and
    names are Python identifiers, ``options_call`` is ``None`` or ``name()``.

    Raises:
        ValueError: a kind, module, name or call of another form, or ``options_call`` without a
            template that could define it.
    """
    if not _KIND.match(entry.kind or ""):
        raise ValueError(f"stage kind {entry.kind!r}: lowercase letters, digits, '_' and '-', starting with a letter")
    for module, name in entry.imports:
        if not _MODULE.match(module) or (name and not _NAME.match(name)):
            raise ValueError(f"stage {entry.kind!r}: import ({module!r}, {name!r}) is not a module and a name")
    if not _CALL.match(entry.options_call):
        raise ValueError(f"stage {entry.kind!r}: options_call {entry.options_call!r} is not 'None' or 'name()'")
    if entry.options_call != "None" and entry.template is None:
        raise ValueError(f"stage {entry.kind!r}: options_call {entry.options_call!r} needs a template defining it")
    STAGE_KINDS[entry.kind] = entry
    return entry


def stage_kind(kind: str) -> Optional[StageKind]:
    """The entry of ``kind``, or ``None`` when no stage of that kind is registered."""
    return STAGE_KINDS.get(kind)


def known_kinds() -> str:
    """The registered kinds for a message: ``'pretrain', 'sft', 'rl'``."""
    return ", ".join(repr(k) for k in STAGE_KINDS)


def template_context(resolved: Any) -> Dict[str, Any]:
    """What ``train.py.j2`` reads of the stage (``stage``): ``kind``, ``imports``, ``template``,
    ``options_call`` and ``table`` (the entry's ``template_values(resolved)``).

    Raises:
        KeyError: the spec's kind is not registered (``validate`` refuses it first).
    """
    entry = STAGE_KINDS[resolved.spec.stage.kind]
    values = entry.template_values(resolved) if entry.template_values is not None else None
    return {"kind": entry.kind, "imports": list(entry.imports), "template": entry.template,
            "options_call": entry.options_call, "table": values}


def _resolved_values(resolved: Any) -> Dict[str, Any]:
    """The stage's values, which resolve fills (``Resolved.stage_values``: the registration's ``resolve_values``)."""
    return resolved.stage_values


def sft_pad_eos_tokens(table: Any, objective_kind: str) -> Optional[int]:
    """The padding EOS an SFT sample supervises, of ``[stage.sft]`` ``table`` (``pad_eos_tokens``;
    ``None``: all).

    Unset: all for mdm (LLaDA, Nie et al. 2025, sec. 2.3: padding EOS are response tokens, so the
    model learns to fill its fixed generation length with EOS), 0 for ar (the conversation's own
    final EOD, supervised by its response mask, teaches an AR decoder to stop; EOS after EOS
    would only add easy tokens to the loss).
    """
    from dlmspec import objectives

    value = table.pad_eos_tokens
    if value is not None:
        return int(value)
    return None if objectives.get(objective_kind).diffusion else 0


def _sft_resolve_values(spec: Any, table: Any, defaults: Callable[[str], Any]) -> Dict[str, Any]:
    """``[stage.sft]`` with its defaults filled and the resolved ``pad_eos_tokens``."""
    return {"section": table, "pad_eos_tokens": sft_pad_eos_tokens(table, spec.objective.kind)}


register_stage_kind(StageKind("pretrain", "pre-training on packed documents (backends/megatron/stage.py)"))
register_stage_kind(StageKind(
    "sft", "supervised fine-tuning on conversations with response masks (backends/megatron/sft.py)",
    imports=(("dlmspec.backends.megatron.sft", "SftConfig"),), template="stage_sft.py.j2",
    options_call="build_sft()", template_values=_resolved_values, section=("sft", "SFTSpec"),
    resolve_values=_sft_resolve_values))


def _rl_resolve_values(spec: Any, table: Any, defaults: Callable[[str], Any]) -> Dict[str, Any]:
    """``[stage.rl]`` with defaults, its estimator, rewards and the rollout sampler's ``[generate]``
    settings (:func:`dlmspec.rl.rollout_values`)."""
    from dlmspec.rl import rollout_values

    gen = spec.generate if spec.generate is not None else defaults("GenerateSpec")
    return rollout_values(table, gen)


register_stage_kind(StageKind(
    "rl", "reinforcement learning from verifiable rewards: GRPO, diffu-GRPO, coupled-GRPO (backends/rl/stage.py)",
    imports=(("dlmspec.backends.rl.stage", "RLConfig"),), template="stage_rl.py.j2",
    options_call="build_rl()", template_values=_resolved_values, section=("rl", "RLSpec"),
    resolve_values=_rl_resolve_values))
