"""launch.sbatch on a real SLURM cluster: Debian's slurm-wlm and munge, one node on loopback
(tests/slurm/start-cluster.sh), jobs in the CPU check mode.

* ``dlmspec submit --check env`` of a compiled spec: the job's processes (2 on one node, via
  torchrun or one srun task each) rendezvous over gloo, check world size, ranks, the rendezvous
  host and port and the environment the spec asked for (hostile values included), and write a
  report that the test reads; the job name with quotes and ``$(...)`` arrives intact.
* ``sbatch --test-only`` accepts the multi-node scripts of every spec in specs/ (partition
  "multinode", whose extra nodes exist only in the configuration).
* Preemption: ``scancel --signal=USR1 --batch`` (what ``--signal=B:USR1@N`` delivers before the
  time limit) makes the simulated job write its checkpoint marker and exit 85; the batch script
  requeues the job; its second run resumes from the marker and completes.

Skipped with the reason when slurmctld is not installed or the tests do not run as root. The
cluster is started if it is not running and stopped at the end if this module started it.
Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Iterator

import pytest

from bundled_specs_kit import single_specs

from dlmspec.spec.load import load
from dlmspec.resolve import resolve
from dlmspec.cli.submit import submit
from dlmspec.render.sbatch import render_sbatch
from spec_kit import write_toml

ROOT = Path(__file__).resolve().parents[3]
START = ROOT / "tests" / "slurm" / "start-cluster.sh"
STOP = ROOT / "tests" / "slurm" / "stop-cluster.sh"
CHECK_SPEC = ROOT / "tests" / "slurm" / "check-spec.toml"
SPECS = single_specs()  # a sweep is several specs: tests/integration/cli/test_sweep.py compiles each member
#: Nodes a job larger than the test cluster is judged at: its "multinode" partition is this host (2 CPUs) and 63
#: CLOUD nodes of 128 CPUs (tests/slurm/start-cluster.sh), so 32 fit every variant's request.
MULTINODE_NODES = 32
STATE_DIR = Path(os.environ.get("DLMSPEC_SLURM_DIR", "/tmp/dlmspec-slurm"))
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED"}

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(shutil.which("slurmctld") is None or shutil.which("munged") is None,
                       reason="SLURM is not installed (apt-get install -y slurm-wlm munge)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the test cluster's daemons must run as root"),
]


def _running(name: str) -> bool:
    """The pid file of daemon ``name`` names a live process of that name."""
    try:
        pid = int((STATE_DIR / f"{name}.pid").read_text().strip())
        return Path(f"/proc/{pid}/comm").read_text().strip() == name
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="module")
def cluster() -> Iterator[Path]:
    """Start (or reuse) the test cluster; point SLURM's clients at it; stop it afterwards if it
    was not running before."""
    was_running = _running("slurmctld") and _running("slurmd")
    result = subprocess.run(["bash", str(START), str(STATE_DIR)], capture_output=True, text=True, timeout=150)
    if result.returncode != 0:
        pytest.fail(f"start-cluster.sh failed:\n{result.stdout}\n{result.stderr}")
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "DLMSPEC_PYTHON", "PYTHONPATH")}
    os.environ["SLURM_CONF"] = str(STATE_DIR / "slurm.conf")
    os.environ["DLMSPEC_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), saved["PYTHONPATH"]]))
    try:
        yield STATE_DIR
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if not was_running:
            subprocess.run(["bash", str(STOP), str(STATE_DIR)], capture_output=True, timeout=60)


def slurm(*args: str, check: bool = True, timeout: float = 30) -> str:
    """Run a SLURM client command; a controller too busy to answer (a loaded CI machine) is asked
    again, up to five times, 2 s apart, before its error counts (a controller that exited stays unreachable)."""
    for _ in range(5):
        result = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
        if "Unable to contact slurm controller" not in result.stderr:
            break
        time.sleep(2)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result.stdout + result.stderr


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job ID`` as a dict (values may hold spaces: split at ' Key=')."""
    text = slurm("scontrol", "show", "job", job_id)
    fields: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("JobId=") and " JobName=" in line:
            fields["JobName"] = line.split(" JobName=", 1)[1]
            line = line.split(" JobName=", 1)[0]
        elif line.startswith(("Command=", "StdOut=", "StdErr=", "WorkDir=")):
            key, _, value = line.partition("=")
            fields[key] = value
            continue
        for key, value in re.findall(r"(\w[\w:/]*)=(\S*)", line):
            fields.setdefault(key, value)
    return fields


def wait_for(job_id: str, predicate, what: str, timeout: float, log: Path | None = None) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = job_fields(job_id)
        if predicate(fields):
            return fields
        time.sleep(0.5)
    slurm("scancel", job_id, check=False)
    text = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else "(no log)"
    raise AssertionError(f"job {job_id}: not {what} after {timeout:.0f} s: {fields.get('JobState')}\n{text}")


def done(fields: dict[str, str]) -> bool:
    return fields.get("JobState") in TERMINAL


def check_spec(slurm_table: dict[str, Any]) -> dict[str, Any]:
    """The bundled check spec with a [cluster.slurm] table for the test cluster (``slurm_table`` added)."""
    data = tomllib.loads(CHECK_SPEC.read_text())
    data["cluster"]["slurm"] = {"partition": "debug", "time": "00:10:00", "signal_seconds_before_end": 60,
                                **slurm_table}
    return data


HOSTILE_NAME = "chk \"$(touch pwned-1)\" 'q' `touch pwned-2` #x"
HOSTILE_VALUE = "v $(touch pwned-3) `touch pwned-4` 'q' \"d\" \\ ; x\nsecond line"


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_env_check_job(launcher: str, cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = write_toml(tmp_path / "spec.toml", check_spec({
        "launcher": launcher, "job_name": HOSTILE_NAME, "output": "logs/%j.out",
        "env": {"DLM_HOSTILE": HOSTILE_VALUE, "NCCL_DEBUG": "INFO"}}))
    jobs = submit([str(spec)], output=str(tmp_path / "compiled"), check_mode="env", echo=lambda line: None)
    job = jobs[0].job_id
    log = tmp_path / "logs" / f"{job}.out"
    fields = wait_for(job, done, "finished", 150, log)
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", log.read_text()[-4000:]
    assert fields["JobName"] == HOSTILE_NAME
    report = json.loads((tmp_path / f"dlmspec-check-{job}.json").read_text())
    assert report["ok"], report["errors"]
    assert report["world_size"] == 2 and report["launcher"] == launcher
    assert sorted((r["rank"], r["local_rank"]) for r in report["ranks"]) == [(0, 0), (1, 1)]
    assert {r["env"]["DLM_HOSTILE"] for r in report["ranks"]} == {HOSTILE_VALUE}
    assert {r["master_port"] for r in report["ranks"]} == {str(10000 + int(job) % 20000)}
    assert not list(tmp_path.rglob("pwned*"))


@pytest.mark.parametrize("path", SPECS, ids=[p.name for p in SPECS])
def test_sbatch_test_only_accepts_the_specs(path: Path, cluster: Path, tmp_path: Path) -> None:
    spec = load(path).spec.replace(**{"cluster.slurm.partition": "multinode"})
    if spec.cluster.nodes > MULTINODE_NODES:  # a larger job is judged at the partition's size (same script otherwise)
        spec = spec.replace(**{"cluster.nodes": MULTINODE_NODES})
    for variant in (spec, spec.replace(**{"cluster.nodes": max(2, spec.cluster.nodes),
                                          "cluster.slurm.launcher": "srun", "cluster.slurm.gpu_request": "gres"})):
        script = tmp_path / "launch.sbatch"
        script.write_text(render_sbatch(resolve(variant)))
        out = slurm("sbatch", "--test-only", str(script), check=False)
        assert "to start at" in out, f"{variant.cluster.nodes} node(s), {variant.cluster.slurm.launcher}: {out}"


def test_preemption_checkpoint_requeue_resume(cluster: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLMSPEC_CHECK_STEPS", "40")
    monkeypatch.setenv("DLMSPEC_CHECK_STEP_SECONDS", "0.25")
    spec = write_toml(tmp_path / "spec.toml", check_spec({"job_name": "preempt"}))
    job = submit([str(spec)], output=str(tmp_path / "compiled"), check_mode="train", echo=lambda line: None)[0].job_id
    state = tmp_path / f"dlmspec-check-{job}"
    log = tmp_path / f"slurm-preempt-{job}.out"
    progress = state / "progress.json"

    def stepped(fields: dict[str, str]) -> bool:
        assert not done(fields), log.read_text(errors="replace")[-4000:] if log.exists() else fields
        return progress.exists() and json.loads(progress.read_text())["step"] >= 3

    wait_for(job, stepped, "at step 3", 120, log)
    slurm("scancel", "--signal=USR1", "--batch", job)
    fields = wait_for(job, lambda f: f.get("Restarts") == "1" and f.get("JobState") in ("PENDING", "REQUEUED"),
                      "requeued", 90, log)
    marker = json.loads((state / "checkpoint.json").read_text())
    assert 3 <= marker["step"] < 40 and marker["runs"][0]["ended"] == "checkpoint on SIGUSR1"
    # SLURM holds a requeued job for about two minutes (BeginTime); release it sooner, but not in
    # the second of the requeue: slurmd compares whole-second times, so a launch credential made
    # in the same second as the old one's revocation is refused ("Job credential revoked" in
    # slurmctld.log; seen in CI when the release came 0.2 s after the requeue).
    slurm("scontrol", "update", f"JobId={job}", "StartTime=now+3")
    fields = wait_for(job, done, "finished after the requeue", 150, log)
    text = log.read_text(errors="replace")
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", text[-4000:]
    assert "requeueing job" in text and "resumed from the checkpoint marker" in text
    report = json.loads((state / "report.json").read_text())
    assert report["ok"] and report["final_step"] == 40 and report["resumed"]
    assert [(r["start_step"], r["end_step"], r["restart_count"]) for r in report["runs"]] == [
        (0, marker["step"], 0), (marker["step"], 40, 1)]
