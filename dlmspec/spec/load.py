"""Loading specs: TOML files, Python files, ``extends`` and ``--set`` overrides (:func:`load`).

The result is a :class:`LoadedSpec`: the validated :class:`~dlmspec.spec.models.Spec` plus where
each key came from (file and line), so every later error can point at the line to edit.
Every problem found while loading is raised as one :class:`~dlmspec.errors.SpecError`.

Order of precedence, lowest first: the ``extends`` parent chain, the file itself, then each
``--set section.key=value`` in the order given.

The loader's parts, each its own module: :mod:`dlmspec.spec.read` (reading TOML spec files and
their ``extends`` chain; the limits :data:`~dlmspec.spec.read.MAX_SPEC_BYTES` and
:data:`~dlmspec.spec.read.MAX_EXTENDS`), :mod:`dlmspec.spec.lines` (the TOML line map: key ->
line), :mod:`dlmspec.spec.python_load` (running Python spec files, :func:`~dlmspec.spec.python_load.sweep_targets`),
:mod:`dlmspec.spec.sweep` (a sweep's members: names, checks), :mod:`dlmspec.spec.schema_errors`
(pydantic's errors as issues with a fix) and :mod:`dlmspec.spec.show` (the defaults ``dlmspec show``
wrote, left out when such a file is loaded back).

Limits (each refused with one issue, never a hang, a RecursionError or unbounded memory): spec
files are read only when they are regular files (never pipes or devices, which can block or
never end) of at most ``MAX_SPEC_BYTES``; tables and arrays nest at most ``MAX_DEPTH``
levels (in files, Python specs and ``--set``); an ``extends`` chain has at most
``MAX_EXTENDS`` files; integers fit in int64 (``INT64_MAX``), what megatron-core,
torch and numpy hold counts, sizes, ids and seeds in (larger ones made :mod:`dlmspec.resolve`
and the planner raise OverflowError).

pydantic and the spec models (:mod:`dlmspec.spec.models`) are imported only to validate: with
``load(..., fast=True)`` (``dlmspec validate`` and ``plan``) a plainly valid spec is checked by
:mod:`dlmspec.spec.fast` without them.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlmspec.errors import SpecError, SpecIssue
from dlmspec.spec.dotted import (MAX_DEPTH, SetValueError, TooDeep, nesting_message, parse_set_value, set_dotted,
                                 too_deep)
from dlmspec.spec.lines import Origin, locate_key
from dlmspec.spec.python_load import _load_python, _non_string_keys
from dlmspec.spec.read import _SPEC_DEPTH_HINT, _chain_names, _load_toml
from dlmspec.spec.schema_errors import (_INT64_HINT, _excerpt, _int64_issues, _placeholder_issues, _schema_issue,
                                        _short_key, _without_bad_keys, set_syntax_issue)
from dlmspec.spec.show import _without_written_defaults, _written_by_dlmspec
from dlmspec.spec.sweep import split_member

if TYPE_CHECKING:
    from dlmspec.spec.models import Spec


@dataclass
class LoadedSpec:
    """A validated spec and where its keys came from.

    Attributes:
        spec: the validated spec (schema-valid; cross-field rules are checked by
            :mod:`dlmspec.check`).
        path: the file it was loaded from.
        origins: dotted key -> (file, line) of the value that won.
        raw: the merged dict before validation (what the user wrote, after extends and --set;
            ``{name}`` not expanded).
        files: each file of the ``extends`` chain, the spec itself first, as ``origins`` spells
            it -> the ``name`` of the spec that file defines (written there, else inherited from
            its parents, else the default); ``--set`` is not among them. Rules tell by it
            which keys a parent wrote, and for which run.
    """

    spec: Spec
    path: Path
    origins: dict[str, Origin] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    def locate(self, key: str) -> Origin:
        """(file, line) for ``key``: :func:`locate_key`."""
        return locate_key(self.origins, key, self.path)


def load(path: str | Path, overrides: list[str] | tuple[str, ...] = (), *, fast: bool = False) -> LoadedSpec:
    """Load, merge and schema-validate a spec file.

    Args:
        path: a ``.toml`` file or a ``.py`` file that assigns ``spec``.
        overrides: ``"section.key=value"`` strings (``--set``), applied last.
        fast: check a plainly valid spec without pydantic (:func:`dlmspec.spec.fast.check`):
            ``spec`` is then a read-only :class:`~dlmspec.spec.fast.SpecTable` that acts as the
            :class:`~dlmspec.spec.models.Spec` pydantic would build (same values, same
            ``model_fields_set``; other attributes come from that model, built on first use).
            Anything else is validated by pydantic as without ``fast``, so errors are the same.

    Returns:
        The :class:`LoadedSpec`.

    Raises:
        SpecError: unreadable file (missing, a directory, not a regular file, larger than
            :data:`MAX_SPEC_BYTES`), invalid TOML, nesting deeper than :data:`MAX_DEPTH`, an
            ``extends`` chain longer than :data:`MAX_EXTENDS` or circular, integers beyond
            int64, a malformed ``--set``,
            unknown keys, wrong types, out-of-range values (all of them, at once).
    """
    path, member = split_member(path)
    try:
        absolute = path.resolve()
    except (OSError, ValueError, RuntimeError) as exc:  # NUL bytes, symlink loops
        raise SpecError([SpecIssue("<file>", f"not a usable file name: {exc}", value=str(path),
                                   hint="give the path of a .toml or .py spec file", rule="file")]) from None
    if path.suffix == ".py":
        data, origins = _load_python(absolute, member)
        files = _chain_names([str(absolute)], [data])
    else:
        data, origins, files = _load_toml(absolute)
    issues: list[SpecIssue] = []
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*", key):
            issues.append(set_syntax_issue(item))
            continue
        parts = key.split(".")
        try:
            if len(parts) > MAX_DEPTH:
                raise TooDeep(nesting_message())
            value = parse_set_value(text.strip())
            if too_deep(value, MAX_DEPTH - len(parts)) is not None:
                raise TooDeep(nesting_message())
            set_dotted(data, key, value)
        except SetValueError as exc:
            hint = _SPEC_DEPTH_HINT if isinstance(exc, TooDeep) else _INT64_HINT
            issues.append(SpecIssue(_short_key(parts), str(exc), value=_excerpt(item), hint=hint,
                                    rule="set", file="--set"))
            continue
        except ValueError as exc:
            issues.append(SpecIssue(key, str(exc), value=_excerpt(item), rule="set"))
            continue
        origins[key] = ("--set", None)
    if issues:
        raise SpecError(issues)
    issues = (_non_string_keys(data, path) or _int64_issues(data, origins, path)
              or _placeholder_issues(data, origins, path))
    if issues:
        raise SpecError(issues)
    if path.suffix != ".py" and _written_by_dlmspec(absolute, data):
        data = _without_written_defaults(data)
    spec: Any = None
    if fast:
        from dlmspec.spec.fast import check

        spec = check(data)
    if spec is None:
        from pydantic import ValidationError

        from dlmspec.spec.models import Spec

        try:
            spec = Spec.model_validate(data)
        except ValidationError as exc:
            errors = _with_errors_behind_the_generate_preset(data, exc.errors(), Spec)
            error = SpecError([_schema_issue(e, origins, path) for e in errors])
            partial, dropped = _without_bad_keys(data, errors, Spec)
            if partial is not None:
                error.partial = LoadedSpec(spec=partial, path=path, origins=origins, raw=data, files=files)
                error.dropped = dropped
            raise error from None
    return LoadedSpec(spec=spec, path=path, origins=origins, raw=data, files=files)


def _with_errors_behind_the_generate_preset(data: Any, errors: list[Any], model: Any) -> list[Any]:
    """``errors`` and, when one of them is an unknown ``[generate]`` preset, the other ``[generate]``
    errors: the table's validator stops at the preset, so the table is validated again without it
    (the keys it would have filled have defaults), and its errors other than those already found are
    added. Every problem of the table is then reported in one pass."""
    from pydantic import ValidationError

    if not any(e.get("type") == "unknown_generate_preset" for e in errors):
        return errors
    table = data.get("generate") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        return errors
    try:
        model.model_validate({**data, "generate": {k: v for k, v in table.items() if k != "preset"}})
    except ValidationError as exc:
        seen = {(tuple(e.get("loc", ())), e.get("type")) for e in errors}
        errors = errors + [e for e in exc.errors() if tuple(e.get("loc", ()))[:1] == ("generate",)
                           and (tuple(e.get("loc", ())), e.get("type")) not in seen]
    return errors


def load_text(text: str, name: str = "<string>.toml") -> LoadedSpec:
    """Load a spec from TOML text (tests and ``dlmspec new``); see :func:`load`."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(name).name
        path.write_text(text, encoding="utf-8")
        try:
            loaded = load(path)
        except SpecError as exc:  # point at `name`, not at the temporary file
            for issue in exc.issues:
                if issue.file in (str(path), str(path.resolve())):
                    issue.file = name
            raise
    loaded.path = Path(name)
    loaded.origins = {k: (name, line) for k, (_, line) in loaded.origins.items()}
    loaded.files = {name: next(iter(loaded.files.values()))}
    return loaded


if __name__ == "__main__":  # pragma: no cover - debugging aid
    print(load(sys.argv[1]).spec.model_dump_json(indent=2))
