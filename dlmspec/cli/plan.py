"""``dlmspec plan``: what the command does (the typer declaration lives in
:mod:`dlmspec.cli.commands`; :func:`dlmspec.cli.main` calls :func:`run_plan` directly for the plain
forms, without typer).

``dlmspec plan SPEC`` prints the memory and time breakdown; ``--json`` prints the envelope
(:func:`dlmspec.cli.output.envelope`) whose ``result`` is :meth:`dlmspec.plan.Plan.to_dict` plus
``spec`` (``--search``: ``spec`` and ``search``). A spec that breaks a
cross-field rule (:mod:`dlmspec.check`, ``plan``'s scopes) exits 2 with the usual issue table; a
spec that does not fit prints its plan, the ``memory-fits`` issue (with what would make it fit)
and exits 2. What ``dlmspec validate`` (and ``compile``) would refuse beyond that (files, SLURM
settings, the runtime's gaps such as an unimplemented stage: :func:`validate_refusals`) is printed
as warnings beside the plan: the plan of such a spec is still a plan, and exits 0.

A Python sweep (:func:`dlmspec.spec.python_load.sweep_targets`) is planned member by member:
one row each (:func:`_plan_sweep`), or with ``--search`` one search each (:func:`_search_sweep`).

``dlmspec plan SPEC --search`` ranks the layouts that fit (:func:`dlmspec.plan.search.search`).
The spec is validated at a neutral layout (:func:`dlmspec.plan.search.spec_issues_for_search`):
only errors that remain there, on keys the search does not set, stop it; errors that come from
the spec's own layout (a TP that does not divide the heads or the FFN, say, whatever key the rule
names) are printed as the spec's, apart from the layouts found. It exits 2 when no layout fits.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dlmspec.check import SCOPES, find, issues_for, sort_key
from dlmspec.cli.output import (_text, print_envelope, progress, report_issues, report_warnings, stderr,
                                stdout)
from dlmspec.errors import EXIT_USAGE, SpecError, SpecIssue, display_path
from dlmspec.spec.load import load
from dlmspec.plan import PlanError, make_plan
from dlmspec.resolve import resolve


#: Layouts ``plan --search`` ranks when ``--top`` is not given.
DEFAULT_TOP = 5


def run_plan(spec: str, overrides: list[str], json_output: bool, search: bool, top: int | None) -> int:
    """Body of ``dlmspec plan`` (see the module docstring). The caller has told the error
    handler about ``json_output`` (:func:`dlmspec.cli.output.use_json`). ``top`` (``--top``,
    ``None`` when not given: :data:`DEFAULT_TOP`) implies ``search``: ranking layouts is what
    ``--search`` does, so a ``--top`` without it is never silently ignored.

    Returns:
        The exit code: 0, or 2 (:data:`~dlmspec.errors.EXIT_USAGE`) when the plan does not fit
        or the search finds no layout (after printing the plan or the search).

    Raises:
        SpecError: the spec does not load or has a blocking error (the CLI prints it, exit 2).
    """
    if top is not None and top < 1:
        raise SpecError([SpecIssue("--top", "must be at least 1", value=top, hint="e.g. --top 5", rule="arguments")])
    search = search or top is not None
    top = DEFAULT_TOP if top is None else top
    from dlmspec.spec.python_load import sweep_targets

    members = sweep_targets(spec, overrides)
    if len(members) > 1:
        if search:
            return _search_sweep(members, overrides, json_output, top)
        return _plan_sweep(members, overrides, json_output)
    loaded = load(spec, overrides, fast=True)
    resolved = resolve(loaded.spec)
    # plan's scopes: the spec's rules and, when they find no error, memory (a spec with errors
    # may have no layout to plan). Files, SLURM and the runtime's gaps are validate's: a plan of
    # an RL spec is still a plan, so what validate refuses there comes as warnings.
    issues = issues_for("plan", loaded, resolved)
    errors = [i for i in issues if i.severity == "error"]
    if not search:
        issues = sorted(issues + validate_refusals(loaded, resolved), key=sort_key)
    warnings = [i for i in issues if i.severity != "error"]
    if search:
        from dlmspec.plan.search import spec_issues_for_search

        blocking, own_layout = spec_issues_for_search(loaded, resolved, issues)
        if blocking:
            raise SpecError(blocking + warnings)
        return _run_search(resolved, loaded, json_output, top, own_layout)
    blocking = [e for e in errors if not e.rule.startswith("memory-")]
    if blocking:
        raise SpecError(issues)
    try:
        plan = make_plan(resolved)
    except PlanError as exc:
        raise SpecError([SpecIssue("cluster.gpu", str(exc), value=resolved.spec.cluster.gpu, rule="plan")]) from None
    memory_errors = [e for e in errors if e.rule.startswith("memory-")]
    repeated = _repetition(loaded.spec, resolved)
    if json_output:
        print_envelope("plan", ok=not memory_errors, issues=issues,
                       result={"spec": display_path(str(loaded.path)), **plan.to_dict(),
                               "data": None if repeated is None else repeated.to_dict()})
    else:
        from dlmspec.plan.report import print_plan, repetition_renderable

        report_warnings(warnings)
        print_plan(plan, stdout())
        if repeated is not None:
            stdout().print(repetition_renderable(repeated), soft_wrap=True)
        if memory_errors:
            report_issues(memory_errors)
    return EXIT_USAGE if memory_errors else 0


#: What ``validate`` checks and ``plan`` does not stop on: its scopes beyond plan's, in its order.
EXTRA_SCOPES = tuple(scope for scope in SCOPES["validate"] if scope not in SCOPES["plan"])


def validate_refusals(loaded: Any, resolved: Any) -> list[SpecIssue]:
    """What ``dlmspec validate`` (and ``compile``) reports for ``loaded`` beyond ``plan``'s own
    rules: the registry's rules of :data:`EXTRA_SCOPES` (files on this machine, SLURM settings,
    the runtime's gaps: :data:`dlmspec.check.SCOPES`), run by the same :func:`dlmspec.check.find`.
    Each error comes back as a warning whose message says that validate and compile refuse it
    (``plan`` still plans the spec); validate's warnings of those scopes (a data path not on this
    machine, say) are not refusals and are left to validate."""
    return [replace(issue, severity="warning",
                    message=f"{issue.message} (dlmspec validate and compile refuse this spec)")
            for issue in find(EXTRA_SCOPES, loaded, resolved) if issue.severity == "error"]


def _search_result(resolved: Any, top: int, own_layout: list[SpecIssue]) -> Any:
    """:func:`dlmspec.plan.search.search` of ``resolved`` with the spec's own-layout errors
    filled in. Raises SpecError: the GPU is not in the catalog."""
    from dlmspec.plan.search import search

    try:
        result = search(resolved, top=top)
    except PlanError as exc:
        raise SpecError([SpecIssue("cluster.gpu", str(exc), value=resolved.spec.cluster.gpu, rule="plan")]) from None
    result.spec_layout_issues = list(own_layout)
    return result


def _run_search(resolved: Any, loaded: Any, json_output: bool, top: int, own_layout: list[SpecIssue]) -> int:
    result = _search_result(resolved, top, own_layout)
    if json_output:
        print_envelope("plan", ok=bool(result.top), issues=[] if result.top else [nothing_fits(resolved, result)],
                       result={"spec": display_path(str(loaded.path)), "search": result.to_dict()})
    else:
        from dlmspec.plan.report import print_search

        print_search(result, top, stdout())
        if not result.top:
            stderr().print(_text("no layout found (exit 2)", style="bold red"))
    return 0 if result.top else EXIT_USAGE


def nothing_fits(resolved: Any, result: Any) -> SpecIssue:
    """The issue of a search that found no layout (``--json``: ``ok`` false names why; also
    :func:`dlmspec.dsl.layouts`'s)."""
    return SpecIssue("--search", result.message or "no layout fits", value=resolved.spec.cluster.gpu,
                     hint="more GPUs (cluster.nodes, cluster.gpus_per_node), a GPU with more memory (cluster.gpu), "
                          "or a smaller model or train.seq_length", rule="plan-search",
                     source="dlmspec.plan.search")


def _search_sweep(members: list[str], overrides: list[str], json_output: bool, top: int) -> int:
    """``dlmspec plan SWEEP.py --search``: each member searched as ``dlmspec plan MEMBER
    --search`` would (its model, cluster and batch; the layouts it was given do not matter), in
    the sweep's order: one titled search per member, or with ``json_output`` the envelope whose
    ``result.sweep`` holds ``{"spec", "search"}`` per member. Exit 2 when no layout fits a member.

    Raises:
        SpecError: a member does not load or has an error the search cannot fix (every member's
            issues at once).
    """
    from dlmspec.cli.validate import member_issues
    from dlmspec.plan.search import spec_issues_for_search

    found, failed, warnings = [], [], []
    for target in progress(members, f"searching {len(members)} members"):
        try:
            loaded = load(target, overrides, fast=True)
            resolved = resolve(loaded.spec)
            issues = issues_for("plan", loaded, resolved)
            blocking, own_layout = spec_issues_for_search(loaded, resolved, issues)
            if blocking:
                raise SpecError(blocking)
            result = _search_result(resolved, top, own_layout)
        except SpecError as exc:
            failed.extend(member_issues(target, exc.issues))
            continue
        warnings.extend(member_issues(target, [i for i in issues if i.severity != "error"]))
        found.append((target, loaded.spec.name, resolved, result))
    if failed:
        raise SpecError(failed + warnings)
    empty = [member_issues(t, [nothing_fits(r, res)])[0] for t, _, r, res in found if not res.top]
    if json_output:
        print_envelope("plan", ok=not empty, issues=empty + warnings,
                       result={"sweep": [{"spec": display_path(t), "search": res.to_dict()} for t, _, _, res in found]})
    else:
        from dlmspec.plan.report import print_search

        report_warnings(warnings)
        out = stdout()
        for index, (target, name, _, result) in enumerate(found, start=1):
            out.print(_text(f"{name} (member {index} of {len(found)}: {display_path(target)})", style="bold"))
            print_search(result, top, out)
            if not result.top:
                stderr().print(_text(f"{name}: no layout found", style="bold red"))
        if empty:
            stderr().print(_text(f"no layout found for {len(empty)} of {len(found)} members (exit 2)", style="bold red"))
    return EXIT_USAGE if empty else 0


def _repetition(spec: Any, resolved: Any) -> Any:
    """The run's epochs and unique tokens (:func:`dlmspec.data.repetition.repetition`; None with
    mock data)."""
    from dlmspec.data.repetition import repetition

    return repetition(spec, resolved)


def _plan_sweep(members: list[str], overrides: list[str], json_output: bool) -> int:
    """``dlmspec plan SWEEP.py``: one table of the study (:mod:`dlmspec.plan.study`): per member
    N (non-embedding parameters) beside the total, training FLOPs, tokens, epochs, GPU-hours,
    MFU, peak memory per GPU, whether it fits and the time to train, in the sweep's order, then
    the study's total GPU-hours; or with ``json_output`` the envelope whose ``result.sweep``
    holds each member's plan (as ``dlmspec plan MEMBER --json``'s result) and ``result.study``
    the same numbers as the table (:func:`dlmspec.plan.study.study_dict`). Exit 2 when a member
    does not fit.

    Raises:
        SpecError: a member does not load or breaks a rule (every member's issues at once).
    """
    from dlmspec.cli.validate import member_issues
    from dlmspec.plan.study import study_dict, study_row

    rows, plans, failed, warnings = [], [], [], []
    for target in progress(members, f"planning {len(members)} members"):
        try:
            loaded = load(target, overrides, fast=True)
            resolved = resolve(loaded.spec)
            issues = issues_for("plan", loaded, resolved)
            blocking = [i for i in issues if i.severity == "error" and not i.rule.startswith("memory-")]
            if blocking:
                raise SpecError(issues)
            plan = make_plan(resolved)
        except SpecError as exc:
            failed.extend(member_issues(target, exc.issues))
            continue
        except PlanError as exc:
            failed.append(member_issues(target, [SpecIssue("cluster.gpu", str(exc), rule="plan")])[0])
            continue
        warnings.extend(member_issues(target, [i for i in issues if i.severity != "error"]
                                      + validate_refusals(loaded, resolved)))
        repeated = _repetition(loaded.spec, resolved)
        plans.append({"spec": display_path(target), **plan.to_dict(),
                      "data": None if repeated is None else repeated.to_dict()})
        rows.append(study_row(loaded.spec.name, display_path(target), resolved, plan, repeated))
    if failed:
        raise SpecError(failed + warnings)
    fits = all(p["memory"]["fits"] for p in plans)
    if json_output:
        print_envelope("plan", ok=fits, issues=warnings, result={"sweep": plans, "study": study_dict(rows)})
    else:
        from dlmspec.plan.report import study_renderable

        report_warnings(warnings)
        stdout().print(study_renderable(rows, f"sweep of {len(rows)} specs (dlmspec plan FILE.py::MEMBER for one "
                                              "breakdown)"))
        for line, style in _calibration_lines([(r.name, p["provenance"]["calibration"]) for r, p in zip(rows, plans)]):
            stdout().print(_text(line, style=style), soft_wrap=True)
    return 0 if fits else EXIT_USAGE


def _calibration_lines(members: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    """The sweep's ``calibration:`` line(s) (``(text, style)``): one when every member was planned with
    the same constants (each member's ``provenance.calibration``), else one per member, named."""
    def style(cal: dict[str, Any]) -> str:
        return "dim" if cal["status"] == "calibrated" else "yellow"

    if len({cal["text"] for _, cal in members}) == 1:
        return [(f"calibration: {members[0][1]['text']}", style(members[0][1]))]
    return [(f"{name}: calibration: {cal['text']}", style(cal)) for name, cal in members]

