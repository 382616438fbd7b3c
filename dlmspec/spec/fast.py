"""Checking a plainly valid spec without importing pydantic (``dlmspec validate`` and ``plan``).

``dlmspec validate SPEC`` and ``dlmspec plan SPEC`` are meant to answer in under 0.3 s on a
2-core machine. Importing pydantic alone takes about 0.18 s there, building the spec models
another 0.05 s (``bench/validate/results.json`` has the figures), so with pydantic the
commands cannot get there. The pydantic models of :mod:`dlmspec.spec.models` stay the single source of
truth; this module holds what the checker needs from them, generated from them:

* :data:`SCHEMA`, in the generated module :mod:`dlmspec.spec.fast_schema`: per model, each field's type
  (int, float, bool, str, literal, optional, list, tuple, dict, nested model, as pydantic's
  ``FieldInfo`` says), bounds and default, the model's ``model_validator`` names and properties;
  and :data:`SPEC_CRC32`, the checksum of ``dlmspec/spec/models.py`` and the modules holding some
  of its tables (:data:`SPEC_SOURCES`) it was generated from.
  ``python -m dlmspec.generated`` rewrites it; ``python -m dlmspec.generated --check``
  exits 1 when it is stale (``tests/integration/project/test_generated.py`` runs it; ``tests/unit/spec/test_fastspec.py`` compares what :func:`check`
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
  :func:`dlmspec.generate_presets.apply_preset`, ``ModelSpec._apply_preset`` is repeated (falling
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
generator (:func:`dlmspec.spec.fast_build.generate`).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from dlmspec.spec.fast_schema import SCHEMA, SPEC_CRC32
from dlmspec.spec.names import PlaceholderError, expand_names
from dlmspec.spec.presets import PRESETS
from dlmspec.generate_presets import PresetError, apply_preset
from dlmspec.spec.shorthands import prefix_strings

#: The spec models this table is generated from: dlmspec/spec/models.py and the modules beside it
#: that hold some of its tables.
SPEC_SOURCES = tuple(Path(__file__).with_name(name)
                     for name in ("models.py", "section.py", "stage_models.py", "generate_models.py"))


def sources_crc32() -> int:
    """zlib.crc32 of :data:`SPEC_SOURCES`' bytes, one after the other (raises OSError)."""
    import zlib

    crc = 0
    for path in SPEC_SOURCES:
        crc = zlib.crc32(path.read_bytes(), crc)
    return crc


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


def _generate_preset(data: Any) -> Any:
    """``GenerateSpec._follow_gen_length``: :func:`dlmspec.generate_presets.apply_preset` (an
    unknown preset is pydantic's error)."""
    try:
        return apply_preset(data)
    except PresetError:
        raise _Off from None


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
    ("GenerateSpec", "_follow_gen_length"): _generate_preset,
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
    """Whether :data:`SCHEMA` was generated from the spec models beside this file (:data:`SPEC_SOURCES`)."""
    try:
        return sources_crc32() == SPEC_CRC32
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


_CLASSES = _table_classes()

if __name__ == "__main__":  # the old command: regenerates every generated file
    from dlmspec.generated import main

    sys.exit(main(sys.argv[1:]))
