"""The issue registry: every check of a spec is a :class:`Rule` in :data:`RULES`, and
:func:`issues_for` runs the rules a command needs, as listed in :data:`SCOPES`.

A rule has a stable id (tests, ``--json`` and ``dlmspec show --rules`` use it), a severity, the
source it mirrors (the megatron-core or Megatron-LM check that raises on the same input, the
SLURM option, the runtime module that cannot run it, or the paper an objective comes from), a
one-line summary and a scope, which says what the rule looks at:

* ``load``: the loader reports these while reading the file (:mod:`dlmspec.spec.load`: syntax,
  schema, ``extends``, ``--set``); listed here, run there.
* ``spec``: the spec's values alone (the same verdict on every machine).
* ``paths``: files on this machine (data, tokenizer, checkpoints): the verdict depends on where
  it runs.
* ``slurm``: the ``[cluster.slurm]`` values ``launch.sbatch`` is rendered from.
* ``memory``: the planned memory per GPU (:mod:`dlmspec.plan`).
* ``runtime``: what the bundled runtime (``backends/megatron``) cannot run.

Every issue of every command is sorted by :func:`sort_key`: errors first, then file, line, key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal

from dlmspec.errors import Fix, Severity, SpecError, SpecIssue
from dlmspec.layout import expert_world_divides, world_divides
from dlmspec.spec.load import LoadedSpec, load
from dlmspec.resolve import Resolved, resolve

if TYPE_CHECKING:
    from dlmspec.spec.models import Spec

Scope = Literal["load", "spec", "paths", "slurm", "memory", "runtime"]

#: Every scope, in the order ``dlmspec show --rules`` lists them.
SCOPE_NAMES: tuple[Scope, ...] = ("load", "spec", "paths", "slurm", "memory", "runtime")

#: The scopes each command checks, in the order they run. A rule marked ``only_if_clean`` (the
#: memory rules) runs only when the scopes before its own found no error: a spec that breaks a
#: rule may have no layout to plan. ``compile`` refuses exactly what ``validate`` reports (and
#: ``new`` and ``submit`` check as ``compile`` does); ``plan`` leaves out files, SLURM and the
#: runtime (a plan of an RL spec is still a plan); ``search`` is what ``plan --search`` checks on
#: each candidate layout (it plans memory itself); ``spec`` is the spec's own values (what the
#: search checks at its neutral layout); ``sbatch`` is what ``launch.sbatch`` needs.
SCOPES: dict[str, tuple[Scope, ...]] = {"validate": ("spec", "paths", "slurm", "memory", "runtime")}
SCOPES["compile"] = SCOPES["validate"]
SCOPES["plan"] = ("spec", "memory")
SCOPES["search"] = ("spec", "runtime")
SCOPES["spec"] = ("spec",)
SCOPES["sbatch"] = ("slurm",)

_UNSET: Any = object()


@dataclass(frozen=True)
class Finding:
    """What a rule function yields: the key to point at, why, and a value that works.

    ``value`` defaults to the spec's value at ``key``; ``fix`` (the keys to set or remove that
    make the finding pass, see :class:`~dlmspec.errors.Fix`) to the rule's ``fix_keys``;
    ``hint`` to ``fix`` in words (:meth:`Fix.text`), else the rule's ``fix``; ``severity`` to
    the rule's (a rule whose verdict has an override, like ``memory-fits``, yields a warning
    where the spec accepts the risk). A hint written beside a ``fix`` names its keys and values
    (tests/integration/check/test_remedies_validate.py holds every rule to it): the fix is the hint's first
    choice, never the rejected value.
    """

    key: str
    message: str
    hint: str | None = None
    value: Any = _UNSET
    severity: Severity | None = None
    fix: Fix | None = None


@dataclass(frozen=True)
class Rule:
    """One check.

    Attributes:
        id: stable short id, e.g. ``"tp-divides-heads"``.
        severity: ``"error"`` or ``"warning"``: the severity of its findings (a finding may
            override it, see :class:`Finding`).
        source: what the rule mirrors (megatron-core module and function, Megatron-LM argument
            check, SLURM option, runtime module, or paper).
        summary: what holds when the rule is quiet, in one line (``dlmspec show --rules``).
        func: yields a :class:`Finding` per violation; reads a :class:`Context`. None for the
            ``load`` scope, whose issues the loader raises.
        scope: what the rule looks at (see the module docstring).
        fix: the hint of every finding that gives none (rules whose fix never varies).
        only_if_clean: run only when the scopes before this rule's found no error.
        fix_keys: the structured fix of every finding that gives none (the first choice of
            ``fix``, as keys to set or remove).
        needs_layout: the rule reads what the layout derives (the data-parallel size, the
            microbatches per step): it runs only when the layout is consistent
            (:func:`layout_consistent`); on an inconsistent one the derived sizes are rounded
            stand-ins, and its verdict and fix would be wrong (the layout's own error says what
            to change, batch size included).
    """

    id: str
    severity: Severity
    source: str
    summary: str
    func: Callable[["Context"], Iterator[Finding]] | None
    scope: Scope = "spec"
    fix: str | None = None
    only_if_clean: bool = False
    fix_keys: Fix | None = None
    needs_layout: bool = False


#: Every rule, in the order the modules of :mod:`dlmspec.check` register them.
RULES: dict[str, Rule] = {}


def rule(rule_id: str, severity: Severity, source: str, summary: str, *, scope: Scope = "spec",
         fix: str | None = None, only_if_clean: bool = False, fix_keys: Fix | None = None,
         needs_layout: bool = False) -> Callable:
    """Decorator registering a rule function in :data:`RULES` (see :class:`Rule`).

    Raises:
        ValueError: the id is registered already.
    """
    def register(func: Callable[["Context"], Iterator[Finding]]) -> Callable[["Context"], Iterator[Finding]]:
        add_rule(Rule(rule_id, severity, source, summary, func, scope, fix, only_if_clean, fix_keys, needs_layout))
        return func

    return register


def add_rule(entry: Rule) -> Rule:
    """Register ``entry`` in :data:`RULES`.

    Raises:
        ValueError: its id is registered already.
    """
    if entry.id in RULES:
        raise ValueError(f"duplicate rule id {entry.id}")
    RULES[entry.id] = entry
    return entry


@dataclass
class Context:
    """What a rule reads: the spec, its resolved values and (when loaded from a file) where
    each key was written. ``cache`` holds what several rules share (the memory plan)."""

    spec: Spec
    r: Resolved
    loaded: LoadedSpec | None = None
    cache: dict[str, Any] = field(default_factory=dict)

    def value(self, key: str) -> Any:
        """The spec's value at dotted ``key`` (``None`` past a missing table)."""
        node: Any = self.spec
        for part in key.split("."):
            if node is None:
                return None
            node = getattr(node, part)
        return node

    def is_set(self, key: str) -> bool:
        """Whether ``key`` was given (by the user, a preset or ``--set``) rather than defaulted."""
        parts = key.split(".")
        node: Any = self.spec
        for part in parts[:-1]:
            node = getattr(node, part, None)
            if node is None:
                return False
        return parts[-1] in node.model_fields_set

    def origin(self, key: str) -> tuple[str | None, int | None]:
        """(file, line) to report for ``key``: where it was written, else where the preset that
        supplied it was named, else its nearest written table."""
        if self.loaded is None:
            return (None, None)
        origins = self.loaded.origins
        if key in origins:
            return origins[key]
        if key.startswith("model.") and self.spec.model.preset and "model.preset" in origins:
            return origins["model.preset"]
        return self.loaded.locate(key)


def layout_consistent(r: Resolved) -> bool:
    """Whether the GPUs split into the layout: the world size is positive and a multiple of
    TP * PP * CP (megatron-core's ``initialize_model_parallel``) and of ETP * EP * PP (its expert
    groups). Otherwise :func:`dlmspec.resolve.resolve`'s data-parallel sizes and microbatches per
    step are rounded stand-ins, which the ``needs_layout`` rules must not judge."""
    world = r.world_size
    return (world >= 1 and r.tp >= 1 and r.pp >= 1 and r.cp >= 1 and r.ep >= 1 and r.etp >= 1
            and world_divides(world, r.tp, r.pp, r.cp) and expert_world_divides(world, r.etp, r.ep, r.pp))


def sort_key(issue: SpecIssue) -> tuple:
    """The one order of issues: errors first, then file, line (unknown last), key, rule, message."""
    return (
        0 if issue.severity == "error" else 1,
        issue.file or "",
        issue.line if issue.line is not None else 1 << 30,
        issue.key,
        issue.rule,
        issue.message,
    )


def find(scopes: Iterable[Scope], target: LoadedSpec | Spec, resolved: Resolved | None = None) -> list[SpecIssue]:
    """Run the rules of ``scopes`` (in that order) on a spec; never raises for a bad spec.

    Args:
        scopes: scope names (see :data:`SCOPES` for each command's).
        target: a :class:`~dlmspec.spec.load.LoadedSpec` (issues then carry file and line) or a
            bare :class:`~dlmspec.spec.models.Spec` (file and line are ``None``).
        resolved: ``resolve(spec)``, if the caller already has it.

    Returns:
        The issues, sorted by :func:`sort_key`.
    """
    loaded = target if isinstance(target, LoadedSpec) else None
    spec = target.spec if isinstance(target, LoadedSpec) else target
    ctx = Context(spec=spec, r=resolved if resolved is not None else resolve(spec), loaded=loaded)
    found: list[SpecIssue] = []
    consistent = layout_consistent(ctx.r)
    for scope in scopes:
        clean = not any(i.severity == "error" for i in found)
        for entry in RULES.values():
            if entry.scope != scope or entry.func is None or (entry.only_if_clean and not clean):
                continue
            if entry.needs_layout and not consistent:
                continue  # the layout's own error (world-divisible-by-*) is reported instead
            for f in entry.func(ctx):
                file, line = ctx.origin(f.key)
                fix = f.fix if f.fix is not None else entry.fix_keys
                hint = f.hint if f.hint is not None else (fix.text() if f.fix is not None else entry.fix)
                found.append(SpecIssue(
                    key=f.key,
                    message=f.message,
                    value=ctx.value(f.key) if f.value is _UNSET else f.value,
                    hint=hint if hint is not None else (fix.text() if fix is not None else None),
                    fix=fix,
                    severity=f.severity or entry.severity,
                    rule=entry.id,
                    source=entry.source,
                    file=file,
                    line=line,
                ))
    return sorted(found, key=sort_key)


def issues_for(command: str, target: LoadedSpec | Spec, resolved: Resolved | None = None) -> list[SpecIssue]:
    """Every issue ``command`` reports for a spec: :func:`find` over ``SCOPES[command]``. What
    ``dlmspec validate`` reports, ``compile`` refuses (the same scopes), so they cannot disagree.

    Raises:
        KeyError: ``command`` is not in :data:`SCOPES`.
    """
    return find(SCOPES[command], target, resolved)


def with_rule_issues(error: SpecError, command: str) -> SpecError:
    """A loader's schema error plus what ``command``'s rules find in the rest of the spec, so
    one run reports every problem.

    The rules run on ``error.partial`` (the spec without the rejected keys, which take their
    defaults); their findings about a rejected key, or a key under it, are left out, since
    they would describe the default, not what the user wrote. Returns ``error`` itself, its
    ``rules_skipped`` set, when there is no partial spec or it cannot be resolved.
    """
    if error.partial is None:
        error.rules_skipped = True
        return error
    try:
        extra = issues_for(command, error.partial)
    except Exception:  # noqa: BLE001 - a partial spec that cannot be resolved adds nothing
        error.rules_skipped = True
        return error
    rejected = tuple(error.dropped)
    keep = [i for i in extra
            if not any(i.key == k or i.key.startswith(k + ".") or k.startswith(i.key + ".") for k in rejected)]
    return SpecError(sorted(error.issues + keep, key=sort_key))


def load_for(command: str, path: str | Path, overrides: list[str] | tuple[str, ...] = (), *,
             fast: bool = False) -> tuple[LoadedSpec, Resolved, list[SpecIssue]]:
    """Load a spec file with ``--set`` ``overrides``, resolve it and find what ``command``
    reports (:func:`issues_for`): how ``dlmspec validate`` and ``dlmspec compile`` both start.
    ``fast``: load a plainly valid spec without pydantic (:func:`dlmspec.spec.load.load`'s
    ``fast``; the result is the same).

    Returns:
        (loaded, resolved, issues); the caller decides what stops it.

    Raises:
        SpecError: the file does not load (a ``load`` issue), with what ``command``'s rules find
            in the rest of the spec (:func:`with_rule_issues`).
    """
    try:
        loaded = load(path, list(overrides), fast=fast)
    except SpecError as exc:
        raise with_rule_issues(exc, command) from None
    resolved = resolve(loaded.spec)
    return loaded, resolved, issues_for(command, loaded, resolved)
