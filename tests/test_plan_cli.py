"""``dlmspec plan``: tables, JSON, ``--set``, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dlmspec.cli import app

ROOT = Path(__file__).resolve().parent.parent
DEMO = str(ROOT / "specs" / "demo-dlm.toml")
runner = CliRunner()


def test_plan_table():
    result = runner.invoke(app, ["plan", DEMO])
    assert result.exit_code == 0, result.output
    for word in ("memory per GPU", "weights", "peak allocated", "tokens/s", "MFU", "GPU-hours", "loss: fused_linear"):
        assert word in result.output
    # megatron's cross entropy: the [T, V] logits are the largest transient and get a row
    result = runner.invoke(app, ["plan", DEMO, "--set", 'kernels.cross_entropy="megatron"'])
    assert result.exit_code == 0, result.output
    assert "loss_logits" in result.output and "loss: megatron" in result.output


def test_plan_json_and_set():
    result = runner.invoke(app, ["plan", DEMO, "--json", "--set", "train.micro_batch_size=8",
                                 "--set", "train.global_batch_size=32"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ok"] is True
    assert data["layout"]["micro_batch_size"] == 8 and data["layout"]["num_microbatches"] == 4
    assert data["memory"]["peak_bytes"] > data["memory"]["peak_allocated_bytes"] > 0
    assert data["parameters"]["total"] == 152712960


def test_invalid_spec_exits_2_with_issues():
    result = runner.invoke(app, ["plan", DEMO, "--json", "--set", "parallel.tensor_model_parallel_size=5"])
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert any(i["key"] == "parallel.tensor_model_parallel_size" for i in data["issues"])


def test_spec_that_does_not_fit_prints_plan_and_exits_2():
    result = runner.invoke(app, ["plan", DEMO, "--json", "--set", "train.micro_batch_size=1024",
                                 "--set", "train.global_batch_size=1024", "--set", "train.seq_length=1024"])
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["ok"] is False and data["memory"]["fits"] is False
    assert [i["rule"] for i in data["issues"] if i["severity"] == "error"] == ["memory-fits"]


def test_search_prints_set_lines():
    result = runner.invoke(app, ["plan", DEMO, "--search", "--top", "2", "--set", "cluster.gpus_per_node=2",
                                 "--set", "train.global_batch_size=64"])
    assert result.exit_code == 0, result.output
    assert "#1: --set parallel.tensor_model_parallel_size=" in result.output


def test_search_finding_nothing_exits_2():
    # A 45B-parameter variant of the demo on one L40S: no layout holds its weights.
    result = runner.invoke(app, ["plan", DEMO, "--search", "--json", "--set", "cluster.gpu=l40s",
                                 "--set", "model.hidden_size=16384", "--set", "model.ffn_hidden_size=65536",
                                 "--set", "model.num_attention_heads=128"])
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["ok"] is False and data["search"]["top"] == []
    assert data["search"]["message"].startswith("no layout fits")
