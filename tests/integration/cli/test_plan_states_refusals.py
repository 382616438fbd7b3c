"""``dlmspec plan`` of a spec that ``validate`` refuses (a feature the runtime lacks: asynchronous saves) still plans it,
and states each of validate's refusals as a warning (text and ``--json``), single spec and sweep."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "dlmspec.cli"]


def _rl_spec(tmp_path: Path) -> Path:
    path = tmp_path / "rl.toml"
    text = (ROOT / "specs" / "demo-dlm.toml").read_text(encoding="utf-8")
    path.write_text(text.replace("[checkpoint]\n", "[checkpoint]\nasync_save = true\n", 1), encoding="utf-8")
    return path


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=tmp_path)


def test_plan_of_an_rl_spec_plans_and_warns_of_every_validate_refusal(tmp_path):
    path = _rl_spec(tmp_path)
    validate = _run(tmp_path, "validate", str(path), "--json")
    assert validate.returncode == 2
    refused = {(i["rule"], i["key"]) for i in json.loads(validate.stdout)["issues"] if i["severity"] == "error"}
    assert ("runtime-async-save", "checkpoint.async_save") in refused

    plan = _run(tmp_path, "plan", str(path), "--json")
    assert plan.returncode == 0, plan.stderr
    envelope = json.loads(plan.stdout)
    warned = {(i["rule"], i["key"]) for i in envelope["warnings"]}
    assert refused <= warned
    rl = next(i for i in envelope["warnings"] if i["rule"] == "runtime-async-save")
    assert "validate and compile refuse" in rl["message"]
    assert envelope["result"]["memory"]["peak_bytes"] > 0


def test_plan_text_output_names_the_refusal_on_stderr(tmp_path):
    path = _rl_spec(tmp_path)
    plan = _run(tmp_path, "plan", str(path))
    assert plan.returncode == 0, plan.stderr
    assert "runtime-async-save" in plan.stderr and "not implemented" in plan.stderr
    assert "Traceback" not in plan.stderr


def test_plan_of_a_sweep_warns_of_a_member_validate_refuses(tmp_path):
    _rl_spec(tmp_path)
    sweep = tmp_path / "sweep.py"
    sweep.write_text(
        "from dlmspec.dsl import Spec\n"
        f'base = Spec.load({str(tmp_path / "rl.toml")!r})\n'
        'spec = {"a": base.replace(name="a"), "b": base.replace(name="b", checkpoint={"async_save": False})}\n',
        encoding="utf-8")
    plan = _run(tmp_path, "plan", str(sweep), "--json")
    assert plan.returncode == 0, plan.stderr
    warned = [(i["rule"], i["file"]) for i in json.loads(plan.stdout)["warnings"]]
    assert [f for r, f in warned if r == "runtime-async-save"] and all(f.endswith("::a") for r, f in warned if r == "runtime-async-save")


def test_plan_of_a_spec_validate_accepts_adds_no_warning(tmp_path):
    plan = _run(tmp_path, "plan", str(ROOT / "specs" / "demo-dlm.toml"), "--json")
    assert plan.returncode == 0
    assert not [i for i in json.loads(plan.stdout)["warnings"] if "refuse" in i["message"]]
