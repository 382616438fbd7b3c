"""The generator of :mod:`dlmspec.spec.fast_schema` (:data:`~dlmspec.spec.fast.SCHEMA`,
:data:`~dlmspec.spec.fast.SPEC_CRC32`) from the pydantic models of :mod:`dlmspec.spec.models`.

A target of :mod:`dlmspec.generated` (``python -m dlmspec.generated`` writes the file). Imports
pydantic; :mod:`dlmspec.spec.fast`, which reads the table, does not. Kept apart from it so the
table can be generated when it is missing or broken.
"""

from __future__ import annotations

from typing import Any


def _describe(annotation: Any, metadata: list[Any]) -> tuple:
    """A pydantic field type as this module's description (``("off",)`` for what it does not
    check: values of that field then go to pydantic)."""
    import types
    import typing

    import annotated_types
    from pydantic import BaseModel, Strict

    bounds: dict[str, Any] = {}
    min_length = 0
    for item in metadata:
        if isinstance(item, Strict) and item.strict:
            # pydantic's strict int/float/bool (dlmspec.spec.models.Int, Float, Bool, ...): what _value
            # accepts already (exact int; int or float for a float; exact bool), so nothing to record
            continue
        if isinstance(item, (annotated_types.Gt, annotated_types.Ge, annotated_types.Lt, annotated_types.Le)):
            kind = type(item).__name__.lower()
            bounds[kind] = getattr(item, kind)
        elif isinstance(item, annotated_types.MinLen):
            min_length = item.min_length
        else:
            return ("off",)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _describe(args[0], [*args[1:], *metadata])
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2 and metadata:
        # Field(None, ge=0) on `int | None`: pydantic bounds the int
        inner = next(a for a in args if a is not type(None))
        return ("union", (_describe(inner, metadata), ("none",)))
    if annotation is int or annotation is float:
        if min_length:
            return ("off",)
        return (annotation.__name__, bounds)
    if bounds and annotation is not str:
        return ("off",)
    if annotation is bool:
        return ("off",) if min_length else ("bool",)
    if annotation is str:
        return ("off",) if bounds else ("str", min_length)
    if min_length:
        return ("off",)
    if annotation is type(None):
        return ("none",)
    if annotation is typing.Any:
        return ("any",)
    if origin is typing.Literal:
        return ("literal", args) if all(type(a) is str for a in args) else ("off",)
    if origin in (typing.Union, types.UnionType):
        return ("union", tuple(_describe(a, []) for a in args))
    if origin is list and len(args) == 1:
        return ("list", _describe(args[0], []))
    if origin is tuple and args and Ellipsis not in args:
        return ("tuple", tuple(_describe(a, []) for a in args))
    if origin is dict and len(args) == 2 and args[0] is str:
        return ("dict", _describe(args[1], []))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return ("model", annotation.__name__)
    return ("off",)


def _plain(value: Any) -> bool:
    if type(value) in (list, dict):
        items = value.values() if type(value) is dict else value
        return all(_plain(v) for v in items) and all(type(k) is str for k in (value if type(value) is dict else ()))
    return value is None or type(value) in (bool, int, float, str)


def generate() -> str:
    """The full text of ``dlmspec/spec/fast_schema.py`` (:data:`SCHEMA`, :data:`SPEC_CRC32`), from
    the models of :mod:`dlmspec.spec.models` (imports pydantic). A target of
    :mod:`dlmspec.generated`: ``python -m dlmspec.generated`` writes it."""
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    from dlmspec.spec import models
    from dlmspec.spec.fast import sources_crc32

    schema: dict[str, Any] = {}
    pending: list[type] = [models.Spec]
    while pending:
        model = pending.pop(0)
        if model.__name__ in schema:
            continue
        config = model.model_config
        plain_config = (config.get("extra") == "forbid" and config.get("allow_inf_nan") is False
                        and not any(config.get(k) for k in ("strict", "str_strip_whitespace", "str_to_lower",
                                                            "str_to_upper", "str_min_length", "str_max_length",
                                                            "populate_by_name", "validate_by_alias",
                                                            "alias_generator", "coerce_numbers_to_str",
                                                            "use_enum_values", "revalidate_instances"))
                        and config.get("revalidate_instances", "never") == "never")
        decorators = model.__pydantic_decorators__
        validators = [name for name, dec in decorators.model_validators.items() if dec.info.mode == "before"]
        unknown_validators = (len(validators) != len(decorators.model_validators) or decorators.field_validators
                              or decorators.validators or decorators.root_validators
                              or decorators.field_serializers or decorators.model_serializers
                              or decorators.computed_fields or not plain_config)
        fields: dict[str, Any] = {}
        for name, info in model.model_fields.items():
            desc = _describe(info.annotation, list(info.metadata))
            if info.alias or info.validation_alias or info.exclude or info.discriminator:
                desc = ("off",)
            stack = [desc]
            while stack:  # nested models come next
                d = stack.pop()
                if d[0] == "model":
                    pending.append(getattr(models, d[1]))
                elif d[0] in ("union", "tuple"):
                    stack.extend(d[1])
                elif d[0] in ("list", "dict"):
                    stack.append(d[1])
            if info.default is not PydanticUndefined:
                default_kind, default = ("value", info.default) if not info.validate_default else ("off", None)
                if type(default) in (list, dict):
                    default_kind = "copy"
                if not _plain(default):
                    default_kind, default = "off", None
            elif info.default_factory is not None:
                if info.default_factory is dict and info.validate_default and desc[0] == "model":
                    default_kind, default = "table", None
                elif getattr(info, "default_factory_takes_validated_data", False) or info.validate_default:
                    default_kind, default = "off", None
                else:
                    default = info.default_factory()
                    default_kind = "copy" if _plain(default) else "off"
                    default = default if default_kind == "copy" else None
            else:
                default_kind, default = "required", None
            fields[name] = (desc, default_kind, default)
        schema[model.__name__] = {
            "fields": fields,
            "validators": tuple(validators) + (("<unknown>",) if unknown_validators else ()),
            "properties": tuple(n for n, v in vars(model).items() if isinstance(v, property)),
        }
        assert issubclass(model, BaseModel)
    lines = ["# Generated by python -m dlmspec.generated; do not edit.",
             "# Sources: dlmspec/spec/models.py and the modules holding some of its tables (the pydantic spec models), through dlmspec.spec.fast_build:generate.",
             '"""The spec models\' schema table that :mod:`dlmspec.spec.fast` checks a plain spec with',
             "(generated: see :func:`dlmspec.spec.fast_build.generate`).\"\"\"",
             "",
             "from __future__ import annotations",
             "",
             "from typing import Any",
             "",
             "#: zlib.crc32 of the spec models (dlmspec.spec.fast.SPEC_SOURCES) when this table was generated.",
             f"SPEC_CRC32 = {sources_crc32():#010x}",
             "",
             "#: Per model: 'validators' (mode='before' names), 'properties', 'fields' (name -> (type, default kind, default)).",
             "SCHEMA: dict[str, dict[str, Any]] = {"]
    for name, model in schema.items():
        lines.append(f"    {name!r}: {{")
        lines.append(f"        'validators': {model['validators']!r},")
        lines.append(f"        'properties': {model['properties']!r},")
        lines.append("        'fields': {")
        lines.extend(f"            {field!r}: {entry!r}," for field, entry in model["fields"].items())
        lines.append("        },")
        lines.append("    },")
    lines += ["}"]
    return "\n".join(lines) + "\n"
