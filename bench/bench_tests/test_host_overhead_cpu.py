"""bench/sampling/host_overhead.py on CPU at its --dry sizes: per sampling path it records the
per-step forward and sampler times, the syncs and ops outside the model (and inside, for scale), the
tokens do not change under the counting, and beside the sampler of 9284fc4 (--reference) the tokens are
the same with fewer ops and syncs; a bad flag exits 2 naming it and what works."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.harness  # a harness end to end on CPU: the bench tier (CONTRIBUTING.md)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "sampling" / "host_overhead.py"


def test_dry_run_records_each_paths_host_work_per_step(tmp_path) -> None:
    out = tmp_path / "host.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--reference", "--paths", "rl,threshold_dual",
                          "--out", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dry"] and result["batch"] == 4 and result["layers"] == 2
    assert sorted(result["paths"]) == ["rl", "threshold_dual"]
    rl, thr = result["paths"]["rl"], result["paths"]["threshold_dual"]
    assert rl["steps"] == 8 and rl["forward_passes"] == 8 and rl["cache"] == "none"
    assert rl["config"]["temperature"] == 1.0 and rl["config"]["eos_token_id"] == 62
    assert thr["cache"] == "dual" and 2 <= thr["steps"] <= 16
    for r in (rl, thr):
        assert r["same_tokens_under_counting"]
        assert r["forward_ms_per_step"] > 0 and r["wall_ms_per_call"] > 0
        assert 0 < r["launch_ops_per_step"] <= r["ops_per_step"] < r["model_ops_per_step"]
        assert sum(r["sampler_ops_by_name"].values()) == round(r["ops_per_step"] * r["steps"])
    # threshold decoding tests the block's end once a step; the fixed-step rollout does not sync per step
    assert thr["syncs_per_step"] >= 1.0 > rl["syncs_per_step"]
    # --reference: the sampler of 9284fc4 on the same model gives the same tokens with more ops and syncs
    assert sorted(result["reference"]) == ["rl", "threshold_dual"]
    for name, r in result["paths"].items():
        old = result["reference"][name]
        assert r["same_tokens_as_reference"] and r["tokens_sha"] == old["tokens_sha"]
        assert r["launch_ops_per_step"] < old["launch_ops_per_step"] and r["syncs_per_step"] < old["syncs_per_step"]


def test_an_unknown_path_exits_2_naming_the_known_ones(tmp_path) -> None:
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--paths", "rl,nope"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 2
    assert "--paths nope" in res.stderr and "low_confidence" in res.stderr and "Traceback" not in res.stderr


def test_profile_records_where_a_steps_host_time_goes(tmp_path) -> None:
    out = tmp_path / "host.json"
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--profile", "--paths", "low_confidence_prefix",
                          "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    prof = json.loads(out.read_text())["paths"]["low_confidence_prefix"]["profile"]
    # on CPU there is no device time; the host table names the model's matmuls among its costliest ops
    assert prof["device_ms_per_step"] is None and prof["device_busy_share"] is None and prof["top_device"] == []
    assert prof["profiled_wall_ms_per_step"] > 0 and 1 <= len(prof["top_host"]) <= 10
    ms = [t["ms"] for t in prof["top_host"]]
    assert ms == sorted(ms, reverse=True) and all(t["calls"] >= 1 for t in prof["top_host"])
    assert any(t["name"] in ("aten::mm", "aten::addmm", "aten::linear") for t in prof["top_host"])
    assert "profiled:" in res.stdout
