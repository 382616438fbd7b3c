"""``dlmspec plan``: tables, JSON, ``--set``, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from dlmspec.cli.commands import app

ROOT = Path(__file__).resolve().parents[3]
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
    report = json.loads(result.stdout)
    data = report["result"]
    assert report["ok"] is True and report["command"] == "plan"
    assert data["layout"]["micro_batch_size"] == 8 and data["layout"]["num_microbatches"] == 4
    assert data["memory"]["peak_bytes"] > data["memory"]["peak_allocated_bytes"] > 0
    assert data["parameters"]["total"] == 152712960


def test_invalid_spec_exits_2_with_findings():
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
    assert data["ok"] is False and data["result"]["memory"]["fits"] is False
    assert [i["rule"] for i in data["issues"]] == ["memory-fits"]


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
    assert data["ok"] is False and data["result"]["search"]["top"] == []
    assert data["result"]["search"]["message"].startswith("no layout fits")
    assert [i["rule"] for i in data["issues"]] == ["plan-search"] and data["issues"][0]["message"].startswith("no layout")


def test_search_of_a_spec_with_an_invalid_layout():
    # TP 5 on 8 GPUs divides neither the heads, nor the FFN, nor the GPUs: the search still runs
    # and reports those errors as the spec's own, apart from the layouts it found.
    args = ["plan", DEMO, "--search", "--set", "cluster.gpus_per_node=8", "--set", "parallel.tensor_model_parallel_size=5",
            "--set", "train.global_batch_size=64"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)["result"]
    issues = data["search"]["spec_layout_issues"]
    assert {"tp-divides-heads", "tp-divides-ffn"} <= {i["rule"] for i in issues}
    assert {"key": "model.ffn_hidden_size", "rule": "tp-divides-ffn"}.items() <= next(
        i for i in issues if i["rule"] == "tp-divides-ffn").items()
    assert data["search"]["top"] and all(c["tensor_model_parallel_size"] != 5 for c in data["search"]["top"])
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "The spec's own layout breaks" in text.output and "[tp-divides-ffn]" in text.output
    assert text.output.index("[tp-divides-ffn]") < text.output.index("#1: --set")


def test_search_marks_layouts_without_memory_headroom(tmp_path):
    spec = tmp_path / "qwen.toml"
    spec.write_text(
        '[model]\npreset = "qwen3-1.7b"\n[objective]\nkind = "ar"\n'
        "[train]\nmicro_batch_size = 1\nglobal_batch_size = 8\nseq_length = 4096\ntrain_iters = 10\n"
        '[data]\nmock = true\n[data.tokenizer]\ntype = "NullTokenizer"\nvocab_size = 151669\n'
        '[cluster]\ngpu = "a100-40gb"\ngpus_per_node = 2\n'
    )
    result = runner.invoke(app, ["plan", str(spec), "--search", "--top", "40"])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())  # rich wraps long lines at the terminal width
    assert "rank after those with headroom" in flat
    assert "! above 95% of the GPU's memory" in flat
    rows = [line for line in result.output.splitlines() if line.startswith("│")]
    marked = [i for i, row in enumerate(rows) if " !" in row]
    assert marked and rows and " !" not in rows[0] and marked == list(range(marked[0], len(rows)))


def test_search_set_lines_are_whole_at_any_terminal_width():
    result = runner.invoke(app, ["plan", DEMO, "--search", "--top", "1", "--set", "cluster.gpus_per_node=2",
                                 "--set", "train.global_batch_size=64"], env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("#1: "))
    assert "--set parallel.use_distributed_optimizer=" in line and "--set recompute.granularity=" in line


def test_impossible_layout_is_refused_before_planning():
    """A pipeline size of 10**9 (found by tests/unit/fuzz/test_fuzz_cli.py) is a topology error: plan exits 2
    with the issue, quickly, instead of planning 10**9 stages for the memory rule (MemoryError)."""
    for args in (["plan", DEMO], ["plan", DEMO, "--json"]):
        result = runner.invoke(app, [*args, "--set", "parallel.pipeline_model_parallel_size=1000000000"])
        assert result.exit_code == 2, result.output
        assert "pipeline_model_parallel_size" in result.output
        assert "Traceback" not in result.output and not isinstance(result.exception, MemoryError)
