"""bench/demos/bd3lm.py without a GPU: ``--dry`` lists the two compiles (same data, steps and batch),
the two trainings and the evaluation; the training values are read from a metrics.jsonl."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from bench_scripts import load_script  # noqa: E402


def test_dry_lists_both_trainings_at_equal_data_and_the_evaluation(tmp_path, capsys) -> None:
    bench = load_script(ROOT / "bench" / "demos" / "bd3lm.py", "bd3lm_bench")
    assert bench.main(["--dry", "--work-dir", str(tmp_path / "w"), "--train-iters", "40"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["compile-mdm", "compile-bd3lm", "train-mdm", "train-bd3lm",
                                                      "evaluate", "result"]
    for kind in ("mdm", "bd3lm"):
        line = next(x for x in lines if x.startswith(f"compile-{kind}"))
        assert "train.train_iters=40" in line and "demo-train_text_document" in line
    assert "model.transformer_impl=\"local\"" in lines[0].replace("'", "")
    assert lines[-1].endswith("-bd3lm-vs-mdm.json")


def test_training_values_are_read_from_the_metrics(tmp_path) -> None:
    bench = load_script(ROOT / "bench" / "demos" / "bd3lm.py", "bd3lm_bench")
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"event": "train", "iteration": i, "loss": 10.0 - i / 10, "tokens_per_s": 1000.0 + i,
             "peak_mem_gib": 3.0 + i / 100} for i in range(5, 105, 5)]
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n", encoding="utf-8")
    got = bench.train_values(metrics)
    assert got["loss_curve"][0] == [5, 9.5] and got["final_loss"] == rows[-1]["loss"]
    assert got["tokens_per_s_median"] == 1000.0 + 77.5  # the median of iterations 55 .. 100
    assert got["peak_mem_gib"] == 4.0


def test_the_kernel_control_adds_mdm_on_flex_attention_and_splits_the_ratio(tmp_path, capsys) -> None:
    bench = load_script(ROOT / "bench" / "demos" / "bd3lm.py", "bd3lm_bench")
    assert bench.main(["--dry", "--work-dir", str(tmp_path / "w"), "--kernel-control"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["compile-mdm", "compile-bd3lm", "compile-mdm-flex", "train-mdm",
                                                      "train-bd3lm", "train-mdm-flex", "evaluate", "result"]
    flex = next(x for x in lines if x.startswith("compile-mdm-flex")).replace("'", "")
    assert "demo-dlm.toml" in flex and 'model.attention_backend="flex"' in flex and "mdm-flex/checkpoints" in flex
    got = bench.throughput_ratios({"mdm": {"tokens_per_s_median": 200.0}, "bd3lm": {"tokens_per_s_median": 150.0},
                                   "mdm-flex": {"tokens_per_s_median": 180.0}, "train_iters": 10})
    assert got == {"tokens_per_s_ratio_bd3lm_over_mdm": 0.75, "tokens_per_s_ratio_mdm_flex_over_mdm": 0.9,
                   "tokens_per_s_ratio_bd3lm_over_mdm_flex": 150.0 / 180.0}


def test_each_run_sets_the_compiled_plan_beside_the_measured_step_time_and_memory(tmp_path) -> None:
    """The planned figures are those of the plan.json the compile step writes with this checkout's
    planner (block diffusion's rows reaching the output layer included), for the GPU measured."""
    from dlmspec.plan import make_plan
    from dlmspec.render.compile import render
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load

    bench = load_script(ROOT / "bench" / "demos" / "bd3lm.py", "bd3lm_bench")
    resolved = resolve(load(ROOT / "specs" / "demo-bd3lm.toml", ['cluster.gpu="h100"']).spec)
    compiled = tmp_path / "bd3lm.compiled"
    compiled.mkdir()
    (compiled / "plan.json").write_text(render(resolved, "spec.toml")["plan.json"], encoding="utf-8")
    planned = bench.planned_values(compiled)
    plan = make_plan(resolved)
    assert planned["gpu"] == "h100"
    assert planned["step_time_s"] == pytest.approx(plan.time.step_seconds, rel=1e-12)
    assert planned["peak_allocated_gib"] == pytest.approx(plan.memory.peak.peak_allocated_bytes / 2 ** 30, rel=1e-9)
    measured = {"step_time_s_median": 2 * plan.time.step_seconds, "peak_mem_gib": planned["peak_allocated_gib"]}
    assert bench.planned_vs_measured(planned, measured) == pytest.approx({"step_time": 2.0, "peak_allocated": 1.0})
    assert bench.planned_values(tmp_path / "missing") is None and bench.planned_vs_measured(None, measured) is None


def test_the_step_time_and_both_mfus_are_read_from_the_metrics(tmp_path) -> None:
    bench = load_script(ROOT / "bench" / "demos" / "bd3lm.py", "bd3lm_bench")
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"event": "train", "iteration": i, "loss": 1.0, "tokens_per_s": 1.0, "peak_mem_gib": 1.0,
             "step_time_s": 0.1 + i / 1000, "mfu": 0.3, "data_mfu": 0.2} for i in range(5, 105, 5)]
    metrics.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    got = bench.train_values(metrics)
    assert got["step_time_s_median"] == 0.1 + 77.5 / 1000
    assert got["mfu_median"] == 0.3 and got["data_mfu_median"] == 0.2
