"""``dlmspec show RUN_DIR``: the provenance of the last launch and the last metrics of
a run directory; a spec file is still shown as before."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dlmspec.cli.commands import app

ROOT = Path(__file__).resolve().parents[3]
PROVENANCE = {"format": 1, "spec_hash": "sha256:" + "cd" * 32, "dlmspec_version": "0.1.0",
              "git": {"commit": "f" * 40, "dirty": True, "root": "/src/specs"},
              "versions": {"python": "3.12.1", "torch": "2.13.0", "megatron_core": "0.16.1",
                           "transformer_engine": None, "wandb": "0.31.0", "cuda": "12.8"}}


def run_dir(tmp_path: Path, *, truncated: bool = False) -> Path:
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    old = dict(PROVENANCE, spec_hash="sha256:" + "00" * 32)
    lines = [
        {"event": "start", "name": "demo", "provenance": old},
        {"event": "train", "iteration": 10, "loss": 9.0},
        {"event": "start", "name": "demo", "provenance": PROVENANCE, "phases_s": {"load_checkpoint": 2.5}},
        {"event": "train", "iteration": 20, "train_iters": 60, "loss": 5.25, "tokens_per_s": 123456.0,
         "eta_s": 40.0, "mask_ratio": 0.5, "loss_t0.25-0.50": 4.5},
        {"event": "valid", "iteration": 20, "loss": 5.5},
        {"event": "checkpoint", "iteration": 20, "path": "runs/demo/ckpt/iter_0000020", "reason": "interval"},
    ]
    text = "".join(json.dumps(x) + "\n" for x in lines) + ('{"event": "tra' if truncated else "")
    (run / "metrics.jsonl").write_text(text)
    return run


def show(*args: str):
    return CliRunner().invoke(app, ["show", *args])


def test_show_prints_the_provenance_and_the_last_metrics(tmp_path) -> None:
    result = show(str(run_dir(tmp_path, truncated=True)))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "run demo" in out and "2 launches" in out and "1 unreadable line skipped" in out
    assert PROVENANCE["spec_hash"] in out and "00" * 32 not in out  # the last launch's
    assert "f" * 40 + " (dirty: tracked files differ) in /src/specs" in out
    assert "megatron-core       0.16.1" in out and "transformer-engine  not installed" in out
    assert "load_checkpoint 2.5 s" in out
    assert "last train record (iteration 20/60)" in out and "5.25" in out and "mask_ratio" in out
    assert "last validation      iteration 20, loss 5.5" in out
    assert "runs/demo/ckpt/iter_0000020" in out and "none yet" in out


def test_show_json(tmp_path) -> None:
    result = show(str(run_dir(tmp_path)), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    run = doc["result"]["run"]
    assert doc["ok"] and doc["command"] == "show"
    assert run["provenance"] == PROVENANCE and run["last_train"]["loss"] == 5.25 and run["launches"] == 2
    assert run["exit"] is None


def test_a_folder_without_metrics_is_named(tmp_path) -> None:
    result = show(str(tmp_path))
    assert result.exit_code == 2 and "RUN_DIR" in result.output and "metrics.jsonl" in result.output
    assert "Traceback" not in result.output


def test_set_is_refused_with_a_run_dir(tmp_path) -> None:
    result = show(str(run_dir(tmp_path)), "--set", "train.lr=1e-3")
    assert result.exit_code == 2 and "--set" in result.output


def test_a_spec_file_is_shown_as_before() -> None:
    result = show(str(ROOT / "specs" / "demo-dlm.toml"))
    assert result.exit_code == 0 and 'name = "demo-dlm"' in result.stdout
