"""The published values of the bundled recipes (specs/published/*.toml).

Each data file lists the settings a publication fixes (layout: the header comment of any of the
files). This test checks the layout of every entry and holds each bundled spec to what its file
says: a "matches" entry's published value is the spec's resolved value, and the spec values
recorded for "differs", "placeholder", "silent" (and "missing-option" where given) are the spec's
values today, so a drift in either direction fails here. Loading and resolving a spec is pure
Python (no torch): the whole file runs in well under a second per spec. (The compiled train.py
against the same files: tests/unit/specs/test_recipes_drift.py.) At the end: the MegaDLMs spec on both layer
paths, and the one combination validate refuses on Transformer Engine.
"""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from dlmspec.check import RULES, issues_for
from dlmspec.cli.commands.common import spec_data
from dlmspec.cli.commands.schema import spec_json_schema
from dlmspec.errors import SpecError
from dlmspec.render.compile import check_spec, render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
PUBLISHED = ROOT / "specs" / "published"
FILES = sorted(PUBLISHED.glob("*.toml"))

STATUSES = ("matches", "differs", "missing-option", "placeholder", "silent", "unverified")
#: Fields every [[setting]] has, and those a status also needs.
REQUIRED = ("name", "key", "value", "source", "status")
NEEDS = {"differs": ("spec_value",), "missing-option": ("option",), "placeholder": ("spec_value",),
         "silent": ("spec_value", "note"), "unverified": ("note",)}
ALLOWED = set(REQUIRED) | {"spec_value", "option", "rel_tol", "note"}
#: What a key that the resolved spec does not set (``None``, left out of ``show``) reads as.
UNSET = "unset"
#: "owner/name@short-sha:path..." or a paper reference.
_REPO_SOURCE = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+)@(?P<sha>[0-9a-f]{7,40}):\S")
_PAPER_SOURCE = re.compile(r"^(arXiv:\d{4}\.\d{4,5}|https://)")


def _read(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


_RESOLVED: dict[str, dict[str, Any]] = {}


def _resolved(spec_name: str) -> dict[str, Any]:
    """Every resolved value of specs/<spec_name>.toml by dotted key: the spec's keys as
    ``dlmspec show --json`` prints them, and the derived values under ``derived.``."""
    if spec_name not in _RESOLVED:
        loaded = load(ROOT / "specs" / f"{spec_name}.toml")
        values = _flat(spec_data(loaded.spec))
        values.update(_flat(resolve(loaded.spec).derived(), "derived."))
        _RESOLVED[spec_name] = values
    return _RESOLVED[spec_name]


def _known_keys(spec_name: str) -> set[str]:
    """Keys an entry may name: the resolved ones and every field of the spec schema (unset
    optional keys such as train.lr_wsd_decay_iters are left out of the resolved dump)."""
    keys = set(_resolved(spec_name))

    def walk(schema: dict[str, Any], defs: dict[str, Any], prefix: str) -> None:
        for name, prop in schema.get("properties", {}).items():
            keys.add(prefix + name)
            for ref in _refs(prop):
                walk(defs[ref], defs, f"{prefix}{name}.")

    root = spec_json_schema()
    walk(root, root.get("$defs", {}), "")
    return keys


def _refs(prop: dict[str, Any]) -> list[str]:
    found = []
    for part in [prop, *prop.get("anyOf", []), *prop.get("allOf", [])]:
        ref = part.get("$ref")
        if ref:
            found.append(ref.rsplit("/", 1)[-1])
    return found


def _same(published: Any, actual: Any, rel_tol: float = 0.0) -> bool:
    if isinstance(published, bool) or isinstance(actual, bool):
        return published is actual
    if isinstance(published, (int, float)) and isinstance(actual, (int, float)):
        return math.isclose(published, actual, rel_tol=max(rel_tol, 1e-12), abs_tol=0.0) or published == actual
    return published == actual


def _value_of(spec_name: str, key: str) -> Any:
    return _resolved(spec_name).get(key, UNSET)


def _entries(path: Path) -> list[tuple[int, dict[str, Any]]]:
    return list(enumerate(_read(path).get("setting", []), start=1))


def test_there_is_a_data_file_for_every_published_recipe() -> None:
    names = {path.stem for path in FILES}
    assert {"megadlms-1.7b-mdm", "megadlms-1.7b-ar", "megadlms-1.7b-sft", "llada-8b-pretrain", "dream-7b-adapt",
            "mixtral-8x7b-mdm"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_layout(path: Path) -> None:
    data = _read(path)
    publication = data.get("publication")
    assert isinstance(publication, dict), f"{path.name}: no [publication] table"
    assert publication.get("spec") == path.stem, f"{path.name}: [publication] spec must be {path.stem!r}"
    assert (ROOT / "specs" / f"{path.stem}.toml").is_file(), f"{path.name}: no bundled spec {path.stem}.toml"
    assert set(data) == {"publication", "setting"}, f"{path.name}: unknown tables {sorted(set(data) - {'publication', 'setting'})}"
    commits = {c.split("@")[0]: c.split("@")[1] for c in publication.get("commits", [])}
    for repo, sha in commits.items():
        assert re.fullmatch(r"[0-9a-f]{40}", sha), f"{path.name}: commit of {repo} is not a full sha: {sha}"
    known = _known_keys(path.stem)
    entries = _entries(path)
    assert entries, f"{path.name}: no [[setting]]"
    for i, entry in entries:
        where = f"{path.name} setting {i} ({entry.get('name')!r})"
        missing = [f for f in REQUIRED if f not in entry]
        assert not missing, f"{where}: missing {missing}"
        assert set(entry) <= ALLOWED, f"{where}: unknown fields {sorted(set(entry) - ALLOWED)}"
        status = entry["status"]
        assert status in STATUSES, f"{where}: status {status!r} is not one of {STATUSES}"
        need = [f for f in NEEDS.get(status, ()) if f not in entry]
        assert not need, f"{where}: status {status!r} needs {need}"
        key = entry["key"]
        if key == "-":
            assert status not in ("matches", "differs"), f"{where}: {status!r} needs a dlmspec key, not '-'"
            assert "option" in entry or "note" in entry, f"{where}: key '-' needs an option or a note"
        else:
            assert key in known, f"{where}: {key!r} is not a dlmspec key (spec key or derived.NAME)"
        repo_sources = list(_REPO_SOURCE.finditer(entry["source"]))
        assert repo_sources or _PAPER_SOURCE.match(entry["source"]), \
            f"{where}: source {entry['source']!r} names neither owner/name@sha:path nor a paper"
        for m in repo_sources:
            assert m["repo"] in commits and commits[m["repo"]].startswith(m["sha"]), \
                f"{where}: {m['repo']}@{m['sha']} is not one of [publication] commits"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_bundled_spec_holds_the_recorded_values(path: Path) -> None:
    spec = path.stem
    wrong = []
    for i, entry in _entries(path):
        key, status = entry["key"], entry["status"]
        if key == "-":
            continue
        actual = _value_of(spec, key)
        if status == "matches" and not _same(entry["value"], actual, entry.get("rel_tol", 0.0)):
            wrong.append(f"setting {i} {key}: published {entry['value']!r}, specs/{spec}.toml has {actual!r} "
                         f"(status 'matches')")
        if status == "differs" and _same(entry["value"], actual, entry.get("rel_tol", 0.0)):
            wrong.append(f"setting {i} {key}: now equals the published {entry['value']!r}: set status 'matches'")
        if "spec_value" in entry and not _same(entry["spec_value"], actual):
            wrong.append(f"setting {i} {key}: spec_value {entry['spec_value']!r}, specs/{spec}.toml has {actual!r}")
    assert not wrong, f"{path.name}:\n  " + "\n  ".join(wrong)


def test_a_drift_fails() -> None:
    """The comparison fails on a changed value (the test above is not vacuous)."""
    assert _same(2e-4, 2e-4) and not _same(2e-4, 3e-4)
    assert _same(8.02e9, 8_015_581_184, rel_tol=7e-4) and not _same(8.02e9, 8.1e9, rel_tol=7e-4)
    assert not _same(True, 1) and not _same(0, False) and _same("WSD", "WSD")
    assert _value_of("megadlms-1.7b-mdm", "train.lr_decay_iters") == UNSET


# ---------------------------------------------------------------- the MegaDLMs spec on both layer paths
#: The rule that refuses variable-length sequences cut one by one (a key-padding mask) on the
#: Transformer Engine layers (dlmspec/check/runtime.py). Branch i21-te removes it where TE's
#: padding mask runs them; the refusal test below then skips.
VARIABLE_LENGTH_TE = "runtime-variable-length-te"
MEGADLMS = ROOT / "specs" / "megadlms-1.7b-mdm.toml"


def _validate(*overrides: str):
    loaded = load(MEGADLMS, list(overrides))
    resolved = resolve(loaded.spec)
    return loaded, resolved, issues_for("validate", loaded, resolved)


@pytest.mark.parametrize("impl, use_te", [("local", "False"), ("transformer_engine", "True"), ("auto", "None")])
def test_megadlms_runs_on_both_layer_paths(impl: str, use_te: str) -> None:
    """The bundled spec validates and compiles on the local and the Transformer
    Engine layers alike (and "auto" leaves the choice to the GPU machine): its variable-length cut
    is per micro-batch, a dense shorter batch that needs no key-padding mask."""
    loaded, resolved, issues = _validate(f"model.transformer_impl={impl}")
    assert [i for i in issues if i.severity == "error"] == []
    check_spec(loaded, resolved)  # what `dlmspec compile` refuses
    assert resolved.transformer_impl == impl
    train_py = render(resolved, "megadlms-1.7b-mdm.toml")["train.py"]
    assert f"        use_transformer_engine={use_te}," in train_py
    assert "variable_length='micro_batch'," in train_py and "variable_length_prob=0.01," in train_py


def test_megadlms_with_a_per_sequence_cut_is_refused_on_transformer_engine() -> None:
    """A cut of each sequence alone needs a key-padding mask, which the Transformer Engine layer
    spec of this runtime ignores: validate refuses it (rule runtime-variable-length-te), compile
    too, with the fix "auto" (the local layers) that validates; "auto" itself takes the local path."""
    if VARIABLE_LENGTH_TE not in RULES:
        pytest.skip(f"rule {VARIABLE_LENGTH_TE} is absent: Transformer Engine runs the key-padding mask")
    te = ("model.transformer_impl=transformer_engine", "objective.variable_length=sequence")
    loaded, resolved, issues = _validate(*te)
    (refusal,) = [i for i in issues if i.severity == "error"]
    assert (refusal.rule, refusal.key) == (VARIABLE_LENGTH_TE, "objective.variable_length_prob")
    assert refusal.fix is not None and refusal.fix.set == {"model.transformer_impl": "auto"}
    with pytest.raises(SpecError) as info:
        check_spec(loaded, resolved)
    assert [i.rule for i in info.value.errors] == [VARIABLE_LENGTH_TE]
    _, auto, issues = _validate("model.transformer_impl=auto", "objective.variable_length=sequence")
    assert [i for i in issues if i.severity == "error"] == [] and auto.transformer_impl == "local"


def test_the_counts_in_docs_recipes_are_the_data_files() -> None:
    """docs/recipes.md's table: settings and entries per status of each data file."""
    rows = {}
    for line in (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| `[^`]+`[^|]*\| `specs/published/([\w.-]+)\.toml` \|((?: \d+ \|){7})$", line)
        if m:
            rows[m[1]] = [int(x) for x in m[2].replace("|", " ").split()]
    assert set(rows) == {path.stem for path in FILES}
    for path in FILES:
        statuses = [entry["status"] for _, entry in _entries(path)]
        assert rows[path.stem] == [len(statuses), *(statuses.count(s) for s in STATUSES)], path.stem
