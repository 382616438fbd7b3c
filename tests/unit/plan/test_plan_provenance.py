"""Where a plan's numbers come from: the layer path and calibration each plan names,
both layer paths for ``transformer_impl = "auto"``, and the warning for a configuration outside
what the calibration runs measured (``dlmspec/plan/provenance.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_scripts import load_script
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.plan import make_plan
from dlmspec.plan.calibration import CALIBRATED_PATHS, DEFAULT_CALIBRATION, LOCAL_MEASURED
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "specs" / "demo-dlm.toml"
SFT = ROOT / "specs" / "megadlms-1.7b-sft.toml"  # transformer_impl = "auto", no feature needing a path
runner = CliRunner()


def _plan(path: Path, *overrides: str):
    return make_plan(resolve(load(path, list(overrides)).spec))


def test_local_plan_names_its_path_and_calibration():
    prov = _plan(DEMO).to_dict()["provenance"]
    assert prov["layer_path"] == "local+sdpa"
    assert prov["calibration"]["status"] == "calibrated" and prov["calibration"]["fitted_on"] == "local+sdpa"
    assert "calibrated on" in prov["calibration"]["text"] and "docs/planner-methods.md" in prov["calibration"]["text"]
    assert prov["outside_measured"] == [] and prov["paths"] is None  # the demo is what was measured


def test_te_plan_uses_its_own_calibration():
    plan = _plan(DEMO, 'model.transformer_impl="transformer_engine"', "objective.variable_length_prob=0.0")
    prov = plan.to_dict()["provenance"]
    assert plan.layout.impl == "transformer_engine" and "transformer_engine" in CALIBRATED_PATHS
    assert plan.calibration == CALIBRATED_PATHS["transformer_engine"][0] != DEFAULT_CALIBRATION
    assert prov["calibration"]["status"] == "calibrated" and prov["calibration"]["fitted_on"] == "transformer_engine"
    assert "calibrated on 12 transformer_engine runs on h200" in prov["calibration"]["text"]


def test_auto_plans_both_paths():
    resolved = resolve(load(SFT).spec)
    assert resolved.transformer_impl == "auto"
    plan = make_plan(resolved)
    paths = plan.to_dict()["provenance"]["paths"]
    assert [p["layer_path"] for p in paths] == ["transformer_engine", "local+sdpa"]
    assert [p["calibration"] for p in paths] == ["calibrated", "calibrated"]
    assert "cluster.gpu" in paths[0]["outside_measured"] and "cluster.gpu" in paths[1]["outside_measured"]
    te = make_plan(resolved, impl="transformer_engine")
    assert paths[0]["peak_bytes"] == int(round(te.peak_bytes))
    assert paths[0]["step_seconds"] == pytest.approx(te.time.step_seconds)
    assert paths[1]["step_seconds"] == pytest.approx(plan.time.step_seconds)
    assert paths[1]["tokens_per_second"] == pytest.approx(plan.time.tokens_per_second)
    # a path the spec's features decide is not "auto": one path only
    assert _plan(DEMO).to_dict()["provenance"]["paths"] is None


@pytest.mark.parametrize("overrides, key", [
    (["train.seq_length=8192", "model.max_position_embeddings=8192", "train.micro_batch_size=2",
      "train.global_batch_size=2"], "train.seq_length"),
    (["train.micro_batch_size=2", "train.global_batch_size=2"], "train.micro_batch_size"),
    (['cluster.gpu="h100"'], "cluster.gpu"),
    # the TE path's own range (Qwen3-1.7B-sized runs, 2.0B-3.1B parameters): the 153M demo is outside it
    (['precision.fp8="hybrid"', 'model.transformer_impl="transformer_engine"',
      "objective.variable_length_prob=0.0"], "model (parameters)"),
    (["model.num_layers=2"], "model (parameters)"),
    (["model.num_experts=16", "model.moe_router_topk=2", "train.micro_batch_size=16",
      "train.global_batch_size=16"], "model.num_experts"),
    (["cluster.gpus_per_node=4", "parallel.tensor_model_parallel_size=4"], "parallel.tensor_model_parallel_size"),
])
def test_outside_the_measured_range_is_named(overrides, key):
    prov = _plan(DEMO, *overrides).to_dict()["provenance"]
    keys = [e["key"] for e in prov["outside_measured"]]
    assert key in keys, keys
    entry = prov["outside_measured"][keys.index(key)]
    assert entry["measured"]  # the range in words


def test_cli_prints_the_calibration_and_warning_lines():
    result = runner.invoke(app, ["plan", str(DEMO)])
    assert result.exit_code == 0, result.output
    assert "calibration: local+sdpa: calibrated on 70 local+sdpa runs" in result.output
    assert "outside what the calibration runs measured" not in result.output
    result = runner.invoke(app, ["plan", str(SFT)])
    text = " ".join(result.output.split())
    assert 'transformer_impl = "auto" plans both layer paths:' in text
    assert "where Transformer Engine imports on the cluster: transformer_engine" in text
    # each path's line names what lies outside its own runs (TE: one H200; local: up to 2 GPUs)
    te_line = text.split("where Transformer Engine imports on the cluster: transformer_engine", 1)[1].split("where it does not", 1)[0]
    assert "calibrated; outside its runs:" in te_line and "cluster.gpu" in te_line
    assert "warning: outside what the calibration runs measured" in text and "cluster.gpu = 'h100'" in text
    result = runner.invoke(app, ["plan", str(DEMO), "--json", "--set", 'cluster.gpu="h100"'])
    data = json.loads(result.stdout)["result"]
    assert [e["key"] for e in data["provenance"]["outside_measured"]] == ["cluster.gpu"]


def test_measured_range_matches_the_committed_runs():
    """LOCAL_MEASURED is what bench/results/ holds: a new calibration run that widens a range
    fails here until calibration.py's literals are updated (they are what plan warns against)."""
    pytest.importorskip("numpy")
    calibrate = load_script(ROOT / "bench" / "plan" / "calibrate.py", "plan_calibrate_range")
    runs, _ = calibrate.read_runs(calibrate.RESULTS)
    got = calibrate.measured_range(runs, "local+sdpa")
    assert got == {k: getattr(LOCAL_MEASURED, k) for k in got}


# --- the TE path against its calibration runs ----------------------------------
# bench/calibration/te/h200/te-matrix-2026-12-02.json and calibration_te_h200_session9.json: the 9
# configurations of bench/plan/te_matrix.json on one H200, 3 of them held out of the fit (their plans
# were committed before the runs, bench/plan/te_holdout_predictions.json). the targets: peak
# allocated within 5%, step time within 15%, on every configuration (median of its records).


def _te_records():
    by_name = {}
    for path in sorted(p for p in (ROOT / "bench" / "calibration" / "te" / "h200").glob("*.json") if p.name != "fit.json"):
        for run in json.loads(path.read_text())["runs"]:
            by_name.setdefault(run["name"], []).append(run)
    return by_name


def _median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def test_te_plans_are_within_the_targets_on_every_calibrated_configuration():
    entries = {e["name"]: e for e in json.loads((ROOT / "bench" / "plan" / "te_matrix.json").read_text())}
    records = _te_records()
    assert set(records) == set(entries)  # every configuration measured
    assert sum(e["held_out"] for e in entries.values()) == 3
    for name, entry in entries.items():
        # planned as they ran: Liger did not import beside TE (calibrate.TE_RECORD_FUSED_LINEAR_IMPL)
        plan = _plan(ROOT / entry["base"], *entry["overrides"], 'kernels.fused_linear_impl="torch"')
        assert plan.to_dict()["provenance"]["calibration"]["status"] == "calibrated"
        allocated = _median([r["peak_allocated_bytes"] for r in records[name]])
        step = _median([r["step_seconds"] for r in records[name]])
        assert abs(plan.peak_allocated_bytes / allocated - 1) <= 0.05, name
        assert abs(plan.time.step_seconds / step - 1) <= 0.15, name


def test_te_measured_range_matches_the_committed_runs():
    pytest.importorskip("numpy")
    from dlmspec.plan.calibration import TE_MEASURED

    calibrate = load_script(ROOT / "bench" / "plan" / "calibrate.py", "plan_calibrate_te_range")
    runs, _ = calibrate.read_runs(calibrate.RESULTS)
    got = calibrate.measured_range([r for r in runs if not r.held_out], "transformer_engine")
    assert got == {k: getattr(TE_MEASURED, k) for k in got}


# --- the fp8 recipe: printed, and a dimension of the measured range ----------------------
THROUGHPUT = ROOT / "bench" / "throughput" / "qwen3-1.7b-mdm.toml"  # the TE calibration's model and sequence
TE_FP8 = ('model.transformer_impl="transformer_engine"', 'precision.fp8="hybrid"')


def test_fused_rope_on_te_is_outside_the_te_runs():
    """The TE calibration ran with RoPE unfused (specs/demo-dlm.toml's kernels): the throughput
    spec's default fused RoPE on TE is named, and RoPE as the runs had it is not."""
    from dlmspec.plan.calibration import TE_MEASURED

    assert TE_MEASURED.rope_fusion == (False,) and LOCAL_MEASURED.rope_fusion == (False, True)
    te = 'model.transformer_impl="transformer_engine"'
    keys = [e["key"] for e in _plan(THROUGHPUT, te).to_dict()["provenance"]["outside_measured"]]
    assert keys == ["kernels.apply_rope_fusion"], keys
    entry = _plan(THROUGHPUT, te).to_dict()["provenance"]["outside_measured"][0]
    assert entry["value"] is True and entry["measured"] == "unfused RoPE only"
    unfused = _plan(THROUGHPUT, te, "kernels.apply_rope_fusion=false").to_dict()["provenance"]["outside_measured"]
    assert unfused == []
    # the local path measured both
    local = _plan(THROUGHPUT, 'model.transformer_impl="local"').to_dict()["provenance"]["outside_measured"]
    assert "kernels.apply_rope_fusion" not in [e["key"] for e in local]


def test_te_measured_range_names_the_fp8_recipes_of_its_runs():
    from dlmspec.plan.calibration import TE_MEASURED

    assert TE_MEASURED.fp8_recipes == ("delayed", "tensorwise")
    assert LOCAL_MEASURED.fp8_recipes == ()  # no fp8 run on the local path


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_a_measured_fp8_recipe_is_inside_the_range(recipe):
    prov = _plan(THROUGHPUT, *TE_FP8, f'precision.fp8_recipe="{recipe}"').to_dict()["provenance"]
    assert "precision.fp8_recipe" not in [e["key"] for e in prov["outside_measured"]]


@pytest.mark.parametrize("recipe", ["blockwise", "mxfp8"])
def test_an_unmeasured_fp8_recipe_is_outside_the_range(recipe):
    data = _plan(THROUGHPUT, *TE_FP8, f'precision.fp8_recipe="{recipe}"').to_dict()
    assert data["layout"]["fp8_recipe"] == recipe
    entries = {e["key"]: e for e in data["provenance"]["outside_measured"]}
    assert entries["precision.fp8_recipe"] == {"key": "precision.fp8_recipe", "value": recipe,
                                               "measured": "fp8 recipes delayed and tensorwise"}


def test_bf16_plans_have_no_recipe_and_no_recipe_warning():
    data = _plan(THROUGHPUT, 'model.transformer_impl="transformer_engine"', 'precision.fp8_recipe="mxfp8"').to_dict()
    assert data["layout"]["fp8_recipe"] is None
    assert "precision.fp8_recipe" not in [e["key"] for e in data["provenance"]["outside_measured"]]


def test_cli_prints_the_fp8_recipe_and_warns_outside_the_measured_recipes():
    # (mxfp8 is refused on an H200 by validate's rules: it needs Blackwell)
    args = ["plan", str(THROUGHPUT)] + [a for o in TE_FP8 + ('precision.fp8_recipe="blockwise"',) for a in ("--set", o)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "fp8 (recipe blockwise)" in text
    assert "precision.fp8_recipe = 'blockwise' (measured: fp8 recipes delayed and tensorwise)" in text


def test_one_gpu_range_is_singular():
    prov = _plan(THROUGHPUT, 'model.transformer_impl="transformer_engine"', "cluster.gpus_per_node=2",
                 "train.global_batch_size=16").to_dict()["provenance"]
    entries = {e["key"]: e for e in prov["outside_measured"]}
    assert entries["cluster (GPUs)"]["measured"] == "1 GPU"


def test_te_plans_of_the_throughput_runs():
    """The four TE runs of README's speed table (fused RoPE, which no calibration
    run had, and Liger's fused linear cross entropy, where the calibration runs had PyTorch row
    chunks): held out of the fit, they check both. Step time and peak allocated within 5% of the
    measured (docs/planner.md, *Kernels on TE*)."""
    record = json.loads((ROOT / "bench" / "results" / "gpu_runs_h200_te_calibration_peers_profile" / "peers" / "call4_megatron"
                         / "throughput_2026-12-02_peers.json").read_text())
    attempts = record["megatron"]["attempts"]
    assert len(attempts) == 4 and all(a["status"] == "ok" for a in attempts)
    for attempt in attempts:
        mb = attempt["micro_batch_size"]
        fp8 = '"hybrid"' if attempt["precision"] == "fp8" else '"none"'
        plan = _plan(THROUGHPUT, 'model.transformer_impl="transformer_engine"', f"precision.fp8={fp8}",
                     f"train.micro_batch_size={mb}", f"train.global_batch_size={attempt['global_batch_size']}")
        name = attempt["variant"], mb
        assert abs(plan.time.step_seconds / attempt["median_step_time_s"] - 1) <= 0.05, name
        measured = attempt["peak_mem_gib"] * 1024**3
        assert abs(plan.peak_allocated_bytes / measured - 1) <= 0.05, name
