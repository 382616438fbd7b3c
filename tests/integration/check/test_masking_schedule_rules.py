"""``objective.noise_schedule`` (``"linear"``, ``"cosine"``, ``"polynomial"``) and
``objective.noise_schedule_exponent`` through the compiler: the schema, the rules of
dlmspec/check/objective.py, what train.py's ``ObjectiveConfig`` receives (through the mdm
objective's registration, as CART's p) and the planner's share of loss-carrying rows."""

from __future__ import annotations

import ast
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dlmspec.check import find
from dlmspec.plan.shape import model_shape
from dlmspec.render.compile import render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
DLM, AR = ROOT / "specs" / "demo-dlm.toml", ROOT / "specs" / "demo-ar.toml"


def _spec(path: Path, *sets: str):
    return load(path, list(sets)).spec


def _objective_config(spec) -> dict[str, Any]:
    tree = ast.parse(render(resolve(spec), "spec.toml")["train.py"])
    (call,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "ObjectiveConfig"]
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


def _rules(spec) -> set[str]:
    return {i.rule for i in find(("spec", "runtime"), spec)}


def test_linear_default_writes_no_schedule_keyword() -> None:
    spec = _spec(DLM)
    assert spec.objective.noise_schedule == "linear" and spec.objective.noise_schedule_exponent is None
    got = _objective_config(spec)
    assert "noise_schedule" not in got and "noise_schedule_exponent" not in got


def test_cosine_and_polynomial_reach_train_py() -> None:
    assert _objective_config(_spec(DLM, 'objective.noise_schedule="cosine"'))["noise_schedule"] == "cosine"
    got = _objective_config(_spec(DLM, 'objective.noise_schedule="polynomial"', "objective.noise_schedule_exponent=2.5"))
    assert (got["noise_schedule"], got["noise_schedule_exponent"]) == ("polynomial", 2.5)
    got = _objective_config(_spec(DLM, 'objective.noise_schedule="polynomial"'))
    assert got["noise_schedule_exponent"] == 1.0  # unset: 1, written so train.py says it


def test_cart_p_goes_through_the_registration_with_its_default() -> None:
    got = _objective_config(_spec(DLM, 'objective.loss_weighting="cart"'))
    assert got["cart_p"] == 0.1
    assert "cart_p" not in _objective_config(_spec(DLM, "objective.cart_p=0.3"))  # llada: no effect, not written


def test_schedule_rules() -> None:
    assert not {"mdm-schedule-exponent-ignored", "mdm-schedule-ar"} & _rules(_spec(DLM, 'objective.noise_schedule="cosine"'))
    assert "mdm-schedule-exponent-ignored" in _rules(
        _spec(DLM, 'objective.noise_schedule="cosine"', "objective.noise_schedule_exponent=2.0"))
    assert "mdm-schedule-exponent-ignored" not in _rules(
        _spec(DLM, 'objective.noise_schedule="polynomial"', "objective.noise_schedule_exponent=2.0"))
    assert "mdm-schedule-ar" in _rules(_spec(AR, 'objective.noise_schedule="cosine"'))
    assert "mdm-schedule-ar" not in _rules(_spec(AR))


@pytest.mark.parametrize("setting,words", [
    ('objective.noise_schedule="sqrt"', ["objective.noise_schedule", "'linear', 'cosine' or 'polynomial'"]),
    ("objective.noise_schedule_exponent=0", ["objective.noise_schedule_exponent", "greater than 0"]),
    ("objective.noise_schedule_exponent=-2.0", ["objective.noise_schedule_exponent", "greater than 0"]),
])
def test_bad_schedule_values_exit_2_naming_key_and_remedy(tmp_path: Path, setting: str, words: list[str]) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text(f'extends = "{DLM.as_posix()}"\n', encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "dlmspec.cli", "validate", str(spec), "--set", setting],
                          capture_output=True, text=True, env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stdout + done.stderr
    out = " ".join((done.stdout + done.stderr).split())
    assert "Traceback" not in out and all(w in out for w in words), out


@pytest.mark.parametrize("sets,share", [((), 0.5), (('objective.noise_schedule="cosine"',), 2 / math.pi),
                                        (('objective.noise_schedule="polynomial"', "objective.noise_schedule_exponent=3.0"), 0.25)])
def test_planner_reads_the_share_of_loss_rows_from_the_schedule(sets: tuple[str, ...], share: float) -> None:
    assert model_shape(resolve(_spec(DLM, *sets))).loss_row_fraction == pytest.approx(share)
    assert model_shape(resolve(_spec(AR))).loss_row_fraction == 1.0
