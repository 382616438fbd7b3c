"""dlmspec.spec.fast: the schema table is generated from dlmspec.spec.models's models and up to date, and
what the checker builds is what pydantic builds (same values, types, defaults, fields set,
properties), or nothing: a spec it accepts is one pydantic accepts, with the same result."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import pytest

from dlmspec.spec import fast as fastspec
from dlmspec.spec.load import load
from dlmspec.spec.models import Spec

ROOT = Path(__file__).resolve().parents[3]
SPECS = sorted((ROOT / "specs").glob("*.toml"))


def test_generated_table_matches_the_models_checksum() -> None:
    """SCHEMA was generated from the dlmspec/spec/models.py (and its table modules) beside it (tests/integration/project/test_generated.py checks
    the file is what `python -m dlmspec.generated` writes)."""
    assert fastspec._current()


def test_every_model_and_validator_is_known() -> None:
    """Every model of the spec is in the table, every field is checked (none left to pydantic
    by type) and every validator and property is repeated here; else plain specs would fall
    back to pydantic without anyone noticing."""
    from pydantic import BaseModel

    from dlmspec.spec import models

    sources = {f"dlmspec.spec.{path.stem}" for path in fastspec.SPEC_SOURCES}  # models.py and its table modules
    names = {n for n, v in vars(models).items() if isinstance(v, type) and issubclass(v, BaseModel)
             and v.__module__ in sources and n != "Section"}
    assert set(fastspec.SCHEMA) == names
    for name, model in fastspec.SCHEMA.items():
        assert fastspec._CLASSES[name]._fastspec_known, name
        for field, (desc, default_kind, _) in model["fields"].items():
            # ('off',) marks a type left to pydantic ("'off'" quoted: the literal "offline" is no such mark)
            assert "'off'" not in repr(desc) and default_kind != "off", (name, field)


def _same(fast: Any, slow: Any, where: str = "spec") -> None:
    """``fast`` (from fastspec) equals ``slow`` (pydantic's) in value and type, all the way down."""
    from pydantic import BaseModel

    if isinstance(slow, BaseModel):
        assert isinstance(fast, fastspec.SpecTable), where
        assert type(fast).__name__ == type(slow).__name__, where
        assert list(fast.__dict__) == list(slow.__dict__), where
        assert fast.model_fields_set == slow.model_fields_set, where
        for key, value in slow.__dict__.items():
            _same(fast.__dict__[key], value, f"{where}.{key}")
        for name, attr in vars(type(slow)).items():
            if isinstance(attr, property):
                assert getattr(fast, name) == getattr(slow, name), f"{where}.{name}"
        return
    assert type(fast) is type(slow), (where, fast, slow)
    if isinstance(slow, list):
        assert len(fast) == len(slow), where
        for i, (a, b) in enumerate(zip(fast, slow)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(slow, dict):
        assert list(fast) == list(slow), where
        for key in slow:
            _same(fast[key], slow[key], f"{where}.{key}")
    elif isinstance(slow, float) and math.isnan(slow):
        assert math.isnan(fast), where
    else:
        assert fast == slow, where


def _pydantic(data: dict[str, Any]) -> Spec | None:
    from pydantic import ValidationError

    try:
        return Spec.model_validate(data)
    except ValidationError:
        return None


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_bundled_specs_check_as_pydantic_validates(path: Path) -> None:
    raw = load(path).raw
    fast = fastspec.check(raw)
    assert fast is not None, "a bundled spec should not need pydantic"
    _same(fast, Spec.model_validate(raw))
    assert load(path, fast=True).spec == load(path).spec


#: Values tried on every field: valid and invalid ones of every kind, and pydantic's lax
#: conversions (which the checker leaves to pydantic).
PROBES: list[Any] = [0, 1, 2, -1, 7, 10_000, 10_001, 1 << 70, 0.0, 0.5, 1.0, 2.0, -0.5, 1e-9, math.inf, math.nan,
                     True, False, None, "", "x", "2", "1.5", "true", [], [0], [1, 0], [2], ["a"], [{"prefix": "p"}],
                     ["p"], [1.0], {}, {"a": "b"}, {"a": 1}, {"prefix": "p", "weight": 2},
                     [[0, 1.0]], [[10, 3e-4], [100, 0]], [[1, 2, 3]], [[1]], [[1.0, 2.0]], [["a", 1.0]], [[True, 1.0]]]


def _probes(desc: tuple) -> list[Any]:
    extra: list[Any] = []
    stack = [desc]
    while stack:
        d = stack.pop()
        if d[0] == "literal":
            extra += [*d[1], d[1][0].upper(), [d[1][0]], [d[1][0], "bogus"]]
        elif d[0] in ("union", "list", "dict", "tuple"):
            stack.extend(d[1] if d[0] in ("union", "tuple") else [d[1]])
        elif d[0] in ("int", "float"):
            extra += [b for b in d[1].values()]
    return PROBES + extra


def _cases() -> list[tuple[str, str, Any]]:
    cases = []
    paths = {"Spec": ""}
    for name, model in fastspec.SCHEMA.items():  # where each table sits in a spec
        for field, (desc, _, _) in model["fields"].items():
            if desc[0] == "model" and name in paths:
                paths.setdefault(desc[1], f"{paths[name]}{field}.")
    paths.setdefault("SFTSpec", "stage.sft.")
    paths.setdefault("RLSpec", "stage.rl.")
    paths.setdefault("SlurmSpec", "cluster.slurm.")
    for name, model in fastspec.SCHEMA.items():
        if name not in paths:
            continue
        for field, (desc, _, _) in model["fields"].items():
            for value in _probes(desc):
                cases.append((name, paths[name] + field, value))
    return cases


def test_checker_accepts_only_what_pydantic_accepts_and_builds_the_same() -> None:
    """Every field of every table set to valid, invalid and lax values on the demo spec (and
    on the demo with a preset): whenever the checker builds a spec, pydantic builds the same;
    whenever pydantic refuses, the checker gives None (then pydantic reports it)."""
    base = tomllib.loads((ROOT / "specs" / "demo-dlm.toml").read_text())
    with_preset = {**base, "model": {"preset": "qwen3-0.6b"}}
    accepted = refused = 0
    for name, key, value in _cases():
        for start in (base, with_preset) if key.startswith("model.") else (base,):
            data = _set(start, key, value)
            fast = fastspec.check(data)
            slow = _pydantic(data)
            if fast is None:
                refused += 1
                continue
            accepted += 1
            assert slow is not None, (key, value)
            _same(fast, slow, key)
            assert data == _set(start, key, value), "check() changed its input"
    assert accepted > 400 and refused > 400, (accepted, refused)


def _set(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    import copy

    out = copy.deepcopy(data)
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = copy.deepcopy(value)
    return out


def test_missing_tables_unknown_keys_and_presets_are_left_to_pydantic() -> None:
    base = tomllib.loads((ROOT / "specs" / "demo-dlm.toml").read_text())
    assert fastspec.check(base) is not None
    for data in ({k: v for k, v in base.items() if k != "train"}, {**base, "bogus": 1},
                 {**base, "model": {"preset": "no-such-preset"}}, {**base, "model": "x"}, [], None):
        assert fastspec.check(data) is None  # type: ignore[arg-type]
        assert _pydantic(data) is None if isinstance(data, dict) else True  # type: ignore[arg-type]


def test_a_stale_table_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    base = tomllib.loads((ROOT / "specs" / "demo-dlm.toml").read_text())
    monkeypatch.setattr(fastspec, "SPEC_CRC32", fastspec.SPEC_CRC32 ^ 1)
    assert fastspec.check(base) is None
    loaded = load(ROOT / "specs" / "demo-dlm.toml", fast=True)
    assert isinstance(loaded.spec, Spec)


def test_tables_answer_the_rest_from_their_pydantic_twin() -> None:
    path = ROOT / "specs" / "mixtral-8x7b-mdm.toml"
    fast, slow = load(path, fast=True).spec, load(path).spec
    assert isinstance(fast, fastspec.SpecTable)
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_dump_json() == slow.model_dump_json()
    assert repr(fast) == repr(slow) and repr(fast.data.train[0]) == repr(slow.data.train[0])
    assert fast == slow and slow == fast and fast.model == slow.model and fast.data.train[0] == slow.data.train[0]
    assert dict(fast.model) == dict(slow.model)
    changed = fast.replace(**{"parallel.tensor_model_parallel_size": 2})
    assert changed == slow.replace(**{"parallel.tensor_model_parallel_size": 2})
    with pytest.raises(TypeError):
        fast.name = "x"
    import copy

    assert copy.deepcopy(fast) is fast and copy.copy(fast.model) is fast.model  # read-only
    with pytest.raises(AttributeError):
        fast.no_such_attribute  # noqa: B018


def test_section_defaults() -> None:
    from dlmspec.spec.models import SlurmSpec

    fast = load(ROOT / "specs" / "demo-dlm.toml", fast=True).spec
    table = fastspec.section_defaults(fast, "SlurmSpec")
    _same(table, SlurmSpec())
    assert table == SlurmSpec()
    assert isinstance(fastspec.section_defaults(Spec.model_validate(load(ROOT / "specs" / "demo-dlm.toml").raw),
                                                "SlurmSpec"), SlurmSpec)
