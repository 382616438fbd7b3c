"""pydantic's validation errors and the loader's own value checks as
:class:`~dlmspec.errors.SpecIssue` objects with file, line, key, value, why and a fix that works
(:func:`_schema_issue`): unknown keys with the close names (:data:`KEY_ALIASES`), quoted numbers and booleans, unknown presets
(:func:`preset_hint`), integers past int64 (:data:`INT64_MAX`), ``{name}`` placeholders, a
malformed ``--set`` (:func:`set_syntax_issue`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from dlmspec.errors import Fix, SpecIssue, printable_int, safe_repr
from dlmspec.spec.lines import COMMAND_LINE, Origin, _leading_keys, locate_key

if TYPE_CHECKING:
    from pydantic import BaseModel


#: Largest integer a spec holds (int64); the smallest is ``-INT64_MAX - 1``.
INT64_MAX = 2**63 - 1


_INT64_HINT = f"use a value that fits in int64 (-{INT64_MAX + 1} .. {INT64_MAX})"


def _int64_issues(data: Any, origins: dict[str, Origin], path: Path) -> list[SpecIssue]:
    """An issue per integer of ``data`` outside int64 (iterative; ``data`` is at most
    :data:`MAX_DEPTH` deep by now)."""
    issues = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, (*where, k)) for k, v in reversed(list(node.items())))
        elif isinstance(node, (list, tuple)):
            stack.extend((v, (*where, i)) for i, v in reversed(list(enumerate(node))))
        elif isinstance(node, int) and not isinstance(node, bool) and not -INT64_MAX - 1 <= node <= INT64_MAX:
            key = ".".join(_leading_keys(where)) or "<root>"
            sign = "-" if node < 0 else ""
            if printable_int(node):
                digits = str(abs(node))
                shown: Any = node if len(digits) <= 30 else f"{sign}{digits[:12]}... ({len(digits)} digits)"
            else:  # str() refuses more than sys.get_int_max_str_digits() digits
                shown = sign + safe_repr(abs(node))
            file, line = locate_key(origins, key, path)
            example = _default_example(key)
            fix = Fix({key: int(example.rpartition(" = ")[2])}) if example else None
            issues.append(SpecIssue(key, f"does not fit in int64 (-{INT64_MAX + 1} .. {INT64_MAX}), the integer type "
                                    "megatron-core, torch and numpy hold counts, sizes, ids and seeds in",
                                    value=shown, hint=_INT64_HINT + (f", e.g. {example}" if example else ""),
                                    rule="int64", file=file, line=line, fix=fix))
    return issues


def _placeholder_issues(data: dict[str, Any], origins: dict[str, Origin], path: Path) -> list[SpecIssue]:
    """An issue per key of :data:`dlmspec.spec.names.NAME_KEYS` holding a brace other than
    ``{name}`` or a doubled one (the ``name-placeholder`` rule), at the file and line that wrote it."""
    from dlmspec.spec.names import placeholder_problems

    return [_placeholder_issue(key, value, origins, path) for key, value, _ in placeholder_problems(data)]


def _placeholder_issue(key: str, value: str, origins: dict[str, Origin], path: Path) -> SpecIssue:
    from dlmspec.spec.names import problem_hint, problem_message, suggest

    file, line = locate_key(origins, key, path)
    return SpecIssue(key, problem_message(value), value=value, hint=problem_hint(key, value),
                     rule="name-placeholder", file=file, line=line, fix=Fix({key: suggest(value)}))


def _default_example(key: str) -> str | None:
    """``leaf = default`` for the spec key ``key`` when its default is an integer (imports the
    spec models: error reports only)."""
    *table, leaf = key.split(".")
    model = _model_at(table)
    field = model.model_fields.get(leaf) if model is not None else None
    default = getattr(field, "default", None)
    if isinstance(default, int) and not isinstance(default, bool):
        return f"{leaf} = {default}"
    return None


def _short_key(path: tuple[Any, ...] | list[Any]) -> str:
    """The dotted key of ``path`` (up to its first list index), cut after 4 parts: what a
    nesting issue names."""
    parts = _leading_keys(tuple(path))
    if len(parts) > 4:
        return ".".join(parts[:4]) + "..."
    return ".".join(parts) or "<root>"


def _excerpt(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width] + "..."


def _short_repr(value: Any) -> str:
    """A bounded ``repr`` of a (possibly deep or cyclic) value."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, 40, 40
    return _excerpt(short.repr(value))


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
    from dlmspec.spec.models import plain_objective_loc

    loc = [str(p) for p in plain_objective_loc(err["loc"]) if not str(p).startswith("function-")]
    # the location as pydantic gives it, with the tag of [objective]'s union (if any): the model to read
    tagged = [str(p) for p in err["loc"] if not str(p).startswith("function-")]
    key = ".".join(loc) or "<root>"
    kind = err["type"]
    value = err.get("input") if kind != "missing" else None
    message = err["msg"]
    hint = None
    fix = None
    rule = "schema"
    if kind == "name_placeholder":  # a Spec built in Python; files are checked before (_placeholder_issues)
        key, value, _ = err["ctx"]["problems"][0]
        return _placeholder_issue(key, value, origins, path)
    if kind == "unknown_preset":
        loc = [*loc, "preset"]
        key = ".".join(loc)
        value = err["ctx"]["preset"]
        message = "unknown preset"
        hint = preset_hint(value)
        rule = "unknown-preset"
        close = _close_presets(value)
        if close:
            fix = Fix({key: close[0]})
            hint = hint.replace("? (", f"? {fix.text()} (", 1)
    elif kind == "unknown_generate_preset":  # GenerateSpec: the table's validator names the key
        loc = [*loc, "preset"]
        key = ".".join(loc)
        value = err["ctx"]["preset"]
        message = "not a [generate] preset (dlmspec.generate_presets)"
        hint = err["ctx"]["fix"]
    elif kind in ("extra_forbidden", "no_such_attribute"):  # a key in a file or a dict; an attribute in Python
        model = _model_at(tagged[:-1])
        options = list(model.model_fields) if model else []
        from difflib import get_close_matches

        close = get_close_matches(loc[-1], options, n=1)
        message = "unknown key" if kind == "extra_forbidden" else "unknown key: the table has no attribute of this name"
        hint = f"did you mean '{close[0]}'?" if close else (f"valid keys: {', '.join(options)}" if options else None)
        if close:  # the hint names the key; the fix renames it, keeping the value
            fix = Fix({".".join([*loc[:-1], close[0]]): err.get("input")}, (key,))
        if loc[-1].lower() in KEY_ALIASES:
            hint = f"write {KEY_ALIASES[loc[-1].lower()]}"
            fix = None
        written = err.get("input")
        value = None if isinstance(written, (dict, list)) else written  # a scalar shows what was written
    elif kind == "literal_error":
        hint = "use " + message.removeprefix("Input should be ")
        message = "not an allowed value"
        model = _model_at(tagged[:-1])
        field = model.model_fields.get(loc[-1]) if model is not None else None
        allowed = [a for a in _literals(field.annotation) if a != value] if field is not None else []
        if allowed:
            fix = Fix({key: allowed[0]})
    elif kind == "missing":
        if loc and loc[0] == "model":
            hint = "add it to the spec, or set [model] preset = \"...\" for the model dimensions"
        elif any(isinstance(p, int) or str(p).isdigit() for p in loc):
            hint = "an item of this list is too short: give every part of it"
        else:
            hint = "add it to the spec"
    elif kind == "int_type" and type(value) is float and math.isfinite(value) and value == int(value):
        message = "a whole number written as a float"
        hint = f"write it as an integer: {key} = {int(value)}"
        if not any(p.isdigit() for p in loc):
            fix = Fix({key: int(value)})
    elif kind in ("int_type", "float_type", "bool_type") and isinstance(value, str) and _unquoted(value, kind, path):
        text, parsed = _unquoted(value, kind, path)
        what = "a boolean" if kind == "bool_type" else "a number"
        message = f"{what} written as a string (quoted)"
        hint = f"write it without quotes: {key} = {text}"
        if not any(p.isdigit() for p in loc):
            fix = Fix({key: parsed})
    elif kind == "list_type" and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        message = "a list is expected, not a single value"
        hint = f"write it as a list: {key} = [{json.dumps(value)}]"
        if not any(p.isdigit() for p in loc):
            fix = Fix({key: [value]})
    elif kind.startswith(("int_", "float_", "bool_", "string_")) or kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        hint = message[0].lower() + message[1:]
        ctx = err.get("ctx") or {}
        example = _example_value(tagged, kind, ctx, sign_typo=_sign_typo(value, kind, ctx))
        if example is not None:
            hint += f", e.g. {loc[-1]} = {example}"
            if example != '"..."' and not any(p.isdigit() for p in loc):
                fix = Fix({key: json.loads(example)})
        message = "wrong type or out of range"
    file, line = locate_key(origins, ".".join(loc), path)
    return SpecIssue(key=key, message=message, value=value, hint=hint, rule=rule, file=file, line=line, fix=fix)


_TRUE_WORDS = frozenset({"true", "yes", "on", "y", "t", "1"})


_FALSE_WORDS = frozenset({"false", "no", "off", "n", "f", "0"})


def _unquoted(value: str, kind: str, path: Path) -> tuple[str, Any] | None:
    """What a quoted number or boolean (``"3e-4"``, ``"256"``, ``"yes"``) means unquoted: ``(text,
    value)`` with ``text`` as the spec's language writes it (TOML, or Python for a ``.py`` spec),
    or ``None`` when ``value`` is no number (``int_type``, ``float_type``) or boolean word
    (``bool_type``) at all."""
    word = value.strip()
    python = path.suffix == ".py"
    if kind == "bool_type":
        truth = True if word.lower() in _TRUE_WORDS else False if word.lower() in _FALSE_WORDS else None
        if truth is None:
            return None
        return (str(truth) if python else str(truth).lower()), truth
    try:
        number: Any = int(word.replace("_", "")) if kind == "int_type" else float(word.replace("_", ""))
    except ValueError:
        if kind != "int_type":
            return None
        try:  # "1e3" for an int: the int it names, when it names one
            as_float = float(word.replace("_", ""))
        except ValueError:
            return None
        if not math.isfinite(as_float) or as_float != int(as_float):
            return None
        number = int(as_float)
        return str(number), number
    if isinstance(number, float) and not math.isfinite(number):
        return None
    return word, number


def _literals(annotation: Any) -> list[Any]:
    """The values of the ``Literal`` in ``annotation`` (inside ``X | None`` too), in order."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    return [v for arg in get_args(annotation) for v in _literals(arg)]


def _close_presets(name: str) -> list[str]:
    """The preset ids closest to ``name`` (case and small typos forgiven), best first."""
    from difflib import get_close_matches

    from dlmspec.spec.presets import preset_names

    return get_close_matches(name.lower(), preset_names(), n=3, cutoff=0.5)


def preset_hint(name: str) -> str:
    """What to write instead of the unknown preset id ``name``: the closest ids (case and small
    typos forgiven), else every id."""
    from dlmspec.spec.presets import preset_names

    names = preset_names()
    close = _close_presets(name)
    if close:
        quoted = [f"'{c}'" for c in close]
        options = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
        return f"did you mean {options}? (`dlmspec show --presets` lists every id)"
    return f"use one of {', '.join(names)}"


def _sign_typo(value: Any, kind: str, ctx: dict[str, Any]) -> str | None:
    """The written number without its minus sign, in TOML, when that passes a lower bound the
    written one fails (``hidden_size = -768``: ``768``, not the bound's ``1``); else ``None``."""
    bound = ctx.get("gt", ctx.get("ge"))
    if (kind not in ("greater_than", "greater_than_equal") or isinstance(value, bool)
            or not isinstance(value, (int, float)) or not isinstance(bound, (int, float)) or value >= 0):
        return None
    flipped = -value
    return json.dumps(flipped) if (flipped > bound if kind == "greater_than" else flipped >= bound) else None


def _example_value(loc: list[str], kind: str, ctx: dict[str, Any], sign_typo: str | None = None) -> str | None:
    """A value that passes the field at ``loc``, in TOML: its default when that is a plain
    value within the violated bound, else ``sign_typo`` (:func:`_sign_typo`) when given, else the
    bound itself (or the next integer past it)."""
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
    if sign_typo is not None:
        return sign_typo
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
    from dlmspec.spec.models import Spec

    from dlmspec.spec.models import OBJECTIVE_TAGS

    model: type[BaseModel] | None = Spec
    previous = None
    for part in loc:
        if previous == "objective" and model is not None and part in OBJECTIVE_TAGS and part not in model.model_fields:
            model, previous = OBJECTIVE_TAGS[part], part  # the union's tag: that objective's own model
            continue
        previous = part
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


def set_syntax_issue(item: str) -> SpecIssue:
    """The issue for a ``--set`` item that is not ``section.key=value`` (e.g. ``--set train.lr``):
    reported on the command line, with a fix that keeps the user's key where there is one."""
    key = item.partition("=")[0].strip()
    example = (f"--set {key}=VALUE" if key and re.fullmatch(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)+", key)
               else "e.g. --set parallel.tensor_model_parallel_size=2")
    return SpecIssue("--set", "expected section.key=value", value=item, hint=example, rule="set",
                     file=COMMAND_LINE)


def _without_bad_keys(data: dict[str, Any], errors: list[dict[str, Any]], model: Any) -> tuple[Any, tuple[str, ...]]:
    """``(spec, dropped keys)``: ``data`` validated without the keys pydantic rejected (unknown
    keys, wrong types, out-of-range values fall back to their defaults), or ``(None, ())`` when
    a required key is among them or the rest still does not validate."""
    import copy

    from dlmspec.spec.models import plain_objective_loc

    trimmed = copy.deepcopy(data)
    dropped = []
    for err in errors:
        loc = []
        for part in plain_objective_loc(err["loc"]):
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
