"""`dlmspec show specs/sweep.py::member` prints that member (a path with a folder and `::MEMBER` is a
spec, not a run folder), and `show` of the whole sweep offers a remedy that runs as typed: the path
with its folder (a new user's finding: the remedy dropped `specs/`, and the member then read as a
missing run folder)."""

from __future__ import annotations

import json
from pathlib import Path

from dlmspec.cli import main

ROOT = Path(__file__).resolve().parents[3]


def test_show_of_a_sweep_member_by_its_path_prints_it(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = main(["show", "specs/scaling-demo-repeat.py::repeat-dlm-n1.5m-u2.4m-e1"])
    assert code == 0
    assert 'name = "repeat-dlm-n1.5m-u2.4m-e1"' in capsys.readouterr().out


def test_the_remedy_for_a_whole_sweep_runs_as_typed(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = main(["show", "specs/scaling-demo-repeat.py", "--json"])
    (issue,) = json.loads(capsys.readouterr().out)["issues"]
    assert code == 2
    typed = issue["hint"].split("pick one as ", 1)[1].split(" ", 1)[0]
    assert typed.startswith("specs/scaling-demo-repeat.py::")
    assert main(["show", typed]) == 0
