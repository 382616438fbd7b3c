"""Provenance of a run: the spec's hash, the dlmspec version, the git commit of the
spec's repository and the library versions, read at launch, in the start record at the head of
metrics.jsonl and in every checkpoint's dlmspec.json."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import subprocess
from pathlib import Path

import torch

import dlmspec
from dlmspec.backends.megatron import provenance
from runtime_loop_kit import _events, _run, _train, cpu_train  # noqa: F401  (cpu_train: a fixture)

HASH = "sha256:" + "ab" * 32


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_the_record_names_the_commit_and_whether_it_is_dirty(tmp_path) -> None:
    repo = tmp_path / "specs"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "run.toml").write_text('name = "x"\n')
    _git(repo, "add", "run.toml")
    _git(repo, "commit", "-q", "-m", "spec")
    record = provenance.collect(HASH, launch_dir=str(repo))
    assert record["spec_hash"] == HASH and record["dlmspec_version"] == dlmspec.__version__
    assert record["git"] == {"commit": _git(repo, "rev-parse", "HEAD"), "dirty": False,
                             "root": str(repo.resolve())}
    (repo / "run.toml").write_text('name = "y"\n')
    assert provenance.collect(HASH, launch_dir=str(repo))["git"]["dirty"] is True
    versions = record["versions"]
    assert versions["torch"] == torch.__version__
    assert versions["megatron_core"] == importlib.metadata.version("megatron-core")
    assert "transformer_engine" in versions and "python" in versions
    json.dumps(record)  # goes into JSON files as it is


def test_outside_a_repository_git_is_none(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert provenance.collect(None, launch_dir=str(tmp_path))["git"] is None
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
    assert provenance.git_state(str(tmp_path)) is None


def test_a_run_records_it_in_metrics_and_every_checkpoint(tmp_path, cpu_train, monkeypatch, capsys) -> None:  # noqa: F811
    monkeypatch.chdir(tmp_path)
    run = dataclasses.replace(_run(tmp_path), spec_hash=HASH)
    _train(run)
    start = _events(run)[0]
    assert start["event"] == "start"  # the head of metrics.jsonl
    record = start["provenance"]
    assert record["spec_hash"] == HASH and record["versions"]["torch"] == torch.__version__
    assert set(start["phases_s"]) == {"build_data"}  # a fresh run: no checkpoint load, no init_from
    for name in ("iter_0000002", "iter_0000004"):
        meta = json.loads((tmp_path / "ckpt" / name / "dlmspec.json").read_text())
        assert meta["provenance"] == record and "spec" in meta
    out = capsys.readouterr().out
    assert f"[dlmspec] provenance: spec {HASH}, dlmspec {dlmspec.__version__}" in out
    assert "[dlmspec] building the datasets (index files are built on first use): " in out
