"""Sweeps in a Python spec (issue 22): validate, plan and compile handle each member; compile
writes one folder per member, deterministically; duplicate names and shared folders are refused."""

import json
import subprocess
import sys
from pathlib import Path

from dlmspec.errors import SpecError
from dlmspec.spec.load import load, sweep_targets

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
