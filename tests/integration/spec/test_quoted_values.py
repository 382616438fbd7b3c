"""A quoted number or boolean (``lr = "3e-4"``, ``global_batch_size = "256"``, ``mock = "yes"``) is an
error naming the key with the value unquoted as the fix, in TOML (fast path and pydantic, with and
without ``--strict``) and in a Python spec's assignment; an int where a float belongs stays valid."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlmspec.errors import SpecError
from dlmspec.spec import fast
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "dlmspec.cli"]
DEMO = (ROOT / "specs" / "demo-dlm.toml").read_text(encoding="utf-8")


def _demo_with(tmp_path: Path, mock: str | None = None, **lines: str) -> Path:
    """specs/demo-dlm.toml with the ``key = ...`` lines named replaced (each key appears once), and
    ``[data] mock = <mock>`` added when given."""
    out = []
    for line in DEMO.splitlines():
        key = line.split("=", 1)[0].strip()
        out.append(f"{key} = {lines.pop(key)}" if key in lines and "=" in line else line)
        if line.strip() == "[data]" and mock is not None:
            out.append(f"mock = {mock}")
    assert not lines, f"keys not in the demo spec: {lines}"
    path = tmp_path / "spec.toml"
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


QUOTED = [
    ("lr", '"3e-4"', "train.lr", "train.lr = 3e-4", 3e-4),
    ("global_batch_size", '"256"', "train.global_batch_size", "train.global_batch_size = 256", 256),
    ("num_layers", '"12"', "model.num_layers", "model.num_layers = 12", 12),
    ("qk_layernorm", '"yes"', "model.qk_layernorm", "model.qk_layernorm = true", True),
]


@pytest.mark.parametrize("key,written,dotted,fix_text,fixed", QUOTED)
def test_quoted_number_or_boolean_is_an_error_with_the_unquoted_remedy(tmp_path, key, written, dotted, fix_text, fixed):
    path = _demo_with(tmp_path, **{key: written})
    for fast_path in (False, True):
        with pytest.raises(SpecError) as info:
            load(path, fast=fast_path)
        (issue,) = [i for i in info.value.issues if i.key == dotted]
        assert issue.value == json.loads(written)
        assert fix_text in issue.hint
        assert issue.fix is not None and issue.fix.set == {dotted: fixed}
        assert issue.line is not None


@pytest.mark.parametrize("strict", [[], ["--strict"]])
def test_validate_exits_2_naming_every_quoted_key(tmp_path, strict):
    path = _demo_with(tmp_path, lr='"3e-4"', global_batch_size='"256"', mock='"yes"')
    out = subprocess.run([*CLI, "validate", str(path), "--json", *strict], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    issues = {i["key"]: i for i in json.loads(out.stdout)["issues"]}
    assert "write it without quotes: train.lr = 3e-4" in issues["train.lr"]["hint"]
    assert "train.global_batch_size = 256" in issues["train.global_batch_size"]["hint"]
    assert "data.mock = true" in issues["data.mock"]["hint"]
    assert "Traceback" not in out.stderr


def test_quoted_word_that_is_no_number_keeps_the_type_hint(tmp_path):
    path = _demo_with(tmp_path, lr='"fast"')
    with pytest.raises(SpecError) as info:
        load(path)
    (issue,) = [i for i in info.value.issues if i.key == "train.lr"]
    assert "without quotes" not in (issue.hint or "")
    assert "valid number" in issue.hint


def test_int_where_a_float_belongs_stays_valid(tmp_path):
    path = _demo_with(tmp_path, lr="1", rotary_base="10000")
    for fast_path in (False, True):
        spec = load(path, fast=fast_path).spec
        assert spec.train.lr == 1.0 and type(spec.train.lr) is float
        assert spec.model.rotary_base == 10000.0


def test_fast_path_still_takes_every_bundled_toml_spec():
    import tomllib

    for path in sorted((ROOT / "specs").glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        if "extends" in data:
            continue
        assert fast.check(data) is not None, path.name


def test_python_spec_assignment_of_a_quoted_number_is_refused_at_its_line(tmp_path):
    path = tmp_path / "quoted.py"
    path.write_text(
        "from dlmspec.dsl import Spec\n"
        'spec = Spec.load("demo-dlm")\n'
        'spec.train.lr = "3e-4"\n', encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load(path)
    (issue,) = info.value.issues
    assert (issue.key, issue.line) == ("train.lr", 3)
    assert "train.lr = 3e-4" in issue.hint


def test_python_spec_assignment_of_a_quoted_boolean_is_refused_with_the_python_literal(tmp_path):
    path = tmp_path / "quoted_bool.py"
    path.write_text(
        "from dlmspec.dsl import Spec\n"
        'spec = Spec.load("demo-dlm")\n'
        'spec.data.mock = "no"\n', encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load(path)
    (issue,) = info.value.issues
    assert (issue.key, issue.line) == ("data.mock", 3)
    assert "data.mock = False" in issue.hint


def test_whole_float_where_an_int_belongs_is_an_error_with_the_integer_remedy(tmp_path):
    path = _demo_with(tmp_path, global_batch_size="32.0")
    with pytest.raises(SpecError) as info:
        load(path, fast=True)
    (issue,) = [i for i in info.value.issues if i.key == "train.global_batch_size"]
    assert "train.global_batch_size = 32" in issue.hint
    assert issue.fix is not None and issue.fix.set == {"train.global_batch_size": 32}
