"""`dlmspec generate --cuda-graph/--no-cuda-graph` sets [generate] cuda_graph from the command line
(over the checkpoint's and --spec's), is recorded with its origin, and on a CPU says why no graph ran."""

from __future__ import annotations

import json

import pytest

from dlmspec.cli import main
from tiny_ckpt import tiny_runs  # noqa: F401 (a fixture)


pytestmark = pytest.mark.shared_data  # the tiny runs read the offline data kit (tests/kits/shared_kit.py)


def _run(capsys, *args: str):
    capsys.readouterr()
    code = main(["generate", *args, "--device", "cpu", "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("flag, value", [("--no-cuda-graph", False), ("--cuda-graph", True)])
def test_the_flag_sets_cuda_graph_and_is_recorded_as_the_flags(tiny_runs, capsys, flag, value):
    code, env = _run(capsys, str(tiny_runs["mdm"][0]), "--prompt", "Hi", "--steps", "2", flag)
    assert code == 0, env
    result = env["result"]
    assert result["settings"]["cuda_graph"] is value and result["origins"]["cuda_graph"] == "flag"
    fallback = result["cuda_graph_fallback"]
    if value:  # asked for on a CPU: the forward runs eager, and the output says why
        assert fallback and "CUDA" in fallback, fallback
    else:
        assert fallback is None


def test_without_the_flag_cuda_graph_is_the_default_on(tiny_runs, capsys):
    code, env = _run(capsys, str(tiny_runs["mdm"][0]), "--prompt", "Hi", "--steps", "2")
    assert code == 0, env
    assert env["result"]["settings"]["cuda_graph"] is True and env["result"]["origins"]["cuda_graph"] == "default"


def test_the_printed_summary_says_why_no_graph_ran_on_a_cpu(tiny_runs, capsys):
    """Without --json the settings line is followed by the fallback the JSON records."""
    capsys.readouterr()
    code = main(["generate", str(tiny_runs["mdm"][0]), "--prompt", "Hi", "--steps", "2", "--device", "cpu",
                 "--no-stream"])
    out = capsys.readouterr().out
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("cuda_graph: "))
    assert "CUDA" in line
    assert "kv_cache:" not in out  # a diffusion model: no AR KV cache was asked of it
