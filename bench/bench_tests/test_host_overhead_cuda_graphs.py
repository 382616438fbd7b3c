"""bench/sampling/host_overhead.py --cuda-graph on CPU (--dry, the graph path on the CPU stand-in of a CUDA
graph, --stand-in-graphs): eager and graphs side by side per path with the tokens compared, the graph
cache's captures and replays recorded, d1's loop timed on the same model; without the stand-in on CPU the
graph run records why it ran eager; the stand-in outside its CPU check exits 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.harness  # a harness end to end on CPU: the bench tier (CONTRIBUTING.md)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "sampling" / "host_overhead.py"


def _run(tmp_path, *flags):
    out = tmp_path / "host.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--cuda-graph", "--paths", "rl,low_confidence_dual",
                          *flags, "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    return res, (json.loads(out.read_text()) if out.exists() else None)


def test_eager_and_graph_runs_are_side_by_side_with_the_same_tokens(tmp_path) -> None:
    res, result = _run(tmp_path, "--stand-in-graphs", "--d1-loop")
    assert res.returncode == 0, res.stderr[-3000:]
    assert result["cuda_graph"] and sorted(result["side_by_side"]) == ["low_confidence_dual", "rl"]
    for name, row in result["side_by_side"].items():
        assert row["same_tokens"] and row["cuda_graph_fallback"] is None
        assert row["eager_wall_ms_per_step"] > 0 and row["graphs_wall_ms_per_step"] > 0
        graphs = row["cuda_graphs"]
        assert graphs["captures"] >= 1 and graphs["replays"] > graphs["captures"]
        assert result["paths"][name]["cuda_graph"] is False and result["graphs"][name]["cuda_graph"] is True
    d1 = result["d1_loop"]
    assert d1["tokens_per_second"] > 0 and d1["dlmspec_over_d1_loop"] > 0


def test_on_cpu_without_the_stand_in_the_graph_run_records_why_it_ran_eager(tmp_path) -> None:
    res, result = _run(tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    row = result["side_by_side"]["rl"]
    assert row["same_tokens"] and "not on a CUDA device" in row["cuda_graph_fallback"] and row["cuda_graphs"] is None


def test_the_stand_in_outside_its_cpu_check_exits_2_naming_what_works(tmp_path) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--stand-in-graphs"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 2 and "--device cpu --cuda-graph" in res.stderr
