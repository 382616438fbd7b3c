"""Sweeps in a Python spec: validate, plan and compile handle each member; compile
writes one folder per member, deterministically; duplicate names and shared folders are refused."""

import json
import subprocess
import sys
from pathlib import Path

from dlmspec.errors import SpecError
from dlmspec.spec.load import load
from dlmspec.spec.python_load import sweep_targets

import pytest

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "dlmspec.cli"]
SWEEP = ROOT / "specs" / "demo-sweep.py"


def _run(*args, cwd):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd)


def test_compile_writes_one_folder_per_member_deterministically(tmp_path):
    hashes = []
    for out in ("a", "b"):
        done = _run("compile", str(SWEEP), "-o", out, "--json", cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        sweep = json.loads(done.stdout)["result"]["sweep"]
        hashes.append([m["content_hash"] for m in sweep])
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(names) == 6 and len(set(hashes[0])) == 6 and hashes[0] == hashes[1]
    for name in names:
        assert (tmp_path / "a" / name / "train.py").read_bytes() == (tmp_path / "b" / name / "train.py").read_bytes()
        assert f"runs/{name}/checkpoints" in (tmp_path / "a" / name / "train.py").read_text()


def test_validate_and_plan_take_every_member(tmp_path):
    done = _run("validate", str(SWEEP), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    assert len(json.loads(done.stdout)["result"]["sweep"]) == 6
    done = _run("plan", str(SWEEP), cwd=tmp_path)
    assert done.returncode == 0 and "demo-dlm-mb32-full" in done.stdout


def test_duplicate_names_and_shared_checkpoints_are_refused(tmp_path):
    dup = tmp_path / "dup.py"
    dup.write_text('from dlmspec.dsl import Spec\nb = Spec.load("demo-dlm")\nspec = [b, b.replace(lr=1)]\n'
                   .replace("lr=1", 'train={"lr": 1e-4}'))
    with pytest.raises(SpecError) as info:
        sweep_targets(dup)
    assert info.value.issues[0].rule == "sweep-names"
    shared = tmp_path / "shared.py"
    shared.write_text('from dlmspec.dsl import Spec\nb = Spec.load("demo-dlm").replace(\n'
                      '    checkpoint={"save": "ckpt"})\nspec = {"x": b, "y": b}\n')
    with pytest.raises(SpecError) as info:
        sweep_targets(shared)
    assert info.value.issues[0].rule == "sweep-paths" and info.value.issues[0].line == 3


def test_one_member_is_picked_with_its_name():
    assert load(f"{SWEEP}::demo-dlm-mb16-none").spec.train.micro_batch_size == 16
    with pytest.raises(SpecError):
        load(SWEEP)


SMALL = ('from dlmspec.dsl import Spec\nbase = Spec.load("demo-dlm")\n'
         'spec = {"mb16": base.replace(train={"micro_batch_size": 16}),\n'
         '        "mb32-full": base.replace(train={"micro_batch_size": 32},\n'
         '                                  recompute={"granularity": "full", "method": "uniform", "num_layers": 1})}\n')


def _main_json(capsys, *args):
    from dlmspec.cli import main

    code = main([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_plan_rows_equal_each_member_planned_alone(tmp_path, capsys):
    from dlmspec.cli import main
    from dlmspec.gpus import GiB

    sweep = tmp_path / "small.py"
    sweep.write_text(SMALL)
    code, envelope = _main_json(capsys, "plan", str(sweep))
    assert code == 0 and envelope["ok"] and [p["spec"].rpartition("::")[2] for p in envelope["result"]["sweep"]] == \
        ["mb16", "mb32-full"]
    alone = {}
    for member in envelope["result"]["sweep"]:
        code, one = _main_json(capsys, "plan", member["spec"])
        assert code == 0
        alone[member["spec"].rpartition("::")[2]] = one["result"]
        assert {k: v for k, v in member.items() if k != "spec"} == {k: v for k, v in one["result"].items() if k != "spec"}
    assert main(["plan", str(sweep)]) == 0
    text = capsys.readouterr().out
    rows = {cells[0]: cells[1:] for line in text.splitlines() if line.startswith("│")
            for cells in [[c.strip() for c in line.strip("│").split("│")]]}
    assert set(rows) == {"mb16", "mb32-full"}
    for name, plan in alone.items():  # columns 7-9: MFU, peak GiB/GPU, fits (the study table's)
        assert rows[name][6:9] == [f"{100 * plan['mfu']:.1f}%", f"{plan['memory']['peak_bytes'] / GiB:,.2f}",
                                   "yes" if plan["memory"]["fits"] else "NO"], name


def test_plan_search_on_a_sweep_searches_each_member(tmp_path, capsys):
    from dlmspec.cli import main

    sweep = tmp_path / "small.py"
    sweep.write_text(SMALL.replace('"micro_batch_size": 32', '"micro_batch_size": 32, "global_batch_size": 64'))
    code, envelope = _main_json(capsys, "plan", str(sweep), "--search", "--top", "2")
    assert code == 0 and envelope["ok"], envelope
    found = envelope["result"]["sweep"]
    assert [m["spec"].rpartition("::")[2] for m in found] == ["mb16", "mb32-full"]
    for member in found:
        code, one = _main_json(capsys, "plan", member["spec"], "--search", "--top", "2")
        assert code == 0 and member["search"] == one["result"]["search"]
    assert found[0]["search"]["top"] != found[1]["search"]["top"]  # the global batch differs
    assert main(["plan", str(sweep), "--search", "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert text.count("top 2 layouts by tokens/s") == 2 and "mb16" in text and "mb32-full" in text


LOCAL_CALIBRATION = "calibration: local+sdpa: calibrated on 70 local+sdpa runs on h200"


def test_plan_and_search_of_a_sweep_name_their_calibration(tmp_path, capsys):
    """Like a single plan, a sweep's table and each member's search say which constants planned them."""
    from dlmspec.cli import main

    sweep = tmp_path / "small.py"
    sweep.write_text(SMALL)
    assert main(["plan", str(sweep)]) == 0
    text = capsys.readouterr().out
    assert text.count(LOCAL_CALIBRATION) == 1  # one line: every member was planned with the same constants
    code, envelope = _main_json(capsys, "plan", str(sweep))
    assert all(m["provenance"]["calibration"]["status"] == "calibrated" for m in envelope["result"]["sweep"])
    assert main(["plan", str(sweep), "--search", "--top", "1"]) == 0
    assert capsys.readouterr().out.count(LOCAL_CALIBRATION) == 2  # one per member's search
    code, envelope = _main_json(capsys, "plan", str(sweep), "--search", "--top", "1")
    for member in envelope["result"]["sweep"]:
        cal = member["search"]["calibration"]
        assert cal["status"] == "calibrated" and cal["fitted_on"] == "local+sdpa"
        assert LOCAL_CALIBRATION == "calibration: " + cal["text"].removesuffix(" (docs/planner-methods.md)")


def test_sweep_members_on_different_paths_each_name_theirs(tmp_path, capsys):
    from dlmspec.cli import main

    sweep = tmp_path / "paths.py"
    sweep.write_text('from dlmspec.dsl import Spec\nbase = Spec.load("demo-dlm")\n'
                     'spec = {"local": base,\n'
                     '        "te": base.replace(model={"transformer_impl": "transformer_engine"},\n'
                     '                           objective={"variable_length_prob": 0.0})}\n')
    assert main(["plan", str(sweep)]) == 0
    text = capsys.readouterr().out
    assert "local: " + LOCAL_CALIBRATION in text
    from dlmspec.plan.calibration import TE_MEASURED

    assert (f"te: calibration: transformer_engine: calibrated on {TE_MEASURED.runs} "
            "transformer_engine runs") in text


def test_a_set_that_gives_members_one_name_or_folder_is_refused(tmp_path):
    for item, rule in (("name=x", "sweep-names"), ("checkpoint.save=ckpt", "sweep-paths")):
        with pytest.raises(SpecError) as info:
            sweep_targets(SWEEP, [item])
        issue = info.value.issues[0]
        assert (issue.rule, issue.file) == (rule, "--set"), item
    assert len(sweep_targets(SWEEP, ["train.lr=1e-4", "checkpoint.save=runs/{name}/ckpt"])) == 6
    done = _run("compile", str(SWEEP), "-o", "out", "--set", "name=x", cwd=tmp_path)
    assert done.returncode == 2 and not (tmp_path / "out").exists() and "sweep-names" in done.stdout + done.stderr
    for command in (["validate"], ["plan"], ["submit", "--dry-run"]):
        done = _run(*command, str(SWEEP), "--set", "name=x", cwd=tmp_path)
        assert done.returncode == 2 and "sweep-names" in done.stdout + done.stderr, command
