"""The body of ``dlmspec validate`` (and ``check``): load, resolve, check as ``compile`` does,
plan the memory, print one ``ok:`` line. :func:`dlmspec.cli.main` runs it without typer for the
plain forms; :mod:`dlmspec.cli.commands` declares the typer command around it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlmspec.check import issues_for, load_for
from dlmspec.cli.output import human_count, print_envelope, printable, progress, report_warnings
from dlmspec.errors import SpecError, SpecIssue, display_path
from dlmspec.wording import count

if TYPE_CHECKING:
    from dlmspec.resolve import Resolved
    from dlmspec.spec.load import LoadedSpec


def spec_issues(loaded: LoadedSpec, resolved: Resolved) -> list[SpecIssue]:
    """Every issue between this spec and a running job: what ``dlmspec validate`` reports and
    ``dlmspec compile`` refuses (:func:`dlmspec.check.issues_for`: rules, paths, SLURM
    settings, memory, the runtime's gaps), sorted errors first, then by file, line and key.
    ``dlmspec new`` uses it."""
    return issues_for("validate", loaded, resolved)


def load_and_check(path: str, overrides: list[str], *, strict: bool = False,
                   fast: bool = False) -> tuple[LoadedSpec, Resolved, list[SpecIssue]]:
    """Load ``path`` with ``--set`` ``overrides``, resolve it and check it as ``dlmspec
    compile`` does (:func:`dlmspec.check.load_for` with ``validate``'s scopes, which are
    ``compile``'s). ``fast``: load a plainly valid spec without pydantic
    (:func:`dlmspec.spec.load.load`'s ``fast``).

    Returns:
        (loaded, resolved, warnings).

    Raises:
        SpecError: the spec does not load, or has an error (or, with ``strict``, a warning).
    """
    loaded, resolved, issues = load_for("validate", path, overrides, fast=fast)
    if any(i.severity == "error" for i in issues) or (strict and issues):
        raise SpecError(issues)
    return loaded, resolved, issues


def _memory(resolved: Resolved) -> dict[str, int] | None:
    """Planned peak per GPU and the GPU's memory, bytes (None for a GPU outside the catalog)."""
    if resolved.gpu is None:
        return None
    from dlmspec.plan import make_plan

    return {"peak_bytes": int(round(make_plan(resolved).peak_bytes)), "capacity_bytes": int(resolved.gpu.memory_bytes)}


def run_validate(spec: str, overrides: list[str], *, strict: bool = False, json_output: bool = False,
                 command: str = "validate") -> None:
    """Body of ``dlmspec validate`` (and ``check``): load ``spec`` with the ``--set``
    ``overrides``, check it as ``compile`` does (:func:`load_and_check`) and plan its memory;
    print one ``ok:`` line (warnings on stderr) that ends with the layer path train.py takes
    (``transformer_impl``, resolved, and why), or with ``json_output`` the envelope of
    ``command`` (:func:`dlmspec.cli.output.envelope`; ``result``: ``spec``, ``name``,
    ``derived``, ``memory``) on stdout.

    Raises:
        SpecError: the spec has an error (or, with ``strict``, a warning); the caller prints it
            (:func:`report_issues`) and exits 2.
    """
    from dlmspec.spec.python_load import sweep_targets

    members = sweep_targets(spec, overrides)
    if len(members) > 1:
        _validate_sweep(members, overrides, strict=strict, json_output=json_output, command=command)
        return
    _validate_one(spec, overrides, strict=strict, json_output=json_output, command=command)


def member_issues(target: str, issues: list[SpecIssue]) -> list[SpecIssue]:
    """``issues`` of the sweep member ``target`` (``FILE.py::NAME``), each file named
    ``FILE.py::NAME`` so a table of several members tells them apart."""
    _, _, name = target.rpartition("::")
    for issue in issues:
        if issue.file and "::" not in issue.file and issue.file.endswith(".py"):
            issue.file = f"{issue.file}::{name}"
        elif not issue.file:
            issue.file = target
    return issues


def _validate_sweep(members: list[str], overrides: list[str], *, strict: bool, json_output: bool,
                    command: str) -> None:
    """Validate each member of a sweep (one ``ok:`` line each, or with ``json_output`` one
    envelope whose ``result.sweep`` lists the members' results); every member's issues are
    raised together at the end."""
    failed: list[SpecIssue] = []
    results = []
    warnings_all: list[SpecIssue] = []
    for target in progress(members, f"validating {len(members)} members"):
        try:
            loaded, resolved, warnings = load_and_check(target, overrides, strict=strict, fast=True)
        except SpecError as exc:
            failed.extend(member_issues(target, exc.issues))
            continue
        warnings_all.extend(member_issues(target, warnings))
        if json_output:
            results.append({"spec": display_path(target), "name": loaded.spec.name,
                            "derived": resolved.derived(), "memory": _memory(resolved)})
        else:
            report_warnings(warnings)
            print(_ok_line(loaded, resolved))
    if failed:
        raise SpecError(failed + warnings_all)
    if json_output:
        print_envelope(command, ok=True, issues=warnings_all, result={"sweep": results})


def _validate_one(spec: str, overrides: list[str], *, strict: bool, json_output: bool, command: str) -> None:
    loaded, resolved, warnings = load_and_check(spec, overrides, strict=strict, fast=True)
    memory = _memory(resolved)
    if json_output:
        print_envelope(command, ok=True, issues=warnings,
                       result={"spec": display_path(str(loaded.path)), "name": loaded.spec.name,
                               "derived": resolved.derived(), "memory": memory})
        return
    report_warnings(warnings)
    print(_ok_line(loaded, resolved))


def _ok_line(loaded: LoadedSpec, resolved: Resolved) -> str:
    """``validate``'s ``ok:`` line of one spec."""
    from dlmspec.gpus import GiB

    memory = _memory(resolved)
    p = resolved.params
    active = f" ({human_count(p.active)} active)" if p.active != p.total else ""
    fits = (f"; planned peak {memory['peak_bytes'] / GiB:.1f} of {memory['capacity_bytes'] / GiB:.1f} GiB per GPU"
            if memory else "")
    return (
        f"ok: {printable(loaded.spec.name)}: {human_count(p.total)} parameters{active}, "
        f"{count(resolved.world_size, 'GPU')} as TP {resolved.tp} x PP {resolved.pp} x CP {resolved.cp} "
        f"x DP {resolved.dp}, {count(resolved.num_microbatches, 'microbatch')} per step, "
        f"{resolved.train_iters:,} steps of {resolved.tokens_per_step:,} tokens{fits}; "
        f"layers: {resolved.transformer_impl} ({resolved.transformer_impl_reason})"
    )
