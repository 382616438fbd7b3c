"""The Python DSL: every schema error at the line that set its key (a multi-line
call, a later .replace, an assignment), rule findings at lines, the user's own traceback, round
trips without "has no effect" warnings under --strict, equal content hashes, docs' example."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlmspec.errors import SpecError
from dlmspec.spec.load import load
from dlmspec.spec.python_load import sweep_targets
from dlmspec.dsl import Spec

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "dlmspec.cli"]


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _issues(path: Path) -> list[tuple[str, int | None]]:
    with pytest.raises(SpecError) as info:
        load(path)
    return sorted((i.key, i.line) for i in info.value.issues)


def test_every_schema_error_at_its_keyword_line_in_a_multi_line_call(tmp_path):
    path = _write(tmp_path, "bad.py", (
        "from dlmspec.dsl import Spec\n"
        "\n"
        "spec = Spec(\n"
        '    model={"preset": "qwen3-0.6b",\n'
        '           "num_layers": -1},\n'
        "    train={\n"
        '        "global_batch_size": 8,\n'
        '        "seq_length": "long",\n'
        '        "lr": -3,\n'
        "    },\n"
        ")\n"))
    assert _issues(path) == [("model.num_layers", 5), ("train.lr", 9), ("train.seq_length", 8)]


def test_errors_of_a_later_replace_at_its_lines(tmp_path):
    path = _write(tmp_path, "rep.py", (
        "from dlmspec.dsl import Spec\n"
        'base = Spec.load("demo-dlm")\n'
        "spec = base.replace(\n"
        '    **{"train.micro_batch_size": 0,\n'
        '       "parallel.tensor_model_parallel_size": "x"},\n'
        ")\n"))
    assert _issues(path) == [("parallel.tensor_model_parallel_size", 5), ("train.micro_batch_size", 4)]


def test_assignment_is_validated_and_rule_findings_carry_lines(tmp_path):
    path = _write(tmp_path, "rule.py", (
        "from dlmspec.dsl import Spec\n"
        'base = Spec.load("demo-dlm")\n'
        "spec = base.replace(\n"
        '    name="tp3",\n'
        '    **{"parallel.tensor_model_parallel_size": 3},\n'
        ")\n"
        "spec.train.lr = 1e18\n"))
    out = subprocess.run([*CLI, "validate", str(path), "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2
    issues = json.loads(out.stdout)["issues"]
    lines = {(i["key"], i["line"]) for i in issues if i["rule"] != "path-not-found"}
    assert ("parallel.tensor_model_parallel_size", 5) in lines
    lr = _write(tmp_path, "lr.py", 'from dlmspec.dsl import Spec\nspec = Spec.load("demo-dlm")\n'
                'spec.train.lr = 1e18\n')
    from dlmspec.check import issues_for
    from dlmspec.resolve import resolve

    loaded = load(lr)
    found = [(i.key, i.line) for i in issues_for("validate", loaded, resolve(loaded.spec)) if i.key == "train.lr"]
    assert found == [("train.lr", 3)]
    with pytest.raises(Exception):
        Spec.load("demo-dlm").train.micro_batch_size = "many"


def test_the_users_own_exception_is_shown_at_their_line(tmp_path):
    path = _write(tmp_path, "own.py", "def helper(x):\n    return 1 / x\nspec = helper(0)\n")
    with pytest.raises(SpecError) as info:
        load(path)
    (issue,) = info.value.issues
    assert issue.line == 2 and "ZeroDivisionError" in issue.message and "own.py:3" in issue.hint


def test_python_spec_hashes_like_toml_and_validates_strict(tmp_path):
    path = _write(tmp_path, "same.py", 'from dlmspec.dsl import Spec\nspec = Spec.load("demo-dlm")\n')
    from dlmspec.render.compile import content_hash
    from dlmspec.resolve import resolve

    python, toml = load(path), load(ROOT / "specs" / "demo-dlm.toml")
    assert content_hash(resolve(python.spec)) == content_hash(resolve(toml.spec))
    assert python.spec == toml.spec
    from dlmspec.check import issues_for

    found = [i.rule for i in issues_for("validate", python, resolve(python.spec)) if i.rule != "path-not-found"]
    assert found == []


@pytest.mark.parametrize("kind", ["lock", "show", "minimal"])
def test_round_trips_without_warnings_under_strict(tmp_path, kind):
    from dlmspec.check import issues_for
    from dlmspec.cli.commands.common import spec_data
    from dlmspec.cli.commands.show import derived_comment, minimal_data
    from dlmspec.render.compile import content_hash, render_lock
    from dlmspec.escape import toml_document
    from dlmspec.resolve import resolve
    from dlmspec.spec.show import SHOW_HEADER

    for name in ("demo-dlm", "llada-8b-pretrain", "mixtral-8x7b-mdm"):
        loaded = load(ROOT / "specs" / f"{name}.toml")
        resolved = resolve(loaded.spec)
        text = {"lock": lambda: render_lock(resolved),
                "show": lambda: f"{SHOW_HEADER}: x\n" + toml_document(spec_data(loaded.spec)) + derived_comment(resolved),
                "minimal": lambda: toml_document(minimal_data(loaded.spec))}[kind]()
        again = load(_write(tmp_path, f"{name}.toml", text))
        assert content_hash(resolve(again.spec)) == content_hash(resolved)
        rules = [i.rule for i in issues_for("validate", again, resolve(again.spec)) if i.rule != "path-not-found"]
        assert rules == [], (name, rules)
        if kind != "lock":
            assert again.spec == loaded.spec


def test_from_preset_is_what_new_writes():
    spec = Spec.from_preset("qwen3-0.6b", gpus=8)
    assert spec.model.preset == "qwen3-0.6b" and spec.cluster.gpus_per_node == 8 and spec.name == "qwen3-0.6b"
    with pytest.raises(SpecError):
        Spec.from_preset("qwen3-0.6b", gpus=12)


def test_spec_docs_python_example_runs_as_written(tmp_path):
    """docs/spec.md's Python block, written to a file as a user would save it, is the docs example
    and validates as a sweep of two members."""
    page = (ROOT / "docs" / "spec.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == (ROOT / "docs" / "python-example.py").read_text()
    example = tmp_path / "sweep.py"
    example.write_text(block)
    members = sweep_targets(example)
    assert [m.rpartition("::")[2] for m in members] == ["demo-mb16", "demo-mb32"]
    for target in members:
        spec = load(target).spec
        assert spec.train.lr == 4e-4
        assert spec.checkpoint.save == f"runs/{spec.name}/checkpoints"


def _at(data, key):
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def test_lock_filled_keys_are_defined_once():
    """spec.lock.toml's filled-in keys live in dlmspec.resolve (used by the compiler's
    locked_spec and the loader's round trip), not in two lists."""
    from dlmspec import resolve as resolving
    from dlmspec.render import compile as compiler
    from dlmspec.spec import load as loader
    from dlmspec.spec.dotted import flatten_keys

    assert compiler.locked_spec is resolving.locked_spec
    assert not hasattr(loader, "_LOCK_FILLED")
    for name in ("demo-dlm", "demo-ar", "llada-8b-pretrain", "mixtral-8x7b-mdm"):
        spec = load(ROOT / "specs" / f"{name}.toml").spec
        resolved = resolving.resolve(spec)
        filled = resolving.lock_filled(resolved)
        assert set(filled) <= set(resolving.LOCK_FILLED_KEYS), name
        before = spec.model_dump(mode="json", exclude_none=True, exclude={"lock"})
        after = compiler.canonical_data(compiler.locked_spec(resolved))
        changed = {k for k in flatten_keys(after)
                   if not isinstance(_at(after, k), dict) and _at(before, k) != _at(after, k)}
        assert changed <= set(resolving.LOCK_FILLED_KEYS), (name, changed)


def test_python_spec_paths_follow_a_later_set_name(tmp_path):
    path = _write(tmp_path, "named.py", 'from dlmspec.dsl import Spec\nspec = Spec.load("demo-dlm")\n')
    spec = load(path, ["name=other"]).spec
    assert spec.name == "other" and spec.checkpoint.save == "runs/other/checkpoints"


def test_layouts_is_a_sweep_of_plan_search_results_named_after_their_layout(tmp_path):
    from dlmspec.plan import make_plan
    from dlmspec.plan.search import search
    from dlmspec.resolve import resolve

    path = _write(tmp_path, "lay.py", 'from dlmspec.dsl import Spec\n'
                  'spec = Spec.layouts(Spec.load("demo-dlm"), top=3)  # the 3 fastest that fit\n')
    members = sweep_targets(path)
    best = search(resolve(load(ROOT / "specs" / "demo-dlm.toml").spec), top=3).top
    assert len(members) == len(best) == 3
    for target, cand in zip(members, best):
        spec = load(target).spec
        assert spec.name == target.rpartition("::")[2] == f"demo-dlm-{cand.label}"
        for key, value in cand.spec_changes().items():
            assert _at(spec.model_dump(), key) == value, key
        assert spec.checkpoint.save == f"runs/{spec.name}/checkpoints"
        plan = make_plan(resolve(spec))
        assert plan.to_dict()["throughput"]["tokens_per_second"] == pytest.approx(cand.tokens_per_second, rel=1e-9)
    assert load(members[0]).spec.name == "demo-dlm-tp1-pp1-mb32-distopt"


def test_layouts_that_find_nothing_raise_at_the_users_line(tmp_path):
    path = _write(tmp_path, "none.py", 'from dlmspec.dsl import Spec\n'
                  'base = Spec.load("demo-dlm").replace(model={"num_layers": 4096})\n'
                  '\n'
                  'spec = Spec.layouts(base, top=2)\n')
    with pytest.raises(SpecError) as info:
        sweep_targets(path)
    (issue,) = info.value.issues
    assert issue.rule == "plan-search" and "no layout fits" in issue.message
    assert (issue.file, issue.line) == (str(path), 4) and "Spec.layouts" in issue.hint
    with pytest.raises(SpecError):
        Spec.layouts(Spec.load("demo-dlm"), top=0)


def test_an_assignment_into_a_table_the_base_file_never_wrote_is_kept(tmp_path):
    """`Spec.load("demo-dlm")` has no [parallel] or [recompute]: assigning their keys must reach
    the loaded spec (they were dropped, silently: the README trial's TP 5 validated as TP 1)."""
    path = _write(tmp_path, "assign.py", (
        "from dlmspec.dsl import Spec\n"
        "b = Spec.load('demo-dlm')\n"
        "b.recompute.granularity = 'full'\n"
        "b.parallel.sequence_parallel = False\n"
        "b.cluster.gpus_per_node = 2\n"
        "b.parallel.tensor_model_parallel_size = 2\n"
        "spec = b\n"))
    spec = load(path).spec
    assert spec.recompute.granularity == "full"
    assert spec.parallel.tensor_model_parallel_size == 2 and spec.cluster.gpus_per_node == 2
    bad = _write(tmp_path, "bad.py", "from dlmspec.dsl import Spec\nb = Spec.load('demo-dlm')\n"
                 "b.parallel.tensor_model_parallel_size = 5\nspec = b\n")
    from dlmspec.check import issues_for, load_for
    loaded, resolved, issues = load_for("validate", bad, [], fast=False)
    assert any(i.key == "parallel.tensor_model_parallel_size" and i.line == 3 and i.severity == "error"
               for i in issues)
