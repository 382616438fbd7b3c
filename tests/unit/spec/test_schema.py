"""`dlmspec schema`: the JSON Schema an editor checks spec files with. The bundled specs, `show`
output and `new` scaffolds conform to it; unknown keys, wrong types, values outside the allowed
ones and missing required keys do not; and on single-table edits it agrees with the loader.

jsonschema is not a dependency, so :func:`conforms` implements the keywords the schema uses
(and fails on any other, so a schema change cannot slip past it)."""

from __future__ import annotations

import copy
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from dlmspec.spec import models as spec_module
from dlmspec.check import find
from dlmspec.cli.commands import app
from dlmspec.cli.commands.new import starter_spec
from dlmspec.cli.commands.schema import spec_json_schema
from dlmspec.errors import SpecError
from dlmspec.gpus import gpu_ids
from dlmspec.spec.load import load_text
from dlmspec.spec.presets import preset_names
from spec_kit import spec_dict

ROOT = Path(__file__).resolve().parents[3]
SPECS = sorted((ROOT / "specs").glob("*.toml"))
SCHEMA = spec_json_schema()

_ANNOTATIONS = {"title", "description", "default", "$schema", "$id", "$defs"}
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "null": lambda v: v is None,
}


def conforms(value: Any, schema: dict[str, Any], root: dict[str, Any] = SCHEMA, path: str = "") -> list[str]:
    """Why ``value`` does not conform to ``schema`` (empty: it conforms). Draft 2020-12 keywords
    used by pydantic's schemas and :func:`dlmspec.cli.spec_json_schema` only."""
    errors: list[str] = []
    for keyword, arg in schema.items():
        if keyword in _ANNOTATIONS:
            continue
        if keyword == "$ref":
            assert arg.startswith("#/$defs/"), arg
            errors += conforms(value, root["$defs"][arg.removeprefix("#/$defs/")], root, path)
        elif keyword == "type":
            if not _TYPES[arg](value):
                errors.append(f"{path}: {value!r} is not {arg}")
        elif keyword == "enum":
            if value not in arg:
                errors.append(f"{path}: {value!r} not in {arg}")
        elif keyword == "const":
            if value != arg:
                errors.append(f"{path}: {value!r} != {arg!r}")
        elif keyword == "anyOf":
            if all(conforms(value, option, root, path) for option in arg):
                errors.append(f"{path}: {value!r} matches none of {len(arg)} options")
        elif keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if _TYPES["number"](value):
                ok = {"minimum": value >= arg, "maximum": value <= arg,
                      "exclusiveMinimum": value > arg, "exclusiveMaximum": value < arg}[keyword]
                if not ok:
                    errors.append(f"{path}: {value!r} violates {keyword} {arg}")
        elif keyword == "minLength":
            if isinstance(value, str) and len(value) < arg:
                errors.append(f"{path}: shorter than {arg}")
        elif keyword == "required":
            if isinstance(value, dict):
                errors += [f"{path}.{k}: missing" for k in arg if k not in value]
        elif keyword == "properties":
            if isinstance(value, dict):
                for k, sub in arg.items():
                    if k in value:
                        errors += conforms(value[k], sub, root, f"{path}.{k}")
        elif keyword == "additionalProperties":
            if isinstance(value, dict):
                extra = [k for k in value if k not in schema.get("properties", {})]
                if arg is False:
                    errors += [f"{path}.{k}: unknown key" for k in extra]
                elif isinstance(arg, dict):
                    for k in extra:
                        errors += conforms(value[k], arg, root, f"{path}.{k}")
                else:
                    assert arg is True, arg
        elif keyword == "items":
            if isinstance(value, list):
                for i, item in enumerate(value):
                    errors += conforms(item, arg, root, f"{path}[{i}]")
        elif keyword == "prefixItems":  # a fixed-length tuple, e.g. train.lr_points' [step, lr]
            if isinstance(value, list):
                for i, (item, sub) in enumerate(zip(value, arg)):
                    errors += conforms(item, sub, root, f"{path}[{i}]")
        elif keyword in ("minItems", "maxItems"):
            if isinstance(value, list) and (len(value) < arg if keyword == "minItems" else len(value) > arg):
                errors.append(f"{path}: {len(value)} items, {keyword} {arg}")
        else:
            raise AssertionError(f"schema keyword {keyword!r} is not handled by this test's validator")
    return errors


def check(document: dict[str, Any]) -> list[str]:
    return conforms(document, SCHEMA)


def test_schema_is_pydantics_with_the_loaders_shorthands() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    model = SCHEMA["$defs"]["ModelSpec"]["properties"]
    assert model["preset"]["enum"] == preset_names()
    assert SCHEMA["$defs"]["ClusterSpec"]["properties"]["gpu"]["enum"] == gpu_ids()
    assert model["num_layers"]["maximum"] == spec_module.MAX_LAYERS
    # Every key of every table is in the schema (editors complete all of them).
    for name, cls in vars(spec_module).items():
        if isinstance(cls, type) and issubclass(cls, spec_module.Section) and cls is not spec_module.Section:
            props = SCHEMA["properties"] if cls is spec_module.Spec else SCHEMA["$defs"][name]["properties"]
            assert set(cls.model_fields) <= set(props), name
            assert SCHEMA["$defs"].get(name, SCHEMA).get("additionalProperties", False) is False


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_bundled_specs_conform(path: Path) -> None:
    """As written (the SFT spec has `extends`) and fully resolved (`dlmspec show`)."""
    assert check(tomllib.loads(path.read_text())) == []
    shown = CliRunner().invoke(app, ["show", str(path)])
    assert shown.exit_code == 0
    assert check(tomllib.loads(shown.stdout)) == []


@pytest.mark.parametrize("preset", ["llada-8b", "mixtral-8x7b", "qwen3-1.7b"])
def test_starter_specs_conform(preset: str) -> None:
    assert check(tomllib.loads(starter_spec("s", preset))) == []


MINIMAL: dict[str, Any] = spec_dict({
    "name": None,
    "data": None,
    "cluster": None,
    "model": {"preset": "qwen3-0.6b"},
    "train": {"global_batch_size": 8, "seq_length": 512},
})
EXPLICIT: dict[str, Any] = spec_dict({
    "name": None,
    "data": None,
    "cluster": None,
    "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 512},
    "train": {"global_batch_size": 8, "seq_length": 512},
})


def _edit(base: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(base)
    *parents, last = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    if value is _DELETE:
        node.pop(last)
    else:
        node[last] = value
    return data


_DELETE = object()

#: (base, key, value, accepted): one edit each; the schema and the loader must agree.
EDITS: list[tuple[dict[str, Any], str, Any, bool]] = [
    (MINIMAL, "model.num_layers", 4, True),
    (MINIMAL, "model.num_layers", 0, False),
    (MINIMAL, "model.num_layers", spec_module.MAX_LAYERS + 1, False),
    (MINIMAL, "model.preset", "qwen3-1.7x", False),
    (MINIMAL, "model.num_layerz", 4, False),
    (MINIMAL, "model.activation", "swish", False),
    (MINIMAL, "model.moe_layer_freq", [1, 0], True),
    (MINIMAL, "objective.attention_mask", "block_causal", True),
    (MINIMAL, "objective.attention_mask", "full", False),
    (MINIMAL, "objective.eps", 0.0, True),  # MegaDLMs: t ~ U(0, 1)
    (MINIMAL, "objective.eps", -0.1, False),
    (MINIMAL, "train.lr_points", [[10, 1e-4]], True),
    (MINIMAL, "train.lr_points", [[10]], False),  # a [step, lr] pair (prefixItems, minItems)
    (MINIMAL, "train.lr_points", [[10, 1e-4, 3]], False),
    (MINIMAL, "cluster.gpu", "h200", True),
    (MINIMAL, "cluster.gpu", "h1000", False),
    (MINIMAL, "cluster.slurm", {"partition": "gpu", "env": {"A": "1"}}, True),
    (MINIMAL, "cluster.slurm", {"partition": 3}, False),
    (MINIMAL, "data.train", ["a_text_document", {"prefix": "b_text_document", "weight": 2.0}], True),
    (MINIMAL, "data.train", [{"weight": 2.0}], False),
    (MINIMAL, "data.train", [3], False),
    (MINIMAL, "train.lr", -1.0, False),
    (MINIMAL, "train.seq_length", _DELETE, False),
    (MINIMAL, "model", _DELETE, False),
    (MINIMAL, "stage", {"kind": "sft", "sft": {"chat_template": "chatml"}}, True),
    (MINIMAL, "stage", {"kind": "dpo"}, False),
    (MINIMAL, "lock", {"content_hash": "x"}, True),
    (EXPLICIT, "model.hidden_size", 128, True),
    (EXPLICIT, "model.hidden_size", _DELETE, False),
    (EXPLICIT, "name", "", False),
]


def _loads(document: dict[str, Any]) -> bool:
    """Whether the loader accepts ``document`` and its catalog ids (``unknown-gpu`` and
    ``stage-kind-known`` are validator rules; the schema has the catalogs as enums)."""
    import tomli_w

    try:
        loaded = load_text(tomli_w.dumps(document))
    except SpecError:
        return False
    return not [i for i in find(("spec",), loaded) if i.rule in ("unknown-gpu", "stage-kind-known")]


@pytest.mark.parametrize(("base", "key", "value", "accepted"), EDITS,
                         ids=[f"{k}={'<deleted>' if v is _DELETE else v!r}" for _, k, v, _ in EDITS])
def test_schema_agrees_with_the_loader(base: dict[str, Any], key: str, value: Any, accepted: bool) -> None:
    document = _edit(base, key, value)
    assert (check(document) == []) is accepted, check(document)
    assert _loads(document) is accepted


@pytest.mark.parametrize(("key", "value"), [("model.num_layers", "4"), ("train.lr", True)])
def test_schema_and_loader_both_refuse_a_quoted_number_or_a_bool_for_a_float(key: str, value: Any) -> None:
    """Neither the loader (strict types: dlmspec.spec.models) nor an editor takes "4" for 4 or true
    for 1.0: in a TOML file they are almost always typos."""
    document = _edit(MINIMAL, key, value)
    assert check(document) != [] and not _loads(document)


def test_extends_relaxes_required_keys() -> None:
    """A child spec names only what it changes: nothing is required next to `extends`, and the
    keys it does write are still checked."""
    assert check({"extends": "base.toml", "train": {"lr": 1e-4}}) == []
    assert check({"extends": "base.toml", "train": {"lr": "fast"}}) != []
    assert check({"train": {"lr": 1e-4}}) != []


def test_every_model_is_a_section() -> None:
    """Guard for test_schema_is_pydantics_with_the_loaders_shorthands: the spec's tables are
    Section subclasses (so the loop above sees them all)."""
    tables = [f.annotation for f in spec_module.Spec.model_fields.values()]
    models = [t for t in tables if isinstance(t, type) and issubclass(t, BaseModel)]
    assert models and all(issubclass(t, spec_module.Section) for t in models)
