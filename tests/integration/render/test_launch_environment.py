"""launch.sh and launch.sbatch export the same training environment and run the same start
check (``train.py --check``) before any rank starts: both come from dlmspec.render.launch_env."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from dlmspec.render.compile import render as render_all
from dlmspec.resolve import resolve
from slurm_kit import FAKEBIN, env_dict, nul_list, run_script, spec_with

#: Variables launch.sbatch sets for the rendezvous only (launch.sh's torchrun --standalone does it).
RENDEZVOUS = {"MASTER_ADDR", "MASTER_PORT"}


def scripts(**changes) -> dict[str, str]:
    files = render_all(resolve(spec_with(**changes)), "spec.toml")
    return {name: files[name] for name in ("launch.sh", "launch.sbatch")}


def exports(text: str) -> dict[str, str]:
    """``NAME -> value text`` of every ``export NAME=value`` line."""
    out = {}
    for match in re.finditer(r"^\s*export ([A-Z_][A-Z0-9_]*)=(.*)$", text, flags=re.M):
        out[match.group(1)] = match.group(2)
    return out


@pytest.mark.parametrize("changes", [{}, {"parallel.tensor_model_parallel_size": 2},
                                     {"parallel.tensor_model_parallel_size": 2, "parallel.sequence_parallel": True}],
                         ids=["dp", "tp", "tp-sp"])
def test_launch_sh_and_sbatch_export_the_same_environment(changes: dict) -> None:
    texts = scripts(**changes)
    sh, sbatch = exports(texts["launch.sh"]), exports(texts["launch.sbatch"])
    sbatch = {k: v for k, v in sbatch.items() if k not in RENDEZVOUS}
    assert sh == sbatch
    assert {"TORCH_NCCL_AVOID_RECORD_STREAMS", "NCCL_DEBUG", "OMP_NUM_THREADS"} <= set(sbatch)
    assert ("CUDA_DEVICE_MAX_CONNECTIONS" in sbatch) == bool(changes)
    if changes:
        assert sbatch["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def run_launch_sh(text: str, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    compiled = tmp_path / "compiled"
    log = tmp_path / "log"
    compiled.mkdir(parents=True)
    log.mkdir(exist_ok=True)
    (compiled / "launch.sh").write_text(text)
    (compiled / "train.py").write_text("")
    full_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DLMSPEC_PYTHON": str(FAKEBIN / "fake-python"),
                "FAKE_LOG": str(log), **(env or {})}
    result = subprocess.run(["bash", str(compiled / "launch.sh")], cwd=tmp_path, env=full_env, capture_output=True,
                            text=True, timeout=60)
    return result, log


def test_both_launchers_run_the_start_check_with_the_training_environment(tmp_path: Path) -> None:
    texts = scripts(**{"parallel.tensor_model_parallel_size": 2})
    sh_result, sh_log = run_launch_sh(texts["launch.sh"], tmp_path / "sh")
    assert sh_result.returncode == 0, sh_result.stderr
    (tmp_path / "sbatch").mkdir()
    sb_result, sb_log, _ = run_script(texts["launch.sbatch"], tmp_path / "sbatch")
    assert sb_result.returncode == 0, sb_result.stderr
    for log, compiled in ((sh_log, tmp_path / "sh" / "compiled"), (sb_log, tmp_path / "sbatch")):
        assert nul_list(log / "python-check.argv") == [str(compiled / "train.py"), "--check"]
        for name in ("python-check.env", "python.env"):
            env = env_dict(log / name)
            assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1", (log, name)
            assert (env["TORCH_NCCL_AVOID_RECORD_STREAMS"], env["NCCL_DEBUG"], env["OMP_NUM_THREADS"]) == (
                "1", "WARN", "1"), (log, name)


def test_sbatch_start_check_refusal_launches_nothing(tmp_path: Path) -> None:
    text = scripts(**{"cluster.nodes": 2})["launch.sbatch"]
    result, log, _ = run_script(text, tmp_path, env={"FAKE_CHECK_EXIT": "2"})
    assert result.returncode == 2
    assert "train.py --check refused to start" in result.stderr
    assert (log / "python-check.argv").exists()
    assert not (log / "srun.argv").exists() and not (log / "python.argv").exists()


def test_caller_environment_values_are_kept(tmp_path: Path) -> None:
    text = scripts()["launch.sbatch"]
    result, log, _ = run_script(text, tmp_path, env={"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "8"})
    assert result.returncode == 0, result.stderr
    env = env_dict(log / "python.env")
    assert (env["NCCL_DEBUG"], env["OMP_NUM_THREADS"]) == ("INFO", "8")
