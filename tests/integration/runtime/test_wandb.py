"""Weights & Biases logging: a CPU run with ``wandb`` offline, its run file read back
with wandb's own record type and compared with metrics.jsonl; a resume continues the same W&B
run; the API key stays in the environment."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dlmspec.backends.megatron import checkpointing
from dlmspec.backends.megatron.config import LoggingConfig
from dlmspec.backends.megatron.wandb_log import RUN_ID_FILE, WandbRun, read_offline_run, run_id
from runtime_loop_kit import _events, _run, _train, cpu_train  # noqa: F401  (cpu_train: a fixture)

pytest.importorskip("wandb")

FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"  # shaped like a W&B key; must never be written


@pytest.fixture()
def wandb_env(tmp_path, monkeypatch):
    """wandb's own folders inside the test's, and a (fake) key in the environment."""
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.delenv("WANDB_MODE", raising=False)


def _wandb_run(tmp_path: Path, **schedule):
    run = _run(tmp_path, **schedule)
    return dataclasses.replace(run, logging=dataclasses.replace(
        run.logging, wandb_project="dlmspec-test", wandb_exp_name="cpu-run", wandb_mode="offline",
        wandb_tags=("cpu", "test")))


def _offline_runs(run) -> list:
    return sorted(Path(run.logging.run_dir, "wandb", "wandb").glob("offline-run-*/run-*.wandb"))


def test_the_offline_run_holds_the_scalars_of_metrics_jsonl(tmp_path, cpu_train, wandb_env) -> None:  # noqa: F811
    run = _wandb_run(tmp_path)
    _train(run)
    (run_file,) = _offline_runs(run)
    found = read_offline_run(str(run_file))
    assert found["project"] == "dlmspec-test" and found["name"] == "cpu-run"
    assert found["run_id"] == (Path(run.logging.run_dir) / "wandb" / RUN_ID_FILE).read_text().strip()
    by_step = {}
    for row in found["history"]:
        by_step.setdefault(row["_step"], {}).update(row)
    events = _events(run)
    trains = [e for e in events if e["event"] == "train"]
    assert [e["iteration"] for e in trains] == [2, 4]
    for event in trains:
        row = by_step[event["iteration"]]
        for key in ("loss", "lr", "grad_norm", "tokens_per_s", "eta_s", "tokens_seen", "mask_ratio"):
            assert row[f"train/{key}"] == pytest.approx(event[key]), key
    for event in (e for e in events if e["event"] == "valid"):
        assert by_step[event["iteration"]]["valid/loss"] == pytest.approx(event["loss"])
    provenance = json.loads(found["config"]["provenance"])
    assert provenance == events[0]["provenance"]
    for path in Path(run.logging.run_dir).rglob("*"):  # the key is never written
        if path.is_file():
            assert FAKE_KEY.encode() not in path.read_bytes(), path


def test_a_resume_continues_the_same_wandb_run(tmp_path, cpu_train, wandb_env, monkeypatch) -> None:  # noqa: F811
    _train(_wandb_run(tmp_path))
    load = checkpointing.dist_checkpointing.load
    monkeypatch.setattr(checkpointing.dist_checkpointing, "load", lambda *a, **k: {**load(*a, **k), "optimizer": {}})
    run = _wandb_run(tmp_path, train_iters=6)
    _train(run)
    runs = [read_offline_run(str(path)) for path in _offline_runs(run)]
    assert len(runs) == 2 and runs[0]["run_id"] == runs[1]["run_id"]
    steps = sorted({row["_step"] for found in runs for row in found["history"] if "train/loss" in row})
    assert steps == [2, 4, 6]
    starts = [e for e in _events(run) if e["event"] == "start"]
    assert "load_checkpoint" in starts[-1]["phases_s"]  # the resume's load, timed


def test_the_run_id_is_kept_beside_the_wandb_files(tmp_path) -> None:
    first = run_id(str(tmp_path))
    assert len(first) == 16 and run_id(str(tmp_path)) == first


def test_an_unknown_mode_is_refused(tmp_path) -> None:
    config = LoggingConfig(run_dir=str(tmp_path), wandb_project="p", wandb_mode="disabled-ish")
    with pytest.raises(ValueError, match="logging.wandb_mode"):
        WandbRun.start(config, name="x")


def test_run_id_file_is_never_written_through_a_link_and_a_pipe_is_not_read(tmp_path):
    """The W&B run id file is created beside its target and renamed over it: a link planted at
    its name is replaced (its target untouched); a FIFO there is replaced, not read (no hang)."""
    import os

    victim = tmp_path / "victim.txt"
    victim.write_text("not an id!\n")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / RUN_ID_FILE).symlink_to(victim)
    (linked / f"{RUN_ID_FILE}.tmp{os.getpid()}").symlink_to(victim)
    new = run_id(str(linked))
    assert victim.read_text() == "not an id!\n"
    assert not (linked / RUN_ID_FILE).is_symlink() and (linked / RUN_ID_FILE).read_text().strip() == new
    piped = tmp_path / "piped"
    piped.mkdir()
    os.mkfifo(piped / RUN_ID_FILE)
    assert len(run_id(str(piped))) == 16
