"""Helpers shared by tests (moved from test_slurm.py): BASE, FAKEBIN, ROOT, env_dict, nul_list, render, run_script, spec_with."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from dlmspec.spec.load import load_text
from dlmspec.resolve import resolve
from dlmspec.render.sbatch import render_sbatch
from dlmspec.spec.models import Spec
from small_spec import SMALL_SPEC


ROOT = Path(__file__).resolve().parents[2]


FAKEBIN = ROOT / "tests" / "slurm" / "fakebin"


BASE = SMALL_SPEC


def spec_with(**changes) -> Spec:
    return load_text(BASE).spec.replace(**changes)


def render(**changes) -> str:
    return render_sbatch(resolve(spec_with(**changes)))


def run_script(text: str, tmp_path: Path, *, env: dict[str, str] | None = None, timeout: float = 60,
               background: bool = False):
    """Run ``text`` as a batch script with tests/slurm/fakebin first on PATH, in ``tmp_path/work``."""
    work = tmp_path / "work"
    log = tmp_path / "log"
    work.mkdir(exist_ok=True)
    log.mkdir(exist_ok=True)
    script = tmp_path / "launch.sbatch"
    script.write_text(text)
    full_env = {
        "PATH": f"{FAKEBIN}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node[07-08]",
        "SLURM_SUBMIT_DIR": str(work),
        "DLMSPEC_PYTHON": str(FAKEBIN / "fake-python"),
        "DLMSPEC_COMPILED_DIR": str(tmp_path),
        "FAKE_LOG": str(log),
        "FAKE_HOSTS": "node07 node08",
    }
    full_env.update(env or {})
    (tmp_path / "train.py").write_text("")
    command = ["bash", str(script)]
    if background:
        return subprocess.Popen(command, cwd=work, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True), log, work
    result = subprocess.run(command, cwd=work, env=full_env, capture_output=True, text=True, timeout=timeout)
    return result, log, work


def nul_list(path: Path) -> list[str]:
    """The NUL-terminated strings a fake tool recorded."""
    return [item.decode() for item in path.read_bytes().split(b"\0")[:-1]]


def env_dict(path: Path) -> dict[str, str]:
    out = {}
    for item in nul_list(path):
        key, _, value = item.partition("=")
        out[key] = value
    return out
