"""dlmspec.backends.launch.check, the CPU check mode of launch.sbatch, without SLURM: its checks on
synthetic ranks, and real gloo runs under torchrun (2 processes), including the simulated
long job's checkpoint on SIGUSR1 and resume."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from dlmspec.backends.launch.check import PORT_BASE, REQUEUE_EXIT_CODE, check_world, parse_args  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def facts(nodes: int, per_node: int, *, job: str | None = "7", env: dict[str, str] | None = None) -> list[dict]:
    out = []
    for node in range(nodes):
        for local in range(per_node):
            rank = node * per_node + local
            out.append({
                "rank": rank, "world_size": nodes * per_node, "local_rank": local, "local_world_size": per_node,
                "group_rank": node, "master_addr": "n0", "master_port": str(PORT_BASE + 7), "hostname": f"n{node}",
                "pid": 1, "env": dict(env or {}), "secrets_set": {},
                "slurm": {"SLURM_JOB_ID": job, "SLURMD_NODENAME": f"n{node}", "SLURM_NODEID": str(node),
                          "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local)},
            })
    return out


def args(nodes: int, per_node: int, launcher: str = "torchrun") -> argparse.Namespace:
    return argparse.Namespace(nodes=nodes, nproc_per_node=per_node, launcher=launcher)


def total(n: int) -> float:
    return n * (n + 1) / 2


def test_check_world_accepts_a_correct_launch() -> None:
    for launcher in ("torchrun", "srun"):
        assert check_world(facts(2, 4, env={"A": "x y"}), args(2, 4, launcher), {"A": "x y"}, total(8)) == []


def test_check_world_finds_each_problem() -> None:
    f = facts(2, 2)
    assert any("world size 4" in e for e in check_world(f, args(2, 4), {}, total(4)))
    broken = facts(2, 2)
    broken[3]["rank"] = 2
    assert any("ranks are [0, 1, 2, 2]" in e for e in check_world(broken, args(2, 2), {}, total(4)))
    broken = facts(2, 2)
    broken[1]["local_rank"] = 0
    assert any("node n0: local ranks [0, 0]" in e for e in check_world(broken, args(2, 2), {}, total(4)))
    broken = facts(1, 2)
    broken[0]["master_port"] = broken[1]["master_port"] = "29500"
    assert any("MASTER_PORT=29500, expected 10007" in e for e in check_world(broken, args(1, 2), {}, total(2)))
    broken = facts(2, 1)
    for item in broken:
        item["master_addr"] = "n1"
    assert any("MASTER_ADDR=n1, expected rank 0's node n0" in e for e in check_world(broken, args(2, 1), {}, total(2)))
    assert any("A=None, the spec sets 'v'" in e for e in check_world(facts(1, 2), args(1, 2), {"A": "v"}, total(2)))
    assert any("all-reduce" in e for e in check_world(facts(1, 2), args(1, 2), {}, 2.0))
    broken = facts(1, 2)
    broken[1]["slurm"]["SLURM_PROCID"] = "0"
    assert any("SLURM_PROCID" in e for e in check_world(broken, args(1, 2, "srun"), {}, total(2)))
    broken = facts(2, 1)
    broken[1]["group_rank"] = 0
    assert any("node rank 0 differs from SLURM_NODEID 1" in e for e in check_world(broken, args(2, 1), {}, total(2)))
    assert any("processes ran on 1 node" in e for e in check_world(facts(1, 2), args(2, 1), {}, total(2)))


def test_parse_args_refuses_bad_combinations(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--nodes", "1", "--nproc-per-node", "2", "--launcher", "torchrun"]
    for bad in ([], ["--report", "r.json", "--train", "--state-dir", "d"], ["--train"],
                ["--report", "r", "--expect-env", "NOVALUE"]):
        with pytest.raises(SystemExit) as info:
            parse_args(common + bad)
        assert info.value.code == 2
    assert parse_args(common + ["--report", "r.json"]).report == Path("r.json")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(*check_args: str, env: dict[str, str] | None = None) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=0",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}",
            "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
            "-m", "dlmspec.backends.launch.check", "--nodes", "1", "--nproc-per-node", "2", "--launcher", "torchrun",
            "--timeout", "60", *check_args]


def run_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def test_env_check_under_torchrun(tmp_path: Path) -> None:
    value = "a b $(touch pwned) 'q' \"d\"\nline"
    report = tmp_path / "report.json"
    result = subprocess.run(torchrun("--report", str(report), "--expect-env", f"DLM_X={value}"), cwd=tmp_path,
                            env=run_env(tmp_path, DLM_X=value, WANDB_API_KEY="never-in-report-1"),
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["ok"] and data["errors"] == [] and data["world_size"] == 2 and data["allreduce_sum"] == 3.0
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert all(r["env"]["DLM_X"] == value and r["secrets_set"]["WANDB_API_KEY"] for r in data["ranks"])
    assert "never-in-report-1" not in report.read_text()
    assert not list(tmp_path.glob("pwned*"))


def test_train_mode_checkpoints_on_usr1_and_resumes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    command = torchrun("--train", "--state-dir", str(state), "--steps", "30", "--step-seconds", "0.1")
    proc = subprocess.Popen(command, cwd=tmp_path, env=run_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        progress = state / "progress.json"
        while not (progress.exists() and json.loads(progress.read_text())["step"] >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)  # torchrun forwards it to both workers
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert f"exit {REQUEUE_EXIT_CODE} for requeue" in stderr
    marker = json.loads((state / "checkpoint.json").read_text())
    assert 2 <= marker["step"] < 30 and marker["runs"][0]["ended"] == "checkpoint on SIGUSR1"
    result = subprocess.run(command, cwd=tmp_path, env=run_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((state / "report.json").read_text())
    assert report["ok"] and report["final_step"] == 30 and report["resumed"]
    assert [(r["start_step"], r["end_step"]) for r in report["runs"]] == [(0, marker["step"]), (marker["step"], 30)]


def test_missing_launcher_variables_are_one_line_errors(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from dlmspec.backends.launch.check import main

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    code = main(["--report", "r.json", "--nodes", "1", "--nproc-per-node", "2", "--launcher", "srun"])
    err = capsys.readouterr().err
    assert code == 1 and "check: error: RANK is not set" in err and "Traceback" not in err


@pytest.mark.parametrize("content, why", [
    ("[" * 100_000 + "]" * 100_000, "nests"),
    ("not json", "not valid JSON"),
    ('{"step": -3, "runs": []}', "not a checkpoint marker"),
    ('{"step": 4, "runs": "x"}', "not a checkpoint marker"),
    (None, "character device"),
])
def test_a_checkpoint_marker_that_is_not_one_is_refused(tmp_path: Path, content, why) -> None:
    from dlmspec.backends.launch.check import MarkerRefused, read_marker

    marker = tmp_path / "checkpoint.json"
    if content is None:
        marker.symlink_to("/dev/zero")
    else:
        marker.write_text(content)
    with pytest.raises(MarkerRefused, match=why):
        read_marker(marker)
    assert read_marker(tmp_path / "none.json") is None
    (tmp_path / "ok.json").write_text('{"step": 4, "runs": [{"ended": "completed"}]}')
    assert read_marker(tmp_path / "ok.json")["step"] == 4
