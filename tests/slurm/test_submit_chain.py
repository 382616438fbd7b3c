"""dlmspec submit chains (issue 19/22): several specs and a sweep's members in order with
afterok, --after JOBID for the first, shown by --dry-run and run with the fake sbatch."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "dlmspec.cli"]
FAKEBIN = ROOT / "tests" / "slurm" / "fakebin"


def test_dry_run_shows_the_chain_after_a_job(tmp_path):
    done = subprocess.run([*CLI, "submit", str(ROOT / "specs" / "demo-sweep.py"), str(ROOT / "specs" / "demo-ar.toml"),
                           "--dry-run", "--after", "777"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "sbatch" in line]
    assert done.stdout.startswith("job0=777")
    assert len(lines) == 7 and all(f"afterok:$job{i}" in line for i, line in enumerate(lines))
    assert "compiled/demo-sweep/demo-dlm-mb8-none/launch.sbatch" in lines[0]


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
