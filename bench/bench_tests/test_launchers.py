"""Every suite launcher's --dry on CPU, and the launchers' child processes never import the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from utc_dates_kit import call_with_dates

ROOT = Path(__file__).resolve().parents[2]

DRY = {
    "throughput": (["bench/throughput/run.py", "--dry", "--skip-import-check", "--peers", "plain,liger",
                    "--megatron-micro-batch-sizes", "4", "--hf-micro-batch-sizes", "4"],
                   "qwen3-1.7b-bf16-seq4096", ["hf_baseline.py", "--impl liger", "torch.distributed.run", "dlmspec.cli compile"]),
    "sampling": (["bench/sampling/run.py", "--dry", "--batches", "1,8"], "demo-dlm-gen128-b1-8",
                 ["dlmspec.cli compile", "launch.sh", "generate_demo.py speed", "--batches 1,8"]),
    "data": (["bench/data/run.py", "--dry"], "prepare-throughput-memory", ["prepare_throughput.py", "prepare_memory.py"]),
    "calibration": (["bench/calibration/run.py", "--dry"], "te-matrix", ["te_calibration.py"]),
    "demos": (["bench/demos/run.py", "--demo", "resume", "--dry"], "demo-resume",
              ["dlmspec.cli compile", "a.compiled/launch.sh", "b.compiled/launch.sh"]),
}


@pytest.mark.parametrize("suite", sorted(DRY))
def test_dry_prints_the_commands_and_the_result_path(suite, tmp_path):
    argv, name, parts = DRY[suite]
    proc, dates = call_with_dates(lambda: subprocess.run(
        [sys.executable, *argv, "--out", str(tmp_path / "results"), "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300, cwd=ROOT))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] in {f"result: {tmp_path / 'results' / suite / f'{day}-cpu-{name}.json'}" for day in dates}
    for part in parts:
        assert part in proc.stdout, part
    assert not (tmp_path / "results").exists()  # --dry writes no result


@pytest.mark.parametrize("suite", ["sampling", "data", "demos", "calibration"])
def test_slurm_dry_prints_an_sbatch_script_that_reruns_the_launcher(suite):
    argv = DRY[suite][0]
    proc = subprocess.run([sys.executable, *argv, "--slurm", "--gpus", "2"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/usr/bin/env bash\n") and "#SBATCH --gpus-per-node=2" in proc.stdout
    srun = next(line for line in proc.stdout.splitlines() if line.startswith("srun "))
    assert argv[0] in srun and "--slurm" not in srun and "--dry" not in srun
    # the compute node runs the interpreter that ran the launcher, not whatever `python` its PATH has
    assert srun.split()[2] == os.path.abspath(sys.executable)


def test_a_work_dir_inside_the_checkout_is_refused_before_anything_runs(tmp_path):
    for argv in (["bench/sampling/run.py", "--dry"], ["bench/throughput/run.py", "--dry", "--skip-import-check"]):
        proc = subprocess.run([sys.executable, *argv, "--work-dir", str(ROOT / "runs" / "x")], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
        assert proc.returncode == 2 and "inside the checkout" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_sampling_arguments_exit_2_naming_the_flag():
    for bad, flag in ((["--batches", "1,x"], "--batches"), (["--gen-length", "100", "--block-length", "32"], "--gen-length")):
        proc = subprocess.run([sys.executable, "bench/sampling/run.py", "--dry", *bad], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
        assert proc.returncode == 2 and flag in proc.stderr and "Traceback" not in proc.stderr


def _load_run():
    import importlib.util

    sys.path.insert(0, str(ROOT / "bench" / "throughput"))
    spec = importlib.util.spec_from_file_location("bench_throughput_run_launcher", ROOT / "bench" / "throughput" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_throughput_jobs_start_without_the_checkout_on_sys_path(tmp_path, monkeypatch):
    """A job of the harness is a process whose sys.path holds neither the checkout nor its folders,
    even when the harness's own PYTHONPATH names the checkout (as an editable set-up would)."""
    run = _load_run()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(tmp_path / "site")]))
    args = run.parse_args(["--work-dir", str(tmp_path / "work")])
    (tmp_path / "work").mkdir()
    probe = "import json, sys, os; print(json.dumps([os.path.realpath(p or os.getcwd()) for p in sys.path]))"
    log = tmp_path / "work" / "probe.log"
    result = run.run_process([sys.executable, "-c", probe], log_path=log, timeout_s=60, env=run.child_env(args))
    assert result["returncode"] == 0, log.read_text()
    paths = [Path(p) for p in json.loads(log.read_text().strip().splitlines()[-1])]
    checkout_pkg = (ROOT / "dlmspec").resolve()
    assert not [p for p in paths if (p / "dlmspec").resolve() == checkout_pkg], paths  # no entry shadows the install
    assert Path(os.path.realpath(tmp_path / "site")) in paths


def test_throughput_compile_runs_outside_the_checkout_with_the_installed_dlmspec(tmp_path, monkeypatch):
    run = _load_run()
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    seen = {}

    def fake_run(cmd, **kwargs):
        seen.update(kwargs, cmd=cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(run.subprocess, "run", fake_run)
    args = run.parse_args(["--work-dir", str(tmp_path / "work")])
    out = run.compile_job(args, "local-bf16", 4, tmp_path / "work" / "r", tmp_path / "work" / "d")
    assert out["returncode"] == 0 and seen["cmd"][1:4] == ["-m", "dlmspec.cli", "compile"]
    cwd = Path(seen["cwd"]).resolve()
    assert cwd == (tmp_path / "work").resolve() and ROOT not in cwd.parents
    assert "PYTHONPATH" not in seen["env"] or str(ROOT) not in seen["env"]["PYTHONPATH"].split(os.pathsep)


def test_calibration_ingest_adds_a_data_file_and_its_manifest_entry(tmp_path):
    from schema import Result, write_result

    data = tmp_path / "calibration"
    shutil.copytree(ROOT / "bench" / "calibration", data, ignore=shutil.ignore_patterns("*.py", "__pycache__", "logs"))
    runs = json.loads((data / "te" / "h200" / "te-matrix-repeat-2026-12-02.json").read_text())["runs"]
    result = write_result(Result(suite="calibration", name="te-matrix", command=["python", "bench/calibration/run.py"],
                                 versions={"python": "3.12", "dlmspec": "0.1.0"}, hardware={"gpu": "h100", "gpu_count": 1},
                                 values={"layer_path": "transformer_engine", "date": "2026-12-06", "runs": runs},
                                 date="2026-12-06"), tmp_path / "results")
    proc = subprocess.run([sys.executable, "bench/calibration/run.py", "--ingest", str(result), "--data", str(data)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    new = data / "te" / "h100" / "2026-12-06-te-matrix.json"
    assert json.loads(new.read_text())["runs"] == runs
    man = json.loads((data / "manifest.json").read_text())
    assert {"layer_path": "transformer_engine", "gpu": "h100", "dir": "te/h100", "runs": [new.name],
            "fit": "te/h100/fit.json"} in man["paths"]
    again = subprocess.run([sys.executable, "bench/calibration/run.py", "--ingest", str(result), "--data", str(data)],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert again.returncode == 2 and "exists already" in again.stderr


def test_calibration_ingest_refuses_a_result_of_another_suite(tmp_path):
    from schema import Result, write_result

    result = write_result(Result(suite="sampling", name="x", command=["python"], versions={"python": "3", "dlmspec": "0"},
                                 hardware={"gpu": "h100", "gpu_count": 1}, values={}, date="2026-12-06"), tmp_path)
    proc = subprocess.run([sys.executable, "bench/calibration/run.py", "--ingest", str(result), "--data", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "calibration result" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.harness
def test_throughput_dry_compiles_with_a_non_editable_install(tmp_path):
    """dlmspec installed from its wheel into a folder, run by a Python without the editable install:
    the harness's compile of the megatron variant imports the installed package (the checkout's
    dlmspec/ has no templates: imported from the checkout, compile fails with ModuleNotFoundError)."""
    import site
    import sysconfig

    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            str(wheel_dir), str(ROOT)], capture_output=True, text=True, timeout=600)
    if built.returncode != 0:
        pytest.skip(f"cannot build the wheel here: {built.stderr[-300:]}")
    [wheel] = wheel_dir.glob("dlmspec-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(wheel)], check=True, capture_output=True, timeout=600)
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    deps = sysconfig.get_paths()["purelib"]  # torch, pydantic, ...: on PYTHONPATH, so no .pth (no editable finder)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), deps] + site.getsitepackages())}
    proc = subprocess.run([str(bare / "bin" / "python"), "bench/throughput/run.py", "--dry", "--skip-import-check",
                           "--sides", "megatron", "--megatron-micro-batch-sizes", "4", "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "compiled (" in proc.stdout and "keywords as expected" in proc.stdout
    assert (tmp_path / "work" / "megatron-local-bf16_mb4.compiled" / "train.py").is_file()
