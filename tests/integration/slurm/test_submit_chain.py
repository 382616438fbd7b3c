"""dlmspec submit: several spec arguments are a chain of stages (afterok, each on
the whole previous stage); a sweep's members are one stage of independent jobs side by side;
--after JOBID delays the first stage (every member of a sweep). Shown by --dry-run and run with
the fake sbatch."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CLI = [sys.executable, "-m", "dlmspec.cli"]
FAKEBIN = ROOT / "tests" / "slurm" / "fakebin"
SWEEP = str(ROOT / "specs" / "demo-sweep.py")


def _sbatch_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if "sbatch" in line and not line.startswith("#")]


def test_dry_run_sweep_members_side_by_side_then_the_next_stage(tmp_path):
    done = subprocess.run([*CLI, "submit", SWEEP, str(ROOT / "specs" / "demo-ar.toml"),
                           "--dry-run", "--after", "777"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = _sbatch_lines(done.stdout)
    assert done.stdout.startswith("job0=777")
    assert len(lines) == 7
    # every member of the sweep waits for --after's job only, not for the member before it
    assert all('"--dependency=afterok:$job0"' in line for line in lines[:6]), lines
    assert "compiled/demo-sweep/demo-dlm-mb8-none/launch.sbatch" in lines[0]
    # the next argument is the next stage: it waits for every member
    assert '"--dependency=afterok:$job1:$job2:$job3:$job4:$job5:$job6"' in lines[6]
    assert "side by side" in done.stdout


def test_dry_run_sweep_alone_has_no_dependencies(tmp_path):
    done = subprocess.run([*CLI, "submit", SWEEP, "--dry-run"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = _sbatch_lines(done.stdout)
    assert len(lines) == 6 and not any("--dependency" in line for line in lines)


def test_bad_after_is_refused(tmp_path):
    done = subprocess.run([*CLI, "submit", str(ROOT / "specs" / "demo-ar.toml"), "--dry-run", "--after", "x;y"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "--after" in done.stderr


def test_fake_sbatch_chains_after(tmp_path):
    env = dict(os.environ, PATH=f"{FAKEBIN}{os.pathsep}{os.environ['PATH']}", FAKE_LOG=str(tmp_path))
    done = subprocess.run([*CLI, "submit", str(ROOT / "specs" / "demo-ar.toml"), "--after", "41"],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "after job 41 succeeds" in done.stdout
    assert "--dependency=afterok:41" in (tmp_path / "sbatch.calls").read_text()


def test_fake_sbatch_submits_a_sweep_side_by_side_then_chains(tmp_path):
    env = dict(os.environ, PATH=f"{FAKEBIN}{os.pathsep}{os.environ['PATH']}", FAKE_LOG=str(tmp_path))
    done = subprocess.run([*CLI, "submit", SWEEP, str(ROOT / "specs" / "demo-ar.toml"), "--after", "41"],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (tmp_path / "sbatch.calls").read_text().splitlines()
    assert len(calls) == 7
    assert all(call.startswith("--parsable --dependency=afterok:41 compiled/demo-sweep/") for call in calls[:6]), calls
    assert calls[6].startswith("--parsable --dependency=afterok:1001:1002:1003:1004:1005:1006 compiled/demo-ar/")
