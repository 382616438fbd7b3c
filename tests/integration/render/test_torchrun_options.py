"""launch.sbatch's torchrun options against every torch the runtime extra allows (torch >= 2.6).

The option lists in dlmspec/render/torchrun_options.json were extracted from each published
wheel's torch/distributed/run.py by bench/launch/torchrun_options.py (its command is in the file).
Options the script always passes must be in every list; the optional ones are passed only when
the node's ``torchrun --help`` lists them, which is checked by running the script with a fake
torchrun whose help is each version's list (and with the installed torch's real help).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dlmspec.render.launch_env import TORCHRUN_OPTIONAL, TORCHRUN_REQUIRED, torchrun_options, torchrun_probe
from slurm_kit import ROOT, nul_list, render, run_script

VERSIONS = torchrun_options()
TWO_NODES = {"cluster.nodes": 2, "cluster.gpus_per_node": 4}


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def always_passed(text: str) -> set[str]:
    """The ``--options`` launch.sbatch gives torchrun unconditionally: those after ``"$python"``
    in the per-node srun command and those on the ``exec ... torch.distributed.run`` line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('srun --nodes="$nnodes" --ntasks-per-node=1'))
    end = next(i for i in range(start, len(lines)) if lines[i].rstrip().endswith("&"))
    block = "\n".join(lines[start:end + 1])
    after_python = block.split('"$python"', 1)[1]
    execs = [line.split("torch.distributed.run", 1)[1] for line in lines
             if 'exec "$0" -m torch.distributed.run' in line]
    found = set()
    for part in [after_python, *execs]:
        found |= set(re.findall(r"(?<![\w-])(--[a-z][a-z_-]*)", part))
    return found


def test_committed_lists_cover_each_torch_release_the_extra_allows_and_name_their_command() -> None:
    import json

    data = json.loads((ROOT / "dlmspec" / "render" / "torchrun_options.json").read_text())
    assert data["command"].startswith("python bench/launch/torchrun_options.py --out ")
    minors = {_minor(v) for v in VERSIONS}
    assert {(2, m) for m in range(6, 14)} <= minors
    for version, options in VERSIONS.items():
        assert {"--nnodes", "--nproc-per-node", "--master-addr"} <= set(options), version


@pytest.mark.parametrize("version", sorted(VERSIONS, key=lambda v: tuple(map(int, v.split(".")))))
def test_options_always_passed_to_torchrun_are_in_every_torch_version(version: str) -> None:
    flags = always_passed(render(**TWO_NODES))
    assert flags == set(TORCHRUN_REQUIRED)
    missing = sorted(flags - set(VERSIONS[version]))
    assert not missing, f"torch {version}'s torchrun has no {missing}"


def fake_help(options: list[str]) -> str:
    """``--help`` text of an argparse parser with ``options`` (the format torchrun prints)."""
    parser = argparse.ArgumentParser(prog="torchrun")
    for option in options:
        if option != "--help":
            parser.add_argument(option)
    parser.add_argument("training_script")
    return parser.format_help()


@pytest.mark.parametrize("version", ["2.6.0", "2.8.0", "2.10.0", "2.13.0"])
def test_torchrun_gets_only_the_options_its_help_lists(version: str, tmp_path: Path) -> None:
    options = VERSIONS[version]
    help_file = tmp_path / "torchrun-help.txt"
    help_file.write_text(fake_help(options))
    result, log, _ = run_script(render(**TWO_NODES), tmp_path, env={"FAKE_TORCHRUN_HELP": str(help_file)})
    assert result.returncode == 0, result.stderr
    argv = nul_list(log / "python.argv")
    assert argv[:2] == ["-m", "torch.distributed.run"]
    program = argv.index(str(tmp_path / "train.py"))
    passed = {a.split("=", 1)[0] for a in argv[2:program]}
    assert passed <= set(options), f"torch {version} lacks {sorted(passed - set(options))}"
    for name in TORCHRUN_OPTIONAL:
        assert (name in passed) == (name in options), (version, name)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_probe_reads_the_installed_torchrun_help_and_its_list_matches_the_committed_one() -> None:
    import torch
    import torch.distributed.run as run

    spec = importlib.util.spec_from_file_location("torchrun_options", ROOT / "bench" / "launch" / "torchrun_options.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    version = torch.__version__.split("+")[0]
    installed = tool.options(Path(run.__file__).read_text())
    if version in VERSIONS:
        assert installed == VERSIONS[version]
    script = torchrun_probe(120) + 'printf "%s\\n" "${optional[@]}"\n'
    out = subprocess.run(["bash", "-c", script, sys.executable], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    expected = [n for n in TORCHRUN_OPTIONAL if n in installed]
    assert [line.split("=", 1)[0] for line in out.stdout.split()] == expected


@pytest.mark.parametrize("version, expected", [("2.8.0", "TERM"), ("2.13.0", "USR1")])
def test_time_limit_signal_reaches_the_training_processes_on_every_torchrun(version: str, expected: str,
                                                                           tmp_path: Path) -> None:
    """SIGUSR1 to the batch script reaches torchrun's workers: as SIGUSR1 where torchrun forwards it
    (``--signals-to-handle``, torch 2.10+), as SIGTERM (which torchrun forwards, and on which the
    runtime saves too) where it does not; the job then exits with the requeue code."""
    import signal
    import time

    from dlmspec.errors import REQUEUE_EXIT_CODE

    help_file = tmp_path / "torchrun-help.txt"
    help_file.write_text(fake_help(VERSIONS[version]))
    proc, log, _ = run_script(render(**TWO_NODES), tmp_path, background=True,
                              env={"FAKE_TORCHRUN_HELP": str(help_file), "FAKE_PY_WAIT": "1"})
    try:
        deadline = time.monotonic() + 30
        while not (log / "python.started").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (log / "python.signal").read_text().strip() == expected, stderr
    assert proc.returncode == REQUEUE_EXIT_CODE, stderr
    assert (log / "requeue").read_text().split() == ["4242"], stderr
