"""Fuzzing the bundled and starter specs: mutated copies never crash, hang or blow up, and
``validate`` and ``compile`` agree on each.

Each case is one of the bundled specs (``specs/*.toml``) or a starter spec (``dlmspec new
--preset NAME``, every preset, both objectives) with one to three mutations: any key of the
schema set to a value of its type that is odd in context (sizes from 1 to 10**30, extreme rates,
every choice of a literal), or a value of the spec replaced by an odd one (huge, negative or zero
ints, floats where ints go, non-finite floats, strings, empty and blank strings, booleans, lists,
nested tables), a key deleted, a table replaced by a value, a key added. Every
case runs in its own process (``tests/kits/fuzz_driver.py`` forks one per case from a process that
imported dlmspec once) under a 2 GiB address-space limit, through ``dlmspec validate``,
``dlmspec plan`` and ``dlmspec compile``, and must:

* print no traceback and exit 0 or 2 (never 1), within 20 s, with no process over 2 GiB;
* have ``validate`` and ``compile`` exit alike and report the same issues (rule, key, severity).

The cases are drawn from a fixed seed, so CI runs the same ones; ``DLMSPEC_FUZZ_SEED`` draws
others, ``DLMSPEC_FUZZ_CASES`` changes how many (default 500: about 30 s on two cores) and
``DLMSPEC_FUZZ_TYPED`` the share of typed mutations (default 0.6). A failure prints the case's
seed, id and mutations, and keeps its spec file under the pytest temporary directory.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.spec.presets import PRESETS
from dlmspec.spec.models import Spec
from spec_kit import write_toml

ROOT = Path(__file__).resolve().parents[3]
DRIVER = ROOT / "tests" / "kits" / "fuzz_driver.py"
SEED = int(os.environ.get("DLMSPEC_FUZZ_SEED", "15"))
CASES = int(os.environ.get("DLMSPEC_FUZZ_CASES", "500"))
#: Per case (three commands): the issue's limits.
TIMEOUT_S = 20.0
MEMORY_BYTES = 2 << 30

#: Share of mutations that set a schema key to a value of its type (the spec then mostly loads,
#: so the rules, the planner and the compiler see it); the others are odd values, type swaps,
#: deletions and added keys (mostly schema errors).
TYPED_SHARE = float(os.environ.get("DLMSPEC_FUZZ_TYPED", "0.6"))

#: Nodes a starter spec of these presets needs to fit H100s (what `dlmspec new` suggests).
STARTER_NODES = {"llama-3-70b": 4, "mixtral-8x7b": 2, "qwen3-30b-a3b": 2}

#: Odd values a mutation puts in place of a value.
ODD_VALUES: tuple[Any, ...] = (
    0, -1, 1, 2, 3, 7, -(2**31), 2**31, 2**53 + 1, 2**62, 2**63 - 1, -(2**63), 10**6, 10**9, 10**12,
    0.0, -0.0, 0.5, 1.5, -2.5, 1e-300, 1e18, 1e300, math.inf, -math.inf, math.nan,
    True, False, "", " ", "x", "0", "1e3", "none", "auto", "local", "h100", "mdm", "a/b", "../x", "hf:", "mcore:",
    "\t", "é" * 3, "x" * 300,
    [], [0], [1, 2], ["a", ""], [[1]], {}, {"a": 1}, {"prefix": "x", "weight": 0}, {"a": {"b": {"c": [1, {}]}}},
)


def _fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    """Every dotted key of the spec schema with its annotation (tables included)."""
    fields = []
    for name, field in model.model_fields.items():
        fields.append((prefix + name, field.annotation))
        for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                fields += _fields(arg, f"{prefix}{name}.")
    return fields


#: (dotted key, annotation) of every spec key: a mutation may set any of them.
FIELDS = _fields(Spec)

#: Values of the right type that are legal one by one and odd together.
SIZES = (1, 2, 3, 4, 5, 8, 12, 16, 24, 64, 127, 128, 1000, 4096, 10**5, 2**31, 10**12, 2**62, 2**63 - 1, 2**64, 10**30)


def typed_value(annotation: Any, rng: random.Random) -> Any:
    """A value of ``annotation``'s type, mostly inside its range, so the spec still loads and
    the resolver, the rules and the planner see the odd combination."""
    args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    origin = getattr(annotation, "__origin__", None)
    if str(origin) == "typing.Literal":
        return rng.choice(args)
    if args and origin not in (list, dict):
        return typed_value(rng.choice(args), rng)
    if annotation is bool:
        return rng.choice([True, False])
    if annotation is int:
        return rng.choice(SIZES + (0, -1))
    if annotation is float:
        return rng.choice([0.0, 0.01, 0.5, 0.999, 1.0, 2.0, 1e-8, 3e-4, 1e6, 1e300])
    if annotation is str:
        return rng.choice(["", "x", "a/b", "hf:x", "mcore:ckpt", ".", "h100", "runs/x/tensorboard"])
    if origin is list:
        return [typed_value(args[0], rng) for _ in range(rng.choice([0, 1, 2, 5]))] if args else []
    return rng.choice(ODD_VALUES)


def _put(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    *parents, last = key.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def starter_specs(folder: Path) -> list[Path]:
    """``dlmspec new`` for every preset and objective, written into ``folder``."""
    paths = []
    for preset in sorted(PRESETS):
        for objective in ("mdm", "ar"):
            path = folder / f"new-{preset}-{objective}.toml"
            args = ["new", str(path), "--preset", preset, "--objective", objective]
            if preset in STARTER_NODES:
                args += ["--nodes", str(STARTER_NODES[preset])]
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 0, (args, result.output)
            paths.append(path)
    return paths


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a TOML document (tables, values, list items)."""
    found = []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        path = (*prefix, key)
        found.append(path)
        found += _paths(value, path)
    return found


def _parent(data: Any, path: tuple) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data


def _swap_type(value: Any, rng: random.Random) -> Any:
    """The value in another type, or scaled to an odd size."""
    if isinstance(value, bool):
        return rng.choice([int(value), str(value).lower(), [value], not value])
    if isinstance(value, int):
        return rng.choice([float(value), value + 0.5, str(value), -value, value * 2**40, value - 1, value + 1,
                           0, [value], {"v": value}])
    if isinstance(value, float):
        return rng.choice([int(value) if math.isfinite(value) else 0, str(value), -value, value * 1e30, value / 1e30,
                           [value]])
    if isinstance(value, str):
        return rng.choice(["", " ", value + " ", value.upper(), value * 50, 0, [value], {"x": value}, value + "\n"])
    if isinstance(value, list):
        return rng.choice([[], value * 3, value[:1], {"0": value}, "x", 0] + ([value[0]] if value else []))
    if isinstance(value, dict):
        return rng.choice([[], "x", 0, True, {**value, "unknown_key": 1}, {}])
    return rng.choice(ODD_VALUES)


def mutate(data: dict[str, Any], rng: random.Random) -> list[str]:
    """Apply one to three mutations to ``data`` in place; returns a description of each."""
    done = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        if rng.random() < TYPED_SHARE:  # any key of the schema, with a value of its type
            key, annotation = rng.choice(FIELDS)
            value = typed_value(annotation, rng)
            _put(data, key, copy.deepcopy(value))
            done.append(f"set {key} = {value!r:.60}")
            continue
        paths = _paths(data)
        path = rng.choice(paths)
        parent, key = _parent(data, path), path[-1]
        op = rng.choice(["odd", "odd", "odd", "swap", "swap", "delete", "add"])
        if op == "delete":
            del parent[key]
        elif op == "add":
            if isinstance(parent[key], dict):
                parent[key][rng.choice(["unknown", "num_layers", "seq_length", "gpu", "kind", ""])] = rng.choice(ODD_VALUES)
            else:
                op = "odd"
        if op == "odd":
            parent[key] = copy.deepcopy(rng.choice(ODD_VALUES))
        elif op == "swap":
            parent[key] = _swap_type(parent[key], rng)
        shown = parent[key] if op != "delete" else None
        done.append(f"{op} {'.'.join(map(str, path))}" + ("" if op == "delete" else f" = {shown!r:.60}"))
    return done


def make_cases(work: Path, count: int, seed: int) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """``count`` mutated specs under ``work`` (bundled specs beside a copy of specs/, so their
    ``extends`` resolve), as the driver's case list, and each case's mutations."""
    specs = work / "specs"
    shutil.copytree(ROOT / "specs", specs)
    bases = [(p, tomllib.loads(p.read_text(encoding="utf-8"))) for p in sorted(specs.glob("*.toml"))]
    starters = work / "starters"
    starters.mkdir()
    bases += [(p, tomllib.loads(p.read_text(encoding="utf-8"))) for p in starter_specs(starters)]
    rng = random.Random(seed)
    cases, mutations = [], {}
    while len(cases) < count:
        base, data = rng.choice(bases)
        data = copy.deepcopy(data)
        done = mutate(data, rng)
        case_id = f"{len(cases):04d}-{base.stem}"
        path = base.parent / f"case-{case_id}.toml"
        try:
            write_toml(path, data)  # tomli_w refuses before the file is made
        except (TypeError, ValueError):  # not expressible in TOML (e.g. an array of tables and values)
            continue
        cases.append({"id": case_id, "spec": str(path), "out": str(work / "out" / case_id)})
        mutations[case_id] = done
    (work / "out").mkdir()
    return cases, mutations


def _issues(command: dict[str, Any]) -> list[tuple[str, str, str]]:
    return sorted({(i["rule"], i["key"], i["severity"]) for i in command["issues"]})


def problems(record: dict[str, Any]) -> list[str]:
    """What is wrong with one case's result (empty: nothing)."""
    if record["status"] != "done":
        return [f"{record['status']} after {record['wall_s']:.1f} s" + (f"\n{record.get('crash')}" if record.get("crash") else "")]
    found = []
    if record["max_rss_bytes"] > MEMORY_BYTES:
        found.append(f"peak resident memory {record['max_rss_bytes'] / 2**30:.2f} GiB")
    commands = record["commands"]
    for name, result in commands.items():
        if result["raised"]:
            found.append(f"{name} raised:\n{result['raised'][-1500:]}")
        elif result["traceback_in_output"]:
            found.append(f"{name} printed a traceback:\n{result['output_tail']}")
        elif result["rc"] not in (0, 2):
            found.append(f"{name} exited {result['rc']}:\n{result['output_tail'][-800:]}")
    validate, compile_ = commands["validate"], commands["compile"]
    if not found and validate["rc"] != compile_["rc"]:
        found.append(f"validate exited {validate['rc']}, compile {compile_['rc']}:\n"
                     f"validate: {_issues(validate)}\ncompile: {_issues(compile_)}")
    elif not found and _issues(validate) != _issues(compile_):
        found.append(f"validate and compile report different issues:\nvalidate: {_issues(validate)}\n"
                     f"compile: {_issues(compile_)}")
    return found


def run_driver(work: Path, cases: list[dict[str, Any]], timeout: float = TIMEOUT_S) -> list[dict[str, Any]]:
    (work / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    jobs = str(max(1, min(2, os.cpu_count() or 1)))
    subprocess.run([sys.executable, str(DRIVER), str(work / "cases.json"), str(work / "results.json"), "--jobs", jobs,
                    "--timeout", str(timeout), "--memory", str(MEMORY_BYTES)],
                   cwd=work, env=env, check=True, timeout=60 + 2 * timeout * len(cases))
    return json.loads((work / "results.json").read_text(encoding="utf-8"))


def test_the_driver_catches_hangs_memory_and_tracebacks(tmp_path: Path) -> None:
    """The harness itself: a spec that never returns is killed at the timeout, one that asks for
    more than 2 GiB is refused the memory (the process stays under the limit), and an exception
    that escapes a command is reported; a plain spec passes."""
    bodies = {
        "hang": "while True:\n    pass\n",
        "hog": "block = bytearray(3 << 30)\n",
        "ok": (ROOT / "specs" / "demo-ar.toml").read_text(encoding="utf-8"),
    }
    cases = []
    for name, body in bodies.items():
        path = tmp_path / (f"{name}.toml" if name == "ok" else f"{name}.py")
        path.write_text(body.replace('extends = "demo-dlm.toml"', f'extends = {str(ROOT / "specs" / "demo-dlm.toml")!r}'),
                        encoding="utf-8")
        cases.append({"id": name, "spec": str(path), "out": str(tmp_path / f"out-{name}")})
    results = {r["id"]: r for r in run_driver(tmp_path, cases, timeout=3.0)}
    assert results["hang"]["status"] == "timeout" and problems(results["hang"])
    assert results["hog"]["status"] == "done" and results["hog"]["max_rss_bytes"] < MEMORY_BYTES
    assert results["hog"]["commands"]["validate"]["rc"] == 2  # the loader reports the MemoryError
    assert problems(results["ok"]) == [], problems(results["ok"])
    crashed = json.loads(json.dumps(results["ok"]))
    crashed["commands"]["plan"].update(rc=None, raised="Traceback (most recent call last):\n  ...\nZeroDivisionError")
    assert any("plan raised" in p for p in problems(crashed))


def test_mutated_specs_never_crash_and_validate_agrees_with_compile(tmp_path: Path) -> None:
    cases, mutations = make_cases(tmp_path, CASES, SEED)
    results = run_driver(tmp_path, cases)
    assert sorted(r["id"] for r in results) == sorted(c["id"] for c in cases)
    failures = []
    for record in sorted(results, key=lambda r: r["id"]):
        found = problems(record)
        if found:
            failures.append(f"case {record['id']} (seed {SEED}): {'; '.join(mutations[record['id']])}\n  " +
                            "\n  ".join(found))
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n\n" + "\n\n".join(failures[:40])
