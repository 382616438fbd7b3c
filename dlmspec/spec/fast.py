"""Checking a plainly valid spec without importing pydantic (``dlmspec validate`` and ``plan``).

Issues #2 and #4 ask for ``dlmspec validate SPEC`` and ``dlmspec plan SPEC`` under 0.3 s on a
2-core machine. Importing pydantic alone takes about 0.18 s there, building the spec models
another 0.05 s (``bench/validate/results.json`` has the figures), so with pydantic the
commands cannot get there. The pydantic models of :mod:`dlmspec.spec.models` stay the single source of
truth; this module holds what the checker needs from them, generated from them:

* :data:`SCHEMA`, in the generated block at the end of this file: per model, each field's type
  (int, float, bool, str, literal, optional, list, tuple, dict, nested model, as pydantic's
  ``FieldInfo`` says), bounds and default, the model's ``model_validator`` names and properties;
  and :data:`SPEC_CRC32`, the checksum of ``dlmspec/spec/models.py`` it was generated from.
  ``python -m dlmspec.spec.fast`` rewrites the block; ``python -m dlmspec.spec.fast --check``
  exits 1 when it is stale (``tests/spec/test_fastspec.py`` runs it, and compares what :func:`check`
  builds with pydantic's models on every bundled spec and on generated ones).
* :func:`check`: the merged spec dict -> a :class:`SpecTable` tree, or ``None`` whenever
  anything is not plainly valid: a value of a type other than the field's own (``"2"`` or
  ``2.0`` for an int, ``1`` for a bool: pydantic refuses them: the models are strict), a
  bound broken, an unknown or missing key, a non-finite float, an unknown preset, a field or a
  validator this module does not know, or a table older than ``dlmspec/spec/models.py`` (checked at
  run time, so editing the models without regenerating costs speed, never correctness). The
  caller (:func:`dlmspec.spec.load.load` with ``fast=True``) then validates with pydantic, so every
  error and message is pydantic's, unchanged. Only the four ``mode="before"`` validators of the
  models are known here (:data:`_VALIDATORS`): ``DataSpec._prefix_strings`` calls the same
  :func:`dlmspec.spec.shorthands.prefix_strings`, ``Spec._expand_name`` the same
  :func:`dlmspec.spec.names.expand_names`, ``GenerateSpec._follow_gen_length`` calls the same
  :func:`dlmspec.generate_settings.follow_gen_length`, ``ModelSpec._apply_preset`` is repeated (falling
  back to pydantic where it cannot decide); a model with any other validator is always left to
  pydantic.

A :class:`SpecTable` acts as the model instance pydantic would have built from the same input:
the fields as attributes (same values and types, same defaults), ``model_fields_set``,
iteration, equality, and the models' properties (``ModelSpec.is_moe``,
``ClusterSpec.world_size``). Anything else (``model_dump``, ``Spec.replace``, ``repr``, ...)
is answered by the pydantic model built from the same input on first use (:func:`pydantic_twin`),
so it is the same too, at pydantic's cost. Assigning to a field raises ``TypeError`` (the
copy would no longer match its pydantic twin); nothing in ``validate``/``plan`` assigns.

Nothing here imports pydantic (or :mod:`dlmspec.spec.models`) except :func:`pydantic_twin` and the
generator (:func:`generate`).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from dlmspec.spec.names import PlaceholderError, expand_names
from dlmspec.spec.presets import PRESETS
from dlmspec.generate_settings import follow_gen_length
from dlmspec.spec.shorthands import prefix_strings

#: The spec models this table is generated from.
SPEC_SOURCE = Path(__file__).with_name("models.py")


class _Off(Exception):
    """The input is not plainly valid (or not understood here): pydantic decides."""


# --------------------------------------------------------------------------------------------
# The objects


class SpecTable:
    """A validated table of a spec, read-only; see the module docstring. ``type(x).__name__``
    is the model's (``"Spec"``, ``"ModelSpec"``, ...)."""

    __slots__ = ("__dict__", "model_fields_set", "_fastspec_parent", "_fastspec_step", "_fastspec_raw",
                 "_fastspec_twin")

    def __init__(self, values: dict[str, Any], fields_set: set[str], raw: Any) -> None:
        self.__dict__.update(values)
        set_ = object.__setattr__
        set_(self, "model_fields_set", fields_set)
        set_(self, "_fastspec_parent", None)
        set_(self, "_fastspec_step", ())
        set_(self, "_fastspec_raw", raw)
        set_(self, "_fastspec_twin", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError(f"{type(self).__name__} from dlmspec.spec.fast is read-only; "
                        "load the spec without fast=True to change it")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def __getattr__(self, name: str) -> Any:
        """What a field or property does not answer: the pydantic model's attribute."""
        if name.startswith("__") or name.startswith("_fastspec"):
            raise AttributeError(name)
        return getattr(pydantic_twin(self), name)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        yield from [(k, v) for k, v in self.__dict__.items() if not k.startswith("_")]

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, SpecTable):
            return type(self).__name__ == type(other).__name__ and self.__dict__ == other.__dict__
        if hasattr(type(other), "__pydantic_fields__"):
            return pydantic_twin(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as pydantic's (mutable) models

    def __copy__(self) -> SpecTable:
        return self  # read-only: a copy could differ in nothing

    def __deepcopy__(self, memo: dict[int, Any]) -> SpecTable:
        return self

    def __repr__(self) -> str:
        return repr(pydantic_twin(self))


def pydantic_twin(table: SpecTable) -> Any:
    """The pydantic model instance ``table`` stands for (imports pydantic; built once per
    tree, from the same input)."""
    parent = object.__getattribute__(table, "_fastspec_parent")
    if parent is not None:
        twin = pydantic_twin(parent)
        for step in object.__getattribute__(table, "_fastspec_step"):
            twin = twin[step] if isinstance(twin, (list, dict)) else getattr(twin, step)
        return twin
    twin = object.__getattribute__(table, "_fastspec_twin")
    if twin is None:
        from dlmspec.spec import models

        model = getattr(models, type(table).__name__)
        twin = model.model_validate(object.__getattribute__(table, "_fastspec_raw"))
        object.__setattr__(table, "_fastspec_twin", twin)
    return twin


def _is_moe(self: Any) -> bool:
    return self.num_experts is not None


def _world_size(self: Any) -> int:
    return self.gpus_per_node * self.nodes


#: The models' properties, repeated (the tests compare them with the models' on every spec).
_PROPERTIES: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("ModelSpec", "is_moe"): _is_moe,
    ("ClusterSpec", "world_size"): _world_size,
}


def _apply_preset(data: Any) -> Any:
    """``ModelSpec._apply_preset``: fill keys from ``preset`` under the explicit ones (an
    unknown id is pydantic's error)."""
    if isinstance(data, dict) and isinstance(data.get("preset"), str):
        preset = PRESETS.get(data["preset"])
        if preset is None:
            raise _Off
        return {**preset, **data}
    return data


def _prefix_strings(data: Any) -> Any:
    """``DataSpec._prefix_strings``: :func:`dlmspec.spec.shorthands.prefix_strings`."""
    return prefix_strings(data)


def _expand_name(data: Any) -> Any:
    """``Spec._expand_name``: :func:`dlmspec.spec.names.expand_names` (a refused placeholder is
    pydantic's error)."""
    try:
        return expand_names(data)
    except PlaceholderError:
        raise _Off from None


#: The models' ``mode="before"`` validators, repeated: (model, name) -> function.
_VALIDATORS: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("ModelSpec", "_apply_preset"): _apply_preset,
    ("DataSpec", "_prefix_strings"): _prefix_strings,
    ("Spec", "_expand_name"): _expand_name,
    ("GenerateSpec", "_follow_gen_length"): follow_gen_length,
}


def _table_classes() -> dict[str, type]:
    classes = {}
    for name, model in SCHEMA.items():
        namespace: dict[str, Any] = {"__slots__": (), "__module__": __name__,
                                     "__doc__": f"dlmspec.spec.models.{name}, read-only (dlmspec.spec.fast)."}
        known = True
        for prop in model["properties"]:
            func = _PROPERTIES.get((name, prop))
            if func is None:
                known = False  # answered by the pydantic twin (SpecTable.__getattr__)
            else:
                namespace[prop] = property(func)
        namespace["_fastspec_known"] = known and all((name, v) in _VALIDATORS for v in model["validators"])
        classes[name] = type(name, (SpecTable,), namespace)
    return classes


# --------------------------------------------------------------------------------------------
# The checker

_INT_RANGE = 1 << 63  # pydantic-core's i64; bigger ints are left to it
_FLOAT_EXACT = 1 << 53  # ints a float holds exactly


def _bounded(value: float, bounds: dict[str, Any]) -> bool:
    for kind, bound in bounds.items():
        if not (value > bound if kind == "gt" else value >= bound if kind == "ge"
                else value < bound if kind == "lt" else value <= bound if kind == "le" else False):
            return False
    return True


def _value(desc: tuple, value: Any, parent: SpecTable | None, step: tuple) -> Any:
    kind = desc[0]
    if kind == "int":
        if type(value) is not int or not -_INT_RANGE <= value < _INT_RANGE or not _bounded(value, desc[1]):
            raise _Off
        return value
    if kind == "float":
        if type(value) is int:
            if not -_FLOAT_EXACT <= value <= _FLOAT_EXACT:
                raise _Off
            value = float(value)
        elif type(value) is not float or not math.isfinite(value):
            raise _Off
        if not _bounded(value, desc[1]):
            raise _Off
        return value
    if kind == "bool":
        if type(value) is not bool:
            raise _Off
        return value
    if kind == "str":
        if type(value) is not str or len(value) < desc[1]:
            raise _Off
        return value
    if kind == "literal":
        if type(value) is not str or value not in desc[1]:
            raise _Off
        return value
    if kind == "none":
        if value is not None:
            raise _Off
        return None
    if kind == "union":
        for option in desc[1]:
            try:
                return _value(option, value, parent, step)
            except _Off:
                continue
        raise _Off
    if kind == "list":
        if type(value) is not list:
            raise _Off
        return [_value(desc[1], item, parent, (*step, i)) for i, item in enumerate(value)]
    if kind == "tuple":  # a fixed-length tuple, written as a TOML array
        if type(value) is not list or len(value) != len(desc[1]):
            raise _Off
        return tuple(_value(d, item, parent, (*step, i)) for i, (d, item) in enumerate(zip(desc[1], value)))
    if kind == "dict":
        if type(value) is not dict or any(type(k) is not str for k in value):
            raise _Off
        if desc[1] == ("any",):
            return dict(value)
        return {k: _value(desc[1], v, parent, (*step, k)) for k, v in value.items()}
    if kind == "model":
        return _table(desc[1], value, parent, step)
    raise _Off  # "off": a type this module does not check


def _copy(value: Any) -> Any:
    if type(value) is list:
        return [_copy(v) for v in value]
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()}
    return value


def _table(name: str, data: Any, parent: SpecTable | None, step: tuple) -> SpecTable:
    cls = _CLASSES[name]
    if not cls._fastspec_known:
        raise _Off
    model = SCHEMA[name]
    raw = data
    for validator in model["validators"]:
        data = _VALIDATORS[(name, validator)](data)
    if type(data) is not dict:
        raise _Off
    fields = model["fields"]
    if any(key not in fields for key in data):
        raise _Off
    node = cls({}, set(data), raw)
    values = node.__dict__
    for field, (desc, default_kind, default) in fields.items():
        if field in data:
            values[field] = _value(desc, data[field], node, (field,))
        elif default_kind == "value":
            values[field] = default
        elif default_kind == "copy":
            values[field] = _copy(default)
        elif default_kind == "table":
            values[field] = _table(desc[1], {}, node, (field,))
        else:  # required, or a default this module does not rebuild
            raise _Off
    if parent is not None:
        object.__setattr__(node, "_fastspec_parent", parent)
        object.__setattr__(node, "_fastspec_step", step)
    return node


def _current() -> bool:
    """Whether :data:`SCHEMA` was generated from the ``dlmspec/spec/models.py`` beside this file."""
    import zlib

    try:
        return zlib.crc32(SPEC_SOURCE.read_bytes()) == SPEC_CRC32
    except OSError:
        return False


def check(data: dict[str, Any]) -> SpecTable | None:
    """``data`` (a merged spec: TOML tables, ``extends`` and ``--set`` applied) as a
    :class:`SpecTable` standing for ``Spec.model_validate(data)``; ``None`` when pydantic must
    decide (see the module docstring). Never raises for bad input; ``data`` is not changed."""
    if not _current():
        return None
    try:
        return _table("Spec", data, None, ())
    except (_Off, RecursionError):
        return None


def section_defaults(like: Any, name: str) -> Any:
    """The model ``name`` (e.g. ``"SlurmSpec"``) at its defaults: a :class:`SpecTable` when
    ``like`` is one (no pydantic import), else the pydantic model ``name()``."""
    if isinstance(like, SpecTable):
        return _table(name, {}, None, ())
    from dlmspec.spec import models

    return getattr(models, name)()


# --------------------------------------------------------------------------------------------
# The generator: dlmspec.spec.models's models -> SCHEMA


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
    """The generated block of this file, from the models of :mod:`dlmspec.spec.models` (imports
    pydantic)."""
    import zlib

    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    from dlmspec.spec import models

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
    lines = [_BEGIN, f"SPEC_CRC32 = {zlib.crc32(SPEC_SOURCE.read_bytes()):#010x}",
             "SCHEMA: dict[str, dict[str, Any]] = {"]
    for name, model in schema.items():
        lines.append(f"    {name!r}: {{")
        lines.append(f"        'validators': {model['validators']!r},")
        lines.append(f"        'properties': {model['properties']!r},")
        lines.append("        'fields': {")
        lines.extend(f"            {field!r}: {entry!r}," for field, entry in model["fields"].items())
        lines.append("        },")
        lines.append("    },")
    lines += ["}", _END]
    return "\n".join(lines) + "\n"


_BEGIN = "# --- generated by `python -m dlmspec.spec.fast` from dlmspec/spec/models.py; do not edit ---"
_END = "# --- end of generated block ---"


def _main(argv: list[str]) -> int:
    """``python -m dlmspec.spec.fast [--check]``: rewrite the generated block (or, with
    ``--check``, exit 1 when it differs from what the models give)."""
    path = Path(__file__)
    text = path.read_text(encoding="utf-8")
    head, _, rest = text.rpartition(_BEGIN + "\n")
    _, _, tail = rest.partition(_END + "\n")
    new = head + generate() + tail
    if "--check" in argv:
        if new != text:
            print(f"{path} is out of date with dlmspec/spec/models.py: run python -m dlmspec.spec.fast", file=sys.stderr)
            return 1
        return 0
    if new != text:
        path.write_text(new, encoding="utf-8")
        print(f"rewrote {path}")
    return 0


# --------------------------------------------------------------------------------------------
# --- generated by `python -m dlmspec.spec.fast` from dlmspec/spec/models.py; do not edit ---
SPEC_CRC32 = 0xcea3d5f3
SCHEMA: dict[str, dict[str, Any]] = {
    'Spec': {
        'validators': ('_expand_name',),
        'properties': (),
        'fields': {
            'name': (('str', 1), 'value', 'dlmspec-run'),
            'description': (('union', (('str', 0), ('none',))), 'value', None),
            'model': (('model', 'ModelSpec'), 'required', None),
            'objective': (('model', 'ObjectiveSpec'), 'table', None),
            'stage': (('model', 'StageSpec'), 'table', None),
            'parallel': (('model', 'ParallelSpec'), 'table', None),
            'recompute': (('model', 'RecomputeSpec'), 'table', None),
            'precision': (('model', 'PrecisionSpec'), 'table', None),
            'kernels': (('model', 'KernelsSpec'), 'table', None),
            'train': (('model', 'TrainSpec'), 'required', None),
            'data': (('model', 'DataSpec'), 'table', None),
            'checkpoint': (('model', 'CheckpointSpec'), 'table', None),
            'cluster': (('model', 'ClusterSpec'), 'table', None),
            'logging': (('model', 'LoggingSpec'), 'table', None),
            'generate': (('union', (('model', 'GenerateSpec'), ('none',))), 'value', None),
            'lock': (('union', (('dict', ('any',)), ('none',))), 'value', None),
        },
    },
    'ModelSpec': {
        'validators': ('_apply_preset',),
        'properties': ('is_moe',),
        'fields': {
            'preset': (('union', (('str', 0), ('none',))), 'value', None),
            'num_layers': (('int', {'gt': 0, 'le': 10000}), 'required', None),
            'hidden_size': (('int', {'gt': 0}), 'required', None),
            'ffn_hidden_size': (('int', {'gt': 0}), 'required', None),
            'num_attention_heads': (('int', {'gt': 0}), 'required', None),
            'num_query_groups': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'kv_channels': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'vocab_size': (('int', {'gt': 0}), 'required', None),
            'make_vocab_size_divisible_by': (('int', {'gt': 0}), 'value', 128),
            'max_position_embeddings': (('int', {'gt': 0}), 'required', None),
            'position_embedding_type': (('literal', ('rope', 'learned_absolute', 'none')), 'value', 'rope'),
            'rotary_base': (('float', {'gt': 0}), 'value', 10000.0),
            'rotary_percent': (('float', {'gt': 0.0, 'le': 1.0}), 'value', 1.0),
            'normalization': (('literal', ('RMSNorm', 'LayerNorm')), 'value', 'RMSNorm'),
            'layernorm_epsilon': (('float', {'gt': 0}), 'value', 1e-05),
            'activation': (('literal', ('swiglu', 'geglu', 'gelu', 'relu', 'squared_relu', 'silu')), 'value', 'swiglu'),
            'qk_layernorm': (('bool',), 'value', False),
            'add_bias_linear': (('bool',), 'value', False),
            'add_qkv_bias': (('bool',), 'value', False),
            'untie_embeddings_and_output_weights': (('bool',), 'value', True),
            'hidden_dropout': (('float', {'ge': 0.0, 'lt': 1.0}), 'value', 0.0),
            'attention_dropout': (('float', {'ge': 0.0, 'lt': 1.0}), 'value', 0.0),
            'init_method_std': (('float', {'gt': 0}), 'value', 0.02),
            'num_experts': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'moe_router_topk': (('int', {'gt': 0}), 'value', 2),
            'moe_ffn_hidden_size': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'moe_shared_expert_intermediate_size': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'moe_layer_freq': (('union', (('int', {'gt': 0}), ('list', ('int', {})))), 'value', 1),
            'moe_router_load_balancing_type': (('literal', ('aux_loss', 'seq_aux_loss', 'sinkhorn', 'none')), 'value', 'aux_loss'),
            'moe_aux_loss_coeff': (('float', {'ge': 0.0}), 'value', 0.01),
            'moe_token_dispatcher_type': (('literal', ('allgather', 'alltoall')), 'value', 'alltoall'),
            'moe_grouped_gemm': (('bool',), 'value', False),
            'transformer_impl': (('literal', ('auto', 'transformer_engine', 'local')), 'value', 'auto'),
            'attention_backend': (('union', (('literal', ('sdpa', 'flex', 'auto')), ('none',))), 'value', None),
        },
    },
    'ObjectiveSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'kind': (('literal', ('mdm', 'ar')), 'value', 'mdm'),
            'mask_token_id': (('union', (('int', {'ge': 0}), ('none',))), 'value', None),
            'attention_mask': (('union', (('literal', ('bidirectional', 'causal', 'block_causal')), ('none',))), 'value', None),
            'block_size': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'noise_schedule': (('literal', ('linear', 'cosine', 'polynomial')), 'value', 'linear'),
            'noise_schedule_exponent': (('union', (('float', {'gt': 0.0, 'le': 100.0}), ('none',))), 'value', None),
            'eps': (('float', {'ge': 0.0, 'lt': 1.0}), 'value', 0.001),
            'loss_weighting': (('literal', ('llada', 'realised', 'cart')), 'value', 'llada'),
            'variable_length_prob': (('float', {'ge': 0.0, 'le': 1.0}), 'value', 0.0),
            'min_masked_tokens': (('union', (('int', {'ge': 0}), ('none',))), 'value', None),
            'variable_length': (('union', (('literal', ('sequence', 'micro_batch')), ('none',))), 'value', None),
            'shift': (('union', (('bool',), ('none',))), 'value', None),
            'cart_p': (('union', (('float', {'gt': 0.0, 'lt': 1.0}), ('none',))), 'value', None),
            'unshift': (('union', (('bool',), ('none',))), 'value', None),
        },
    },
    'StageSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'kind': (('str', 0), 'value', 'pretrain'),
            'sft': (('union', (('model', 'SFTSpec'), ('none',))), 'value', None),
            'rl': (('union', (('model', 'RLSpec'), ('none',))), 'value', None),
        },
    },
    'ParallelSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'tensor_model_parallel_size': (('int', {'gt': 0}), 'value', 1),
            'pipeline_model_parallel_size': (('int', {'gt': 0}), 'value', 1),
            'virtual_pipeline_model_parallel_size': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'context_parallel_size': (('int', {'gt': 0}), 'value', 1),
            'cp_comm_type': (('literal', ('p2p', 'a2a', 'allgather', 'a2a+p2p')), 'value', 'p2p'),
            'expert_model_parallel_size': (('int', {'gt': 0}), 'value', 1),
            'expert_tensor_parallel_size': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'sequence_parallel': (('bool',), 'value', False),
            'use_distributed_optimizer': (('bool',), 'value', True),
            'data_parallel_sharding_strategy': (('literal', ('no_shard', 'optim', 'optim_grads', 'optim_grads_params')), 'value', 'no_shard'),
            'fsdp': (('literal', ('none', 'megatron', 'torch')), 'value', 'none'),
            'overlap_grad_reduce': (('bool',), 'value', True),
            'overlap_param_gather': (('bool',), 'value', False),
            'grad_reduce_in_fp32': (('bool',), 'value', True),
        },
    },
    'RecomputeSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'granularity': (('literal', ('none', 'selective', 'full')), 'value', 'none'),
            'method': (('union', (('literal', ('uniform', 'block')), ('none',))), 'value', None),
            'num_layers': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'modules': (('union', (('list', ('literal', ('core_attn', 'mlp', 'moe', 'moe_act', 'layernorm', 'shared_experts'))), ('none',))), 'value', None),
        },
    },
    'PrecisionSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'dtype': (('literal', ('bf16', 'fp16', 'fp32')), 'value', 'bf16'),
            'fp8': (('literal', ('none', 'hybrid', 'e4m3')), 'value', 'none'),
            'fp8_recipe': (('literal', ('delayed', 'tensorwise', 'mxfp8', 'blockwise')), 'value', 'delayed'),
            'fp8_dot_product_attention': (('bool',), 'value', False),
        },
    },
    'KernelsSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'cross_entropy': (('literal', ('auto', 'fused_linear', 'megatron')), 'value', 'auto'),
            'fused_linear_impl': (('literal', ('auto', 'liger', 'torch')), 'value', 'auto'),
            'cross_entropy_loss_fusion': (('bool',), 'value', False),
            'apply_rope_fusion': (('bool',), 'value', True),
            'gradient_accumulation_fusion': (('union', (('literal', ('auto',)), ('bool',))), 'value', 'auto'),
            'qkv_fusion': (('bool',), 'value', True),
            'compiled_norm': (('bool',), 'value', True),
            'sdpa_backend': (('literal', ('auto', 'flash', 'cudnn', 'efficient')), 'value', 'auto'),
        },
    },
    'TrainSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'micro_batch_size': (('int', {'gt': 0}), 'value', 1),
            'global_batch_size': (('int', {'gt': 0}), 'required', None),
            'seq_length': (('int', {'gt': 0}), 'required', None),
            'train_iters': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'train_tokens': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'seed': (('int', {}), 'value', 1234),
            'optimizer': (('literal', ('adam', 'sgd')), 'value', 'adam'),
            'lr': (('float', {'gt': 0}), 'value', 0.0003),
            'min_lr': (('float', {'ge': 0.0}), 'value', 3e-05),
            'lr_decay_style': (('literal', ('cosine', 'linear', 'constant', 'WSD', 'inverse-square-root', 'piecewise')), 'value', 'cosine'),
            'lr_points': (('union', (('list', ('tuple', (('int', {}), ('float', {})))), ('none',))), 'value', None),
            'lr_warmup_iters': (('int', {'ge': 0}), 'value', 0),
            'lr_warmup_fraction': (('union', (('float', {'ge': 0.0, 'le': 1.0}), ('none',))), 'value', None),
            'lr_decay_iters': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'lr_wsd_decay_style': (('literal', ('linear', 'cosine', 'exponential', 'minus_sqrt')), 'value', 'exponential'),
            'lr_wsd_decay_iters': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'weight_decay': (('float', {'ge': 0.0}), 'value', 0.1),
            'adam_beta1': (('float', {'ge': 0.0, 'lt': 1.0}), 'value', 0.9),
            'adam_beta2': (('float', {'ge': 0.0, 'lt': 1.0}), 'value', 0.95),
            'adam_eps': (('float', {'gt': 0}), 'value', 1e-08),
            'clip_grad': (('float', {'ge': 0.0}), 'value', 1.0),
            'eval_interval': (('int', {'gt': 0}), 'value', 1000),
            'eval_iters': (('int', {'gt': 0}), 'value', 10),
            'loss_normalization': (('union', (('literal', ('global_token', 'micro_batch', 'sequence', 'micro_batch_masked')), ('none',))), 'value', None),
        },
    },
    'DataSpec': {
        'validators': ('_prefix_strings',),
        'properties': (),
        'fields': {
            'train': (('list', ('model', 'BlendEntry')), 'copy', []),
            'valid': (('list', ('model', 'BlendEntry')), 'copy', []),
            'split': (('str', 0), 'value', '99,1,0'),
            'mock': (('bool',), 'value', False),
            'tokenizer': (('model', 'TokenizerSpec'), 'table', None),
            'num_workers': (('int', {'ge': 0}), 'value', 2),
            'reset_position_ids': (('bool',), 'value', False),
            'reset_attention_mask': (('bool',), 'value', False),
            'eod_mask_loss': (('bool',), 'value', False),
        },
    },
    'CheckpointSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'save': (('union', (('str', 0), ('none',))), 'value', None),
            'load': (('union', (('str', 0), ('none',))), 'value', None),
            'init_from': (('union', (('str', 0), ('none',))), 'value', None),
            'save_interval': (('int', {'gt': 0}), 'value', 1000),
            'save_at_end': (('bool',), 'value', True),
            'format': (('literal', ('torch_dist',)), 'value', 'torch_dist'),
            'resume': (('bool',), 'value', True),
            'resume_from_run': (('union', (('str', 0), ('none',))), 'value', None),
            'async_save': (('bool',), 'value', False),
        },
    },
    'ClusterSpec': {
        'validators': (),
        'properties': ('world_size',),
        'fields': {
            'gpu': (('str', 0), 'value', 'h100'),
            'gpus_per_node': (('int', {'gt': 0}), 'value', 8),
            'nodes': (('int', {'gt': 0}), 'value', 1),
            'interconnect': (('literal', ('infiniband', 'roce', 'ethernet')), 'value', 'infiniband'),
            'inter_node_gbps': (('float', {'gt': 0}), 'value', 400.0),
            'host_launch_us': (('union', (('float', {'gt': 0}), ('none',))), 'value', None),
            'slurm': (('union', (('model', 'SlurmSpec'), ('none',))), 'value', None),
            'allow_memory_overflow': (('bool',), 'value', False),
        },
    },
    'LoggingSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'log_interval': (('int', {'gt': 0}), 'value', 10),
            'run_dir': (('union', (('str', 0), ('none',))), 'value', None),
            'tensorboard_dir': (('union', (('str', 0), ('none',))), 'value', None),
            'wandb_project': (('union', (('str', 0), ('none',))), 'value', None),
            'wandb_exp_name': (('union', (('str', 0), ('none',))), 'value', None),
            'wandb_save_dir': (('union', (('str', 0), ('none',))), 'value', None),
            'wandb_entity': (('union', (('str', 0), ('none',))), 'value', None),
            'wandb_mode': (('union', (('literal', ('online', 'offline')), ('none',))), 'value', None),
            'wandb_tags': (('union', (('list', ('str', 0)), ('none',))), 'value', None),
            'profile': (('bool',), 'value', False),
            'profile_step_start': (('int', {'ge': 0}), 'value', 10),
            'profile_step_end': (('int', {'gt': 0}), 'value', 12),
            'profile_ranks': (('list', ('int', {'ge': 0})), 'copy', [0]),
        },
    },
    'GenerateSpec': {
        'validators': ('_follow_gen_length',),
        'properties': (),
        'fields': {
            'gen_length': (('int', {'gt': 0}), 'value', 128),
            'steps': (('int', {'gt': 0}), 'value', 128),
            'block_length': (('int', {'gt': 0}), 'value', 128),
            'remasking': (('literal', ('low_confidence', 'random', 'threshold')), 'value', 'low_confidence'),
            'threshold': (('float', {'gt': 0.0, 'le': 1.0}), 'value', 0.9),
            'temperature': (('float', {'ge': 0.0}), 'value', 0.0),
            'top_k': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'top_p': (('union', (('float', {'gt': 0.0, 'le': 1.0}), ('none',))), 'value', None),
            'cfg_scale': (('float', {'ge': 0.0}), 'value', 0.0),
            'seed': (('int', {'ge': 0}), 'value', 0),
        },
    },
    'SFTSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'chat_template': (('literal', ('chatml', 'llama3', 'plain', 'tokenizer')), 'value', 'chatml'),
            'mask_prompt': (('bool',), 'value', True),
            'prompt_key': (('str', 0), 'value', 'prompt'),
            'response_key': (('str', 0), 'value', 'response'),
            'packed_sequence': (('bool',), 'value', False),
            'over_long': (('literal', ('skip', 'truncate')), 'value', 'skip'),
            'pad_eos_tokens': (('union', (('int', {'ge': 0}), ('none',))), 'value', None),
        },
    },
    'RLSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'algorithm': (('literal', ('diffu-grpo', 'grpo')), 'value', 'diffu-grpo'),
            'num_rollouts': (('int', {'gt': 0}), 'value', 8),
            'reward': (('str', 0), 'value', 'exact_match'),
            'kl_coeff': (('float', {'ge': 0.0}), 'value', 0.04),
        },
    },
    'BlendEntry': {
        'validators': (),
        'properties': (),
        'fields': {
            'prefix': (('str', 0), 'required', None),
            'weight': (('float', {'gt': 0}), 'value', 1.0),
        },
    },
    'TokenizerSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'type': (('literal', ('HuggingFaceTokenizer', 'GPT2BPETokenizer', 'SentencePieceTokenizer', 'TikTokenizer', 'NullTokenizer', 'BertWordPieceLowerCase', 'BertWordPieceCase', 'GPTSentencePieceTokenizer', 'Llama2Tokenizer', 'MultimodalTokenizer', 'NullMultimodalTokenizer')), 'value', 'HuggingFaceTokenizer'),
            'model': (('union', (('str', 0), ('none',))), 'value', None),
            'vocab_file': (('union', (('str', 0), ('none',))), 'value', None),
            'merge_file': (('union', (('str', 0), ('none',))), 'value', None),
            'vocab_size': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'eod_id': (('union', (('int', {'ge': 0}), ('none',))), 'value', None),
        },
    },
    'SlurmSpec': {
        'validators': (),
        'properties': (),
        'fields': {
            'partition': (('union', (('str', 0), ('none',))), 'value', None),
            'account': (('union', (('str', 0), ('none',))), 'value', None),
            'qos': (('union', (('str', 0), ('none',))), 'value', None),
            'time': (('str', 0), 'value', '04:00:00'),
            'job_name': (('str', 0), 'value', 'dlmspec'),
            'output': (('str', 0), 'value', 'slurm-%x-%j.out'),
            'exclusive': (('bool',), 'value', True),
            'constraint': (('union', (('str', 0), ('none',))), 'value', None),
            'exclude': (('union', (('str', 0), ('none',))), 'value', None),
            'cpus_per_task': (('union', (('int', {'gt': 0}), ('none',))), 'value', None),
            'mem': (('union', (('str', 0), ('none',))), 'value', None),
            'launcher': (('literal', ('torchrun', 'srun')), 'value', 'torchrun'),
            'gpu_request': (('literal', ('gpus-per-node', 'gres', 'none')), 'value', 'gpus-per-node'),
            'gpu_type': (('union', (('str', 0), ('none',))), 'value', None),
            'container_image': (('union', (('str', 0), ('none',))), 'value', None),
            'container_runtime': (('literal', ('pyxis', 'apptainer')), 'value', 'pyxis'),
            'container_mounts': (('list', ('str', 0)), 'copy', []),
            'signal_seconds_before_end': (('int', {'gt': 0}), 'value', 300),
            'requeue': (('bool',), 'value', True),
            'env': (('dict', ('str', 0)), 'copy', {}),
        },
    },
}
# --- end of generated block ---

_CLASSES = _table_classes()

if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
