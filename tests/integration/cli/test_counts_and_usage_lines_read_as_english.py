"""Printed counts agree with their noun ("1 GPU", "2 GPUs", "1 microbatch") and usage lines name
arguments in capitals, never as a brace placeholder (``{output}``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEMO = str(ROOT / "specs" / "demo-dlm.toml")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlmspec.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_count_agrees_with_its_noun() -> None:
    from dlmspec.wording import count, plural

    assert count(1, "GPU") == "1 GPU" and count(8, "GPU") == "8 GPUs"
    assert count(1, "microbatch") == "1 microbatch" and count(4, "microbatch") == "4 microbatches"
    assert count(1200, "step") == "1,200 steps" and count(0, "rule") == "0 rules"
    assert plural("is", 1) == "is" and plural("is", 3) == "are"


def test_validate_summary_of_one_gpu_says_gpu_and_microbatch_in_the_singular() -> None:
    out = _cli("validate", DEMO)
    assert out.returncode == 0, out.stderr
    text = " ".join((out.stdout + out.stderr).split())
    assert "1 GPU as TP" in text and "1 microbatch per step" in text, text
    assert "(s)" not in text and "(es)" not in text and "1 GPUs" not in text


def test_world_size_error_of_one_gpu_says_gpu_and_node() -> None:
    out = _cli("validate", DEMO, "--set", "parallel.tensor_model_parallel_size=2")
    text = " ".join((out.stdout + out.stderr).split())
    assert out.returncode == 2
    assert "1 GPU (1 node x 1) is not divisible" in text, text


@pytest.mark.parametrize("command, argument", [("new", "OUTPUT"), ("compile", "SPEC"), ("submit", "TARGETS...")])
def test_usage_lines_name_arguments_in_capitals(command: str, argument: str) -> None:
    out = _cli(command, "--help")
    usage = next(line for line in out.stdout.splitlines() if "Usage:" in line)
    assert "{" not in usage and usage.split()[-1] == argument, usage
