"""``from dlmspec.dsl import Spec``: the spec class Python specs start from.

:class:`Spec` is :class:`dlmspec.spec.models.Spec` (same keys as TOML, validated on assignment,
``.replace``) with two starting points: :meth:`Spec.from_preset` (what ``dlmspec new --preset``
writes) and :meth:`Spec.load` (a bundled spec or a TOML file), and one sweep maker:
:meth:`Spec.layouts` (the best layouts ``dlmspec plan --search`` finds). ``docs/python.md`` is the guide;
:mod:`dlmspec.spec.python` records where each value was set. Nothing in dlmspec imports this
module (it reaches the CLI's starter spec and the bundled specs, above the spec models).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlmspec.spec import models


class Spec(models.Spec):
    """A whole training job (:class:`dlmspec.spec.models.Spec`) with the DSL's starting points."""

    @classmethod
    def from_preset(cls, preset: str, *, gpus: int | None = None, name: str | None = None,
                    **options: Any) -> models.Spec:
        """The starter spec ``dlmspec new OUT --preset PRESET`` writes, e.g.
        ``Spec.from_preset("llada-8b", gpus=64)``: :func:`from_preset`."""
        return from_preset(preset, gpus=gpus, name=name, **options)

    @classmethod
    def load(cls, name_or_path: str) -> models.Spec:
        """A bundled spec (``Spec.load("demo-dlm")``) or a TOML spec file: :func:`load_spec`."""
        return load_spec(name_or_path)

    @classmethod
    def layouts(cls, spec: models.Spec, *, top: int = 3) -> dict[str, models.Spec]:
        """A sweep of the ``top`` fastest layouts that fit, as ``dlmspec plan --search`` ranks
        them, e.g. ``spec = Spec.layouts(base, top=3)``: :func:`layouts`."""
        return layouts(spec, top=top)



def from_preset(preset: str, *, gpus: int | None = None, name: str | None = None, **options: Any) -> Any:
    """``Spec.from_preset``: the starter spec ``dlmspec new OUT --preset PRESET`` writes (mock
    data, bf16, a 1,000-step cosine schedule, a layout that fits), as a ``Spec``.

    Args:
        preset: a preset id (``dlmspec show --presets``).
        gpus: GPUs in all: up to 8 on one node, else a multiple of 8 (8 per node); or give
            ``nodes`` and ``gpus_per_node``.
        name: the run's name (default: the preset id).
        options: ``objective`` (``"mdm"`` or ``"ar"``), ``gpu``, ``nodes``, ``gpus_per_node``,
            ``seq_length``: ``dlmspec new``'s options.

    Raises:
        SpecError: an unknown preset or option, a GPU count that does not split into nodes, a
            model that does not fit on any layout of those GPUs.
    """
    import tomllib

    from dlmspec.cli.commands.new import starter_text
    from dlmspec.errors import SpecError, SpecIssue
    from dlmspec.spec.models import Spec
    from dlmspec.spec.python import record_of, templates_in

    allowed = {"objective", "gpu", "nodes", "gpus_per_node", "seq_length"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise SpecError([SpecIssue(unknown[0], "not an option of Spec.from_preset", value=options[unknown[0]],
                                   hint="options: gpus, name, " + ", ".join(sorted(allowed)), rule="python")])
    if gpus is not None:
        if not isinstance(gpus, int) or gpus < 1 or (gpus > 8 and gpus % 8):
            raise SpecError([SpecIssue("gpus", "a GPU count is 1 to 8 (one node) or a multiple of 8 (8 per node)",
                                       value=gpus, hint="e.g. gpus=8 or gpus=16, or give nodes= and "
                                       "gpus_per_node=", rule="python")])
        options.setdefault("nodes", max(1, gpus // 8))
        options.setdefault("gpus_per_node", min(gpus, 8))
    text = starter_text(name or preset, preset, **options)
    data = tomllib.loads(text)
    spec = Spec.model_validate(data)
    record_of(spec, create=True).templates.update(templates_in(data))
    return spec


def load_spec(name_or_path: str | Path) -> Any:
    """``Spec.load``: a bundled spec by name (``"demo-dlm"``: ``specs/demo-dlm.toml``) or a
    TOML spec file, as a ``Spec``; issues found later point at that file's lines.

    Raises:
        SpecError: no such bundled spec or file, or the file does not load.
    """
    import dlmspec.resolve  # noqa: F401 - gives the loader its check of lock/show files' written defaults
    from dlmspec.errors import SpecError, SpecIssue
    from dlmspec.spec.load import load
    from dlmspec.spec.python import _note, record_of, templates_in

    path = Path(name_or_path)
    if not path.suffix:
        from dlmspec.cli.commands.new import bundled_specs

        specs = bundled_specs()
        if str(name_or_path) not in specs:
            raise SpecError([SpecIssue("Spec.load", "not a bundled spec (nor a file path ending in .toml)",
                                       value=str(name_or_path), hint="one of: " + ", ".join(specs), rule="python")])
        path = Path(str(specs[str(name_or_path)]))
    loaded = load(path)
    spec = loaded.spec
    record = record_of(spec, create=True)
    record.templates.update(templates_in(loaded.raw))
    _note(record, dict(loaded.origins))
    return spec


def layouts(spec: models.Spec, *, top: int = 3) -> dict[str, models.Spec]:
    """``Spec.layouts``: the ``top`` best layouts :func:`dlmspec.plan.search.search` finds for
    ``spec``'s model, cluster and batch (what ``dlmspec plan SPEC --search --top TOP`` prints, in
    its order), each as ``spec`` with that layout's values
    (:func:`dlmspec.plan.search.layout_changes`), named ``<spec name>-<layout>``
    (:attr:`dlmspec.plan.search.Candidate.label`, e.g. ``demo-dlm-tp1-pp1-mb32-distopt``): a
    dict of name -> Spec, the form a sweep takes. Run paths written with ``{name}`` follow
    each member's name. Fewer than ``top`` when fewer layouts fit.

    Raises:
        SpecError: ``top`` below 1; an error of ``spec`` the search cannot fix (its model,
            cluster or data); a GPU not in the catalog; no layout that fits (the issue says
            what would). Issues without a line of their own point at the user's call.
    """
    from dlmspec.check import issues_for
    from dlmspec.cli.plan import nothing_fits
    from dlmspec.errors import SpecError, SpecIssue
    from dlmspec.plan import PlanError
    from dlmspec.plan.search import layout_changes, search, spec_issues_for_search
    from dlmspec.resolve import resolve
    from dlmspec.spec.python import collect, user_frame

    frame = user_frame(2)
    here = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else (None, None)
    hint = (" (from Spec.layouts(..., top=N), which keeps the layouts dlmspec plan --search finds: "
            "fix the spec it is given)")

    def failed(issues: list[SpecIssue]) -> SpecError:
        origins = collect(spec)
        for issue in issues:
            if issue.line is None:
                issue.file, issue.line = origins.get(issue.key, here)
            issue.hint = (issue.hint or "") + hint
        return SpecError(issues)

    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise failed([SpecIssue("top", "Spec.layouts keeps at least one layout", value=top,
                                hint="e.g. Spec.layouts(base, top=3)", rule="python")])
    resolved = resolve(spec)
    issues = issues_for("plan", spec, resolved)
    blocking, _ = spec_issues_for_search(spec, resolved, issues)
    if blocking:
        raise failed(blocking)
    try:
        result = search(resolved, top=top)
    except PlanError as exc:
        raise failed([SpecIssue("cluster.gpu", str(exc), value=spec.cluster.gpu, rule="plan")]) from None
    if not result.top:
        raise failed([nothing_fits(resolved, result)])
    out: dict[str, models.Spec] = {}
    for cand in result.top:
        name = f"{spec.name}-{cand.label}"
        while name in out:  # labels tell layouts apart; a guard, not a naming scheme
            name += "-2"
        out[name] = spec.replace(name=name, **layout_changes(spec, cand))
    return out
