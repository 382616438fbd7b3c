"""``nan``, ``inf`` and ``-inf`` in a spec: every ``--json`` output stays valid (strict) JSON, the
non-finite value written as a string, and the command exits 2 with the schema's refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlmspec.cli import main
from dlmspec.errors import SpecIssue
from small_spec import SMALL_SPEC

COMMANDS = [["validate"], ["plan"], ["plan", "--search"], ["show"], ["compile", "--output", "{out}"]]
CASES = {
    "train.lr": ("train_iters = 10", "train_iters = 10\nlr = nan", "nan"),
    "train.seq_length": ("seq_length = 64", "seq_length = inf", "inf"),
    "cluster.slurm.env.X": ("", '[cluster.slurm]\npartition = "p"\n[cluster.slurm.env]\nX = -inf\n', "-inf"),
}


def _strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise AssertionError(f"invalid JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("key", list(CASES))
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_json_outputs_write_non_finite_spec_values_as_strings(tmp_path: Path, capsys, key: str,
                                                              command: list[str]) -> None:
    old, new, text = CASES[key]
    spec = tmp_path / "spec.toml"
    spec.write_text(SMALL_SPEC.replace(old, new, 1) if old else SMALL_SPEC + new)
    args = [a.replace("{out}", str(tmp_path / "out")) for a in command]
    code = main([args[0], str(spec), *args[1:], "--json"])
    out = capsys.readouterr().out
    doc = _strict(out)
    assert code == 2 and doc["ok"] is False
    assert [(i["key"], i["value"]) for i in doc["issues"]] == [(key, text)]


def test_json_safe_turns_every_non_finite_float_into_text() -> None:
    from dlmspec.errors import json_safe

    data = {"a": [float("nan"), float("inf"), -float("inf"), 1.5], 2: (float("inf"),)}
    assert json_safe(data) == {"a": ["nan", "inf", "-inf", 1.5], "2": ["inf"]}
    issue = SpecIssue("k", "m", value={"x": float("nan")})
    assert json.dumps(issue.to_dict(), allow_nan=False)
