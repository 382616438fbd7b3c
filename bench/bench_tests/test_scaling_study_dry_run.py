"""The scaling suite's launcher (bench/scaling/run.py): --dry prints, for every member of the bundled
studies, its training and evaluation commands, and the planner's estimate within the study's budget;
bad flags exit 2 naming the flag; a run past the budget is stopped with its process group; the
result's readers take the loss from metrics.jsonl and the scores from dlmspec eval's envelope."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from utc_dates_kit import call_with_dates

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "bench" / "scaling" / "run.py"


def _launcher():
    spec = importlib.util.spec_from_file_location("bench_scaling_run_launcher", LAUNCHER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _dry(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LAUNCHER), "--dry", "--out", str(tmp_path / "results"),
                           "--work-dir", str(tmp_path / "work"), *extra],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_dry_prints_each_members_training_and_evaluation_and_an_estimate_within_the_budget(tmp_path):
    from dlmspec.spec.load import load
    from dlmspec.spec.python_load import sweep_targets

    proc, dates = call_with_dates(lambda: _dry(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] in {f"result: {tmp_path / 'results' / 'scaling' / f'{day}-cpu-demo-isoflop-and-repeat.json'}"
                         for day in dates}
    work = tmp_path / "work"
    assert lines[0].startswith("link-data: ") and f"ln -sfn {ROOT / '.data'} {work / '.data'}" in lines[0]
    for stem in ("scaling-demo-isoflop", "scaling-demo-repeat"):
        assert any(line.startswith(f"compile-{stem}: ") and f"-o {work / 'compiled' / stem} --force" in line
                   for line in lines), stem
    names = {load(t).spec.name: load(t).spec.objective.kind
             for stem in ("scaling-demo-isoflop", "scaling-demo-repeat")
             for t in sweep_targets(ROOT / "specs" / f"{stem}.py")}
    assert len(names) == 28
    for name, kind in names.items():
        home = work / "members" / name  # each member's own folder: its .data/ and megatron's index cache
        (train,) = [line for line in lines if line.startswith(f"train-{name}: ")]
        assert f"(cd {home} && bash {work / 'compiled'}/" in train and f"/{name}/launch.sh)" in train
        (ev,) = [line for line in lines if line.startswith(f"eval-{name}: ")]
        assert f"dlmspec.cli eval {home / 'runs' / name} --data {home / '.data' / 'demo-valid_text_document'}" in ev
        assert ("--num-samples 128" in ev) == (kind != "ar")
    (est,) = [line for line in lines if line.startswith("estimate: ")]
    wall = float(re.search(r"~(\d+) s at 8 side by side \(budget 540 s\)", est).group(1))
    assert 0 < wall <= 540
    assert not (tmp_path / "results").exists() and not work.exists()  # --dry writes nothing


def test_bad_flags_exit_2_naming_the_flag(tmp_path):
    for bad, says in ((["--members", "nothing-*"], "--members"), (["--parallel", "0"], "--parallel"),
                      (["--specs", "specs/none.py"], "--specs"), (["--budget-s", "0"], "--budget-s")):
        proc = _dry(tmp_path, *bad)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, bad


def test_a_chosen_member_runs_alone(tmp_path):
    proc = _dry(tmp_path, "--members", "repeat-dlm-*", "--specs", "specs/scaling-demo-repeat.py")
    assert proc.returncode == 0, proc.stderr
    trains = [line.split(":")[0] for line in proc.stdout.splitlines() if line.startswith("train-")]
    assert sorted(trains) == ["train-repeat-dlm-n1.5m-u2.4m-e1", "train-repeat-dlm-n1.5m-u300k-e8"]
    assert "estimate: 2 runs" in proc.stdout


def test_slurm_dry_prints_an_sbatch_script_that_reruns_the_launcher():
    proc = subprocess.run([sys.executable, str(LAUNCHER), "--dry", "--slurm", "--gpus", "1"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.startswith("#!/usr/bin/env bash\n")
    srun = next(line for line in proc.stdout.splitlines() if line.startswith("srun "))
    assert "bench/scaling/run.py" in srun and "--dry" not in srun and "--slurm" not in srun


def test_a_run_past_the_budget_is_stopped_with_its_process_group(tmp_path):
    run = _launcher()
    marker = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {marker}; wait"
    t0 = time.monotonic()
    with open(tmp_path / "log", "wb") as out:
        code, seconds = run.run_until(["bash", "-c", script], tmp_path, {}, out, time.monotonic() + 1.0)
    assert code is None and time.monotonic() - t0 < 30
    child = int(marker.read_text())
    for _ in range(50):  # the group's SIGTERM reaches the background sleep too
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the run's child process outlived the stop")


def test_each_member_links_the_data_files_into_a_folder_of_its_own(tmp_path):
    run = _launcher()
    data = tmp_path / "data"
    (data / "gpt2").mkdir(parents=True)
    for name in ("demo-train_text_document.bin", "demo-train_text_document.idx", "gpt2/vocab.json"):
        (data / name).write_bytes(b"x")
    (data / "cache").mkdir()  # a cache of another run is not shared
    homes = [run.member_dir(tmp_path / "work", n) for n in ("a", "b")]
    for home in homes:
        run.link_data(home, data)
        run.link_data(home, data)  # twice: nothing changes
        assert sorted(p.name for p in (home / ".data").iterdir()) == [
            "demo-train_text_document.bin", "demo-train_text_document.idx", "gpt2"]
        assert (home / ".data" / "gpt2" / "vocab.json").read_bytes() == b"x"
    (homes[0] / ".data" / "cache").mkdir()  # what megatron-core writes beside the data stays the member's
    assert not (homes[1] / ".data" / "cache").exists() and not (data / "cache" / "x").exists()


def test_the_readers_take_the_last_validation_loss_and_the_eval_scores(tmp_path):
    run = _launcher()
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join([json.dumps({"event": "train", "iteration": 1, "loss": 9.0}),
                                  json.dumps({"event": "valid", "iteration": 5, "loss": 7.5}), "not json",
                                  json.dumps({"event": "valid", "iteration": 10, "loss": 6.25}),
                                  json.dumps({"event": "train", "iteration": 10, "loss": 6.0})]) + "\n")
    assert run.last_valid_loss(metrics) == 6.25
    assert run.last_valid_loss(tmp_path / "none.jsonl") is None
    mdm = tmp_path / "mdm.json"
    mdm.write_text(json.dumps({"ok": True, "result": {"elbo": {"count": {
        "nll_per_token": 5.5, "stderr_per_token": 0.02, "num_samples": 128, "num_sequences": 64, "num_tokens": 32768,
        "perplexity_bound": 244.7}}}}))
    assert run.eval_scores(mdm) == {"kind": "elbo_count", "nll_per_token": 5.5, "stderr_per_token": 0.02,
                                    "num_samples": 128, "num_sequences": 64, "num_tokens": 32768}
    ar = tmp_path / "ar.json"
    ar.write_text(json.dumps({"ok": True, "result": {"ar": {"nll_per_token": 4.0, "perplexity": 54.6,
                                                            "num_tokens": 32704}}}))
    assert run.eval_scores(ar) == {"kind": "ar_nll", "nll_per_token": 4.0, "perplexity": 54.6, "num_tokens": 32704,
                                   "num_sequences": None}
    for bad in ("", "{", json.dumps({"ok": False, "issues": []}), json.dumps([1])):
        (tmp_path / "bad.json").write_text(bad)
        assert run.eval_scores(tmp_path / "bad.json") is None


def test_a_member_is_trained_then_evaluated_in_its_own_folder_and_its_files_kept(tmp_path):
    """run_member with stand-ins for launch.sh and dlmspec eval (the real ones need a GPU): the run's
    folder, its loss, its scores, the copies beside the result; a member after the budget is skipped."""
    import threading

    run = _launcher()
    data = tmp_path / "data"
    data.mkdir()
    (data / "demo-valid_text_document.idx").write_bytes(b"x")
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    row = {"name": "m1", "valid_prefix": ".data/demo-valid_text_document"}
    train_script = ("test -e .data/demo-valid_text_document.idx && mkdir -p runs/m1/checkpoints/iter_0000007 && "
                    "echo '{\"event\": \"valid\", \"iteration\": 7, \"loss\": 5.5}' > runs/m1/metrics.jsonl && "
                    "echo '{\"provenance\": {}}' > runs/m1/checkpoints/iter_0000007/dlmspec.json")
    eval_script = "echo '{\"ok\": true, \"result\": {\"ar\": {\"nll_per_token\": 5.25, \"num_tokens\": 64}}}'"
    train = ("train-m1", ["bash", "-c", train_script], {})
    ev = ("eval-m1", ["bash", "-c", eval_script], {})
    out = run.run_member(row, train, ev, work, data, time.monotonic() + 60, threading.Lock())
    assert out["train"]["returncode"] == 0 and out["eval"]["returncode"] == 0 and "log_tail" not in out
    assert out["valid_loss"] == 5.5
    assert out["eval_scores"] == {"kind": "ar_nll", "nll_per_token": 5.25, "perplexity": None, "num_tokens": 64,
                                  "num_sequences": None}
    row["study"] = "scaling-demo-x.py"
    lock = work / "compiled" / "scaling-demo-x" / "m1" / "spec.lock.toml"
    lock.parent.mkdir(parents=True)
    lock.write_text("name = 'm1'\n")
    (data / "demo-valid_text_document.dlmspec.json").write_text("{}")
    run.keep_files(work, [row], tmp_path / "kept", data)
    kept = tmp_path / "kept"
    assert sorted(p.name for p in (kept / "runs" / "m1").iterdir()) == [
        "dlmspec.json", "eval.json", "metrics.jsonl", "spec.lock.toml"]
    assert sorted(p.name for p in (kept / ".data").iterdir()) == ["demo-valid_text_document.dlmspec.json",
                                                                   "demo-valid_text_document.idx"]
    failing = ("train-m2", ["bash", "-c", "echo boom; exit 3"], {})
    out = run.run_member({**row, "name": "m2"}, failing, ev, work, data, time.monotonic() + 60, threading.Lock())
    assert out["train"]["returncode"] == 3 and "eval" not in out and out["log_tail"] == ["boom"]
    late = run.run_member({**row, "name": "m3"}, train, ev, work, data, time.monotonic() - 1, threading.Lock())
    assert late == {"skipped": "the study's --budget-s ran out before it started"}
