"""Fuzzing the CLI: no input makes it print a traceback. Every run exits 0 (a usable spec) or 2
(anything wrong, reported as issues), never 1 with a traceback.

Inputs: valid specs with random values put at real and invented keys (so resolve, the rules and
the planner see odd values), TOML-ish text, random ``--set`` strings, random file names and
paths (NUL bytes, directories, missing files), binary garbage, empty files, and Python specs
that raise, exit or assign odd values. Commands: ``validate``, ``show`` and ``plan``.

Not covered: a Python spec that loops forever or kills the process (a Python spec is code the
user runs), and Ctrl-C (KeyboardInterrupt is left to interrupt).
"""

from __future__ import annotations

import copy
import string
from pathlib import Path
from typing import Any

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.spec.models import Spec
from spec_kit import spec_dict

COMMANDS = (["validate"], ["show"], ["plan"], ["validate", "--json"], ["plan", "--json"], ["check", "--strict"])

#: A valid spec every command accepts (exit 0): the mutations below start from it.
BASE: dict[str, Any] = spec_dict({"name": "fuzz", "cluster.nodes": None})


def _fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """Every dotted key of the spec (tables included) with its annotation."""
    fields = []
    for name, field in model.model_fields.items():
        fields.append((prefix + name, field.annotation))
        for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                fields += _fields(arg, f"{prefix}{name}.")
    return fields


FIELDS = _fields(Spec)
KEYS = [key for key, _ in FIELDS]


scalars = st.one_of(
    st.integers(-3, 70),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 3, 7, 8, 64, 128, 4096, 10**6, 2**31, 2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["mdm", "ar", "full", "selective", "uniform", "block", "block_causal", "causal",
                     "bidirectional", "hybrid", "e4m3", "fp16", "h100", "a100-40gb", "qwen3-1.7b", "hf:/x",
                     "mcore:", "WSD", "GPT2BPETokenizer", "NullTokenizer", "megatron", "a2a", "99,1,0", "", "~/x"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=6)
keys = st.one_of(st.sampled_from(KEYS), st.text(string.ascii_lowercase + "._", min_size=1, max_size=20))


#: Sizes that are legal one by one and odd together (primes, powers of two, huge).
SIZES = st.one_of(st.integers(1, 16), st.sampled_from([24, 32, 48, 64, 96, 127, 128, 1000, 4096, 10**5, 10**9, 2**62]))


def typed(annotation: Any) -> st.SearchStrategy:
    """Values of the annotation's type, mostly inside its range: so the spec loads and the
    resolver, the rules and the planner see the odd combination."""
    args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    origin = getattr(annotation, "__origin__", None)
    if str(origin) == "typing.Literal":
        return st.sampled_from(args)
    if args and origin is not list and origin is not dict:
        return st.one_of(*[typed(a) for a in args])
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.one_of(SIZES, st.integers(-2, 0))
    if annotation is float:
        return st.one_of(st.floats(0, 1, allow_nan=False), st.sampled_from([1e-8, 3e-4, 2.0, 1e6, 1e300]))
    if annotation is str:
        return st.one_of(st.text(max_size=12), st.sampled_from(["h100", "x/y", "hf:.models/x", "mcore:ckpt", "."]))
    if origin is list:
        return st.lists(typed(args[0]) if args else scalars, max_size=6)
    return values


typed_changes = st.sampled_from(FIELDS).flatmap(lambda kv: st.tuples(st.just(kv[0]), typed(kv[1])))


def _put(data: dict[str, Any], key: str, value: Any) -> None:
    parts = [p for p in key.split(".") if p] or ["x"]
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def run(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 2), (result.exit_code, output[-3000:])


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@fuzz(120)
@given(changes=st.lists(st.one_of(typed_changes, typed_changes, typed_changes, st.tuples(keys, values)),
                        min_size=1, max_size=4),
       command=st.sampled_from(COMMANDS))
def test_specs_with_random_values(tmp_path_factory, changes: list[tuple[str, Any]], command: list[str]) -> None:
    data = copy.deepcopy(BASE)
    for key, value in changes:
        _put(data, key, value)
    try:
        text = tomli_w.dumps(data)
    except (TypeError, ValueError):  # not expressible in TOML (e.g. a non-string key): the loader never sees it
        return
    path = tmp_path_factory.mktemp("spec") / "s.toml"
    path.write_text(text, encoding="utf-8")
    run([*command, str(path)])


@fuzz(60)
@given(sets=st.lists(st.one_of(st.text(max_size=30), st.builds(lambda k, v: f"{k}={v}", keys, st.text(max_size=15)),
                               st.builds(lambda k, v: f"{k}={v!r}", st.sampled_from(KEYS), scalars)),
                     min_size=1, max_size=3),
       command=st.sampled_from(COMMANDS))
def test_random_set_overrides(tmp_path_factory, sets: list[str], command: list[str]) -> None:
    path = tmp_path_factory.mktemp("spec") / "s.toml"
    path.write_text(tomli_w.dumps(BASE), encoding="utf-8")
    args = [*command, str(path)]
    for item in sets:
        args += ["--set", item]
    run(args)


TOML_ISH = st.lists(st.one_of(
    st.builds(lambda k: f"[{k}]", keys),
    st.builds(lambda k, v: f"{k} = {v}", keys, st.one_of(st.text(max_size=10), st.integers().map(str),
                                                         st.sampled_from(["inf", "nan", "[1,", "{a=1}", '"x"', "true",
                                                                          "1979-05-27", "0x10", "1e400"]))),
    st.text(max_size=20),
    st.sampled_from(["extends = \"s.toml\"", "extends = 3", "extends = \"../nowhere.toml\"", "[[model]]", "a.b.c = 1"]),
), max_size=12).map("\n".join)


@fuzz(60)
@given(text=TOML_ISH, command=st.sampled_from(COMMANDS))
def test_toml_ish_text(tmp_path_factory, text: str, command: list[str]) -> None:
    path = tmp_path_factory.mktemp("spec") / "s.toml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    run([*command, str(path)])


@fuzz(40)
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".toml", ".py", "", ".json"]),
       command=st.sampled_from(COMMANDS))
def test_binary_and_empty_files(tmp_path_factory, data: bytes, suffix: str, command: list[str]) -> None:
    path = tmp_path_factory.mktemp("spec") / f"s{suffix}"
    path.write_bytes(data)
    run([*command, str(path)])


@fuzz(40)
@given(name=st.text(max_size=40), command=st.sampled_from(COMMANDS), kind=st.sampled_from(["missing", "dir", "file"]))
def test_random_paths(tmp_path_factory, name: str, command: list[str], kind: str) -> None:
    base = tmp_path_factory.mktemp("paths")
    path = str(base / name) if name else name
    if kind != "missing" and name and "\x00" not in name and "/" not in name and name not in (".", ".."):
        try:
            target = base / name
            if kind == "dir":
                target.mkdir()
            else:
                target.write_text(tomli_w.dumps(BASE))
        except (OSError, ValueError):
            pass
    run([*command, "--", path] if path.startswith("-") else [*command, path])


PYTHON = st.sampled_from([
    "raise ValueError('bad')",
    "raise RuntimeError",
    "import sys\nsys.exit(3)",
    "import sys\nsys.exit('text')",
    "raise SystemExit",
    "def f():\n    return f()\nf()",
    "spec = 5",
    "spec = None",
    "spec = {'model': {'preset': 'qwen3-1.7x'}, 'train': {'global_batch_size': 8, 'seq_length': 8}}",
    "spec = {'model': {'preset': 'qwen3-0.6b'}, 'train': {'global_batch_size': 8, 'seq_length': 512}, 1: 2}",
    "spec = {'model': {'preset': 'qwen3-0.6b'}, 'train': {'global_batch_size': 8, 'seq_length': 512}, 'lock': {'a': None}}",
    "spec = {'model': {'preset': 'qwen3-0.6b'}, 'train': {'global_batch_size': 8, 'seq_length': 512}, 'lock': {'a': object()}}",
    "from dlmspec.spec.models import Spec\nspec = Spec(model={'preset': 'nope'}, train={'global_batch_size': 8, 'seq_length': 8})",
    "import dlmspec.spec.models\nspec = dlmspec.spec.models.Spec.model_validate(" + repr(BASE) + ").replace(**{'parallel.tensor_model_parallel_size': 3})",
    "syntax error here (",
    "\x00",
    "raise GeneratorExit",
])


@fuzz(40)
@given(body=PYTHON, command=st.sampled_from(COMMANDS))
def test_python_specs(tmp_path_factory, body: str, command: list[str]) -> None:
    path = tmp_path_factory.mktemp("spec") / "s.py"
    path.write_text(body, encoding="utf-8")
    run([*command, str(path)])


@fuzz(25)
@given(preset=st.one_of(st.sampled_from(["qwen3-0.6b", "megadlms-1.7b", "llada-8b", "mixtral-8x7b"]), st.text(max_size=12)),
       sets=st.lists(st.builds(lambda kv, v: f"{kv[0]}={v!r}" if isinstance(v, str) else f"{kv[0]}={tomli_w.dumps({'v': v})[4:].strip()}",
                               st.sampled_from(FIELDS), scalars), max_size=2),
       extra=st.sampled_from([[], ["--objective", "ar"], ["--nodes", "0"], ["--seq-length", "100000"], ["--gpu", "l40s"],
                              ["--gpus-per-node", "3"]]))
def test_new_with_random_arguments(tmp_path_factory, preset: str, sets: list[str], extra: list[str]) -> None:
    out = tmp_path_factory.mktemp("new") / "n.toml"
    args = ["new", str(out), "--preset", preset, *extra]
    for item in sets:
        args += ["--set", item]
    run(args)
    run(["new", str(out), "--preset", preset, "--json", *extra])  # exists now, or refused again: exit 2 either way
