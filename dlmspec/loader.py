"""Loading specs: TOML files, Python files, ``extends`` and ``--set`` overrides.

The result is a :class:`LoadedSpec`: the validated :class:`~dlmspec.spec.Spec` plus where
each key came from (file and line), so every later error can point at the line to edit.
Every problem found while loading is raised as one :class:`~dlmspec.errors.SpecError`.

Order of precedence, lowest first: the ``extends`` parent chain, the file itself, then each
``--set section.key=value`` in the order given.

pydantic and the spec models (:mod:`dlmspec.spec`) are imported only to validate: with
``load(..., fast=True)`` (``dlmspec validate`` and ``plan``) a plainly valid spec is checked by
:mod:`dlmspec.fastspec` without them.
"""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlmspec.errors import SpecError, SpecIssue

if TYPE_CHECKING:
    from pydantic import BaseModel

    from dlmspec.spec import Spec

#: Where a key was written: ``(file, line)``; line is None for keys from a Python spec.
Origin = tuple[str, int | None]


@dataclass
class LoadedSpec:
    """A validated spec and where its keys came from.

    Attributes:
        spec: the validated spec (schema-valid; cross-field rules are checked by
            :func:`dlmspec.validate.check`).
        path: the file it was loaded from.
        origins: dotted key -> (file, line) of the value that won.
        raw: the merged dict before validation (what the user wrote, after extends and --set).
    """

    spec: Spec
    path: Path
    origins: dict[str, Origin] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    def locate(self, key: str) -> Origin:
        """(file, line) for ``key``: :func:`locate_key`."""
        return locate_key(self.origins, key, self.path)


def locate_key(origins: dict[str, Origin], key: str, path: Path) -> Origin:
    """(file, line) for dotted ``key`` in ``origins``, else its nearest written ancestor (a table
    header), else the first key written under it (a misspelt table given only by
    ``--set t.k=v``), else ``(path, None)``."""
    parts = key.split(".")
    while parts:
        origin = origins.get(".".join(parts))
        if origin:
            return origin
        parts.pop()
    prefix = key + "."
    for written, origin in origins.items():
        if written.startswith(prefix):
            return origin
    return (str(path), None)


_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\-\"' ]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-.\"']+)\s*=")


def line_map(text: str) -> dict[str, int]:
    """Map each dotted key and table of a TOML document to its 1-based line.

    A small scanner, not a TOML parser: it reads table headers (``[a.b]``, ``[[a]]``) and
    ``key =`` lines at the start of a line, which is where a key's value begins; keys inside
    multi-line arrays or inline tables map to the line of their enclosing key.
    """
    lines: dict[str, int] = {}
    table = ""
    depth = 0  # open brackets of a multi-line value
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.split("#", 1)[0] if '"' not in raw and "'" not in raw else raw
        if depth == 0:
            header = _HEADER.match(raw)
            if header and not _KEY.match(raw):
                table = header.group(1).replace('"', "").replace("'", "").replace(" ", "")
                lines.setdefault(table, number)
                continue
            key = _KEY.match(raw)
            if key:
                name = key.group(1).replace('"', "").replace("'", "")
                dotted = f"{table}.{name}" if table else name
                lines.setdefault(dotted, number)
        depth += stripped.count("[") + stripped.count("{") - stripped.count("]") - stripped.count("}")
        depth = max(depth, 0)
    return lines


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Return ``base`` updated by ``over``; tables merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``key = "a.b"``, creating tables on the way.

    Raises:
        ValueError: a prefix of ``key`` holds a non-table value.
    """
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ValueError(f"'{part}' is a value, not a table")
        node = child
    node[parts[-1]] = value


def _flatten(data: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        keys.append(dotted)
        if isinstance(value, dict):
            keys.extend(_flatten(value, dotted + "."))
    return keys


def parse_set_value(text: str) -> Any:
    """Read the value of ``--set key=value`` as a TOML value (``2``, ``true``, ``"x"``,
    ``[1, 2]``); anything that is not a TOML literal is taken as a plain string, which the
    schema then types (``--set cluster.gpu=h200`` works without quotes)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _load_toml(path: Path, seen: tuple[Path, ...]) -> tuple[dict[str, Any], dict[str, Origin]]:
    if path in seen:
        chain = " -> ".join(str(p) for p in (*seen, path))
        raise SpecError([SpecIssue("extends", f"circular extends: {chain}", rule="extends", file=str(path))])
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        where = str(seen[-1]) if seen else None
        raise SpecError(
            [SpecIssue("extends" if seen else "<file>", f"file not found: {path}", value=str(path),
                       hint="check the path (extends is relative to the file that names it)",
                       rule="file", file=where)]
        ) from None
    except IsADirectoryError:
        raise SpecError([SpecIssue("extends" if seen else "<file>", f"{path} is a directory, not a spec file",
                                   value=str(path), hint="give a .toml or .py spec file", rule="file",
                                   file=str(seen[-1]) if seen else None)]) from None
    except UnicodeDecodeError as exc:
        raise SpecError([SpecIssue("<file>", f"not UTF-8 text (byte {exc.start}): a spec is a TOML or Python file",
                                   rule="file", file=str(path))]) from None
    except (OSError, ValueError) as exc:
        raise SpecError([SpecIssue("<file>", f"cannot read {path}: {exc}", rule="file", file=str(path))]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise SpecError(
            [SpecIssue("<toml>", f"not valid TOML: {exc}", rule="toml", file=str(path),
                       line=int(match.group(1)) if match else None,
                       hint="strings need quotes, tables are [section], keys are key = value")]
        ) from None
    lines = line_map(text)
    origins: dict[str, Origin] = {k: (str(path), _line_of(lines, k)) for k in _flatten(data)}
    parent = data.pop("extends", None)
    if parent is None:
        return data, origins
    if not isinstance(parent, str):
        raise SpecError([SpecIssue("extends", "extends must be a file path string", value=parent,
                                   rule="extends", file=str(path), line=lines.get("extends"))])
    try:
        parent_path = (path.parent / parent).resolve()
    except (OSError, ValueError, RuntimeError) as exc:
        raise SpecError([SpecIssue("extends", f"not a usable path: {exc}", value=parent, rule="extends",
                                   file=str(path), line=lines.get("extends"))]) from None
    base, base_origins = _load_toml(parent_path, (*seen, path))
    origins.pop("extends", None)
    return deep_merge(base, data), {**base_origins, **origins}


def _line_of(lines: dict[str, int], key: str) -> int | None:
    """The line of ``key``, else of its nearest ancestor in ``lines`` (a key inside an inline
    table or an array: ``env = { NAME = ... }``)."""
    while key:
        if key in lines:
            return lines[key]
        key = key.rpartition(".")[0]
    return None


def _load_python(path: Path) -> tuple[dict[str, Any], dict[str, Origin]]:
    """Run a Python spec file and take its ``spec`` (a Spec or a dict)."""
    if not path.is_file():
        missing = not path.exists()
        raise SpecError([SpecIssue("<file>", f"file not found: {path}" if missing else f"{path} is not a file",
                                   value=str(path), hint="check the path" if missing else "give a .py spec file",
                                   rule="file")])
    try:
        import runpy  # Python specs only (so are traceback and difflib: errors only)

        namespace = runpy.run_path(str(path), run_name="__dlmspec__")
    except SpecError:
        raise
    except SystemExit as exc:  # sys.exit() in a spec file must not decide dlmspec's exit code
        import traceback

        frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
        raise SpecError([SpecIssue("<python>", f"the spec file called sys.exit({exc.code!r})", rule="python",
                                   hint="a spec file assigns `spec`; it does not exit", file=str(path),
                                   line=frames[-1].lineno if frames else None)]) from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a user's file may raise anything; report it without a traceback
        import traceback

        from pydantic import ValidationError

        frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
        line = frames[-1].lineno if frames else None
        if isinstance(exc, ValidationError):
            message = _first_pydantic_message(exc)
        else:
            message = f"{type(exc).__name__}: {exc}"
        raise SpecError([SpecIssue("<python>", f"the spec file raised {message}", rule="python",
                                   file=str(path), line=line)]) from None
    value = namespace.get("spec")
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_none=True)
    if not isinstance(value, dict):
        raise SpecError([SpecIssue("spec", "a Python spec must assign `spec = Spec(...)` (or a dict)",
                                   value=type(value).__name__ if value is not None else None,
                                   hint="end the file with: spec = Spec(model=..., train=...)",
                                   rule="python", file=str(path))])
    return value, {}


def _first_pydantic_message(exc: Any) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"


#: Keys users bring from Megatron-LM's command line or other trainers -> what a spec writes.
KEY_ALIASES: dict[str, str] = {
    "bf16": '[precision] dtype = "bf16"',
    "fp16": '[precision] dtype = "fp16"',
    "fp32": '[precision] dtype = "fp32"',
    "tp": "[parallel] tensor_model_parallel_size",
    "pp": "[parallel] pipeline_model_parallel_size",
    "vpp": "[parallel] virtual_pipeline_model_parallel_size",
    "cp": "[parallel] context_parallel_size",
    "ep": "[parallel] expert_model_parallel_size",
    "etp": "[parallel] expert_tensor_parallel_size",
    "sp": "[parallel] sequence_parallel = true",
    "dp": "nothing: the data-parallel size is derived (GPUs / (TP x PP x CP))",
    "data_parallel_size": "nothing: the data-parallel size is derived (GPUs / (TP x PP x CP))",
    "swiglu": '[model] activation = "swiglu"',
    "num_key_value_heads": "[model] num_query_groups",
    "head_dim": "[model] kv_channels",
    "intermediate_size": "[model] ffn_hidden_size",
    "num_hidden_layers": "[model] num_layers",
    "rope_theta": "[model] rotary_base",
    "norm_epsilon": "[model] layernorm_epsilon",
    "recompute_granularity": "[recompute] granularity",
    "recompute_method": "[recompute] method",
    "recompute_num_layers": "[recompute] num_layers",
}


def _schema_issue(err: dict[str, Any], origins: dict[str, Origin], path: Path) -> SpecIssue:
    loc = [str(p) for p in err["loc"] if not str(p).startswith("function-")]
    key = ".".join(loc) or "<root>"
    kind = err["type"]
    value = err.get("input") if kind != "missing" else None
    message = err["msg"]
    hint = None
    rule = "schema"
    if kind == "unknown_preset":
        loc = [*loc, "preset"]
        key = ".".join(loc)
        value = err["ctx"]["preset"]
        message = "unknown preset"
        hint = preset_hint(value)
        rule = "unknown-preset"
    elif kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        options = list(model.model_fields) if model else []
        from difflib import get_close_matches

        close = get_close_matches(loc[-1], options, n=1)
        message = "unknown key"
        hint = f"did you mean '{close[0]}'?" if close else (f"valid keys: {', '.join(options)}" if options else None)
        if loc[-1].lower() in KEY_ALIASES:
            hint = f"write {KEY_ALIASES[loc[-1].lower()]}"
        value = None
    elif kind == "literal_error":
        hint = "use " + message.removeprefix("Input should be ")
        message = "not an allowed value"
    elif kind == "missing":
        hint = "add it to the spec, or set [model] preset = \"...\" for the model dimensions"
    elif kind.startswith(("int_", "float_", "bool_", "string_")) or kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        hint = message[0].lower() + message[1:]
        example = _example_value(loc, kind, err.get("ctx") or {})
        if example is not None:
            hint += f", e.g. {loc[-1]} = {example}"
        message = "wrong type or out of range"
    file, line = locate_key(origins, ".".join(loc), path)
    return SpecIssue(key=key, message=message, value=value, hint=hint, rule=rule, file=file, line=line)


def preset_hint(name: str) -> str:
    """What to write instead of the unknown preset id ``name``: the closest ids (case and small
    typos forgiven), else every id."""
    from dlmspec.presets import preset_names

    from difflib import get_close_matches

    names = preset_names()
    close = get_close_matches(name.lower(), names, n=3, cutoff=0.5)
    if close:
        quoted = [f"'{c}'" for c in close]
        options = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
        return f"did you mean {options}? (`dlmspec show --presets` lists every id)"
    return f"use one of {', '.join(names)}"


def _example_value(loc: list[str], kind: str, ctx: dict[str, Any]) -> str | None:
    """A value that passes the field at ``loc``, in TOML: its default when that is a plain
    value within the violated bound, else the bound itself (or the next integer past it)."""
    import json

    model = _model_at(loc[:-1])
    field = model.model_fields.get(loc[-1]) if model else None
    default = None if field is None else field.default
    bound = next((ctx[k] for k in ("gt", "ge", "lt", "le") if k in ctx), None)
    if isinstance(default, bool) or (isinstance(default, (int, float, str)) and default is not None):
        ok = True
        if bound is not None and isinstance(default, (int, float)) and not isinstance(default, bool):
            ok = {"greater_than": default > bound, "greater_than_equal": default >= bound,
                  "less_than": default < bound, "less_than_equal": default <= bound}.get(kind, True)
        if ok:
            return json.dumps(default)
    if isinstance(bound, (int, float)) and not isinstance(bound, bool):
        if kind == "greater_than":
            return json.dumps(bound + 1 if isinstance(bound, int) else bound * 2 or 1.0)
        if kind == "less_than":
            return json.dumps(bound - 1 if isinstance(bound, int) else bound / 2)
        return json.dumps(bound)
    if kind.startswith("int_"):
        return "1"
    if kind.startswith("float_"):
        return "1.0"
    if kind.startswith("bool_"):
        return "true"
    if kind.startswith("string_"):
        return '"..."'
    return None


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    from dlmspec.spec import Spec

    model: type[BaseModel] | None = Spec
    for part in loc:
        if model is None or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        model = _first_model(annotation)
    return model


def _first_model(annotation: Any) -> type[BaseModel] | None:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found:
            return found
    return None


def load(path: str | Path, overrides: list[str] | tuple[str, ...] = (), *, fast: bool = False) -> LoadedSpec:
    """Load, merge and schema-validate a spec file.

    Args:
        path: a ``.toml`` file or a ``.py`` file that assigns ``spec``.
        overrides: ``"section.key=value"`` strings (``--set``), applied last.
        fast: check a plainly valid spec without pydantic (:func:`dlmspec.fastspec.check`):
            ``spec`` is then a read-only :class:`~dlmspec.fastspec.SpecTable` that acts as the
            :class:`~dlmspec.spec.Spec` pydantic would build (same values, same
            ``model_fields_set``; other attributes come from that model, built on first use).
            Anything else is validated by pydantic as without ``fast``, so errors are the same.

    Returns:
        The :class:`LoadedSpec`.

    Raises:
        SpecError: unreadable file, invalid TOML, circular ``extends``, a malformed ``--set``,
            unknown keys, wrong types, out-of-range values (all of them, at once).
    """
    path = Path(path)
    try:
        absolute = path.resolve()
    except (OSError, ValueError, RuntimeError) as exc:  # NUL bytes, symlink loops
        raise SpecError([SpecIssue("<file>", f"not a usable file name: {exc}", value=str(path),
                                   hint="give the path of a .toml or .py spec file", rule="file")]) from None
    if path.suffix == ".py":
        data, origins = _load_python(absolute)
    else:
        data, origins = _load_toml(absolute, ())
    issues: list[SpecIssue] = []
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*", key):
            issues.append(SpecIssue("--set", "expected section.key=value", value=item,
                                    hint="e.g. --set parallel.tensor_model_parallel_size=2", rule="set"))
            continue
        try:
            set_dotted(data, key, parse_set_value(text.strip()))
        except ValueError as exc:
            issues.append(SpecIssue(key, str(exc), value=item, rule="set"))
            continue
        origins[key] = ("--set", None)
    if issues:
        raise SpecError(issues)
    spec: Any = None
    if fast:
        from dlmspec.fastspec import check

        spec = check(data)
    if spec is None:
        from pydantic import ValidationError

        from dlmspec.spec import Spec

        try:
            spec = Spec.model_validate(data)
        except ValidationError as exc:
            errors = exc.errors()
            error = SpecError([_schema_issue(e, origins, path) for e in errors])
            partial, dropped = _without_bad_keys(data, errors, Spec)
            if partial is not None:
                error.partial = LoadedSpec(spec=partial, path=path, origins=origins, raw=data)
                error.dropped = dropped
            raise error from None
    return LoadedSpec(spec=spec, path=path, origins=origins, raw=data)


def _without_bad_keys(data: dict[str, Any], errors: list[dict[str, Any]], model: Any) -> tuple[Any, tuple[str, ...]]:
    """``(spec, dropped keys)``: ``data`` validated without the keys pydantic rejected (unknown
    keys, wrong types, out-of-range values fall back to their defaults), or ``(None, ())`` when
    a required key is among them or the rest still does not validate."""
    import copy

    trimmed = copy.deepcopy(data)
    dropped = []
    for err in errors:
        loc = []
        for part in err["loc"]:
            if not isinstance(part, str) or part.startswith("function-"):
                break  # a list element, or a validator's name: drop the whole key above it
            loc.append(part)
        if err["type"] == "missing" or not loc:
            return None, ()
        node = trimmed
        for part in loc[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(loc[-1], None)
        dropped.append(".".join(loc))
    try:
        return model.model_validate(trimmed), tuple(dropped)
    except Exception:  # noqa: BLE001 - anything left unloadable: no partial spec
        return None, ()


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
    return loaded


if __name__ == "__main__":  # pragma: no cover - debugging aid
    print(load(sys.argv[1]).spec.model_dump_json(indent=2))
