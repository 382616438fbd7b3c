"""Where a plan's numbers come from (issue #21): the layer path and calibration each plan names,
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

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "specs" / "demo-dlm.toml"
SFT = ROOT / "specs" / "megadlms-1.7b-sft.toml"  # transformer_impl = "auto", no feature needing a path
runner = CliRunner()


def _plan(path: Path, *overrides: str):
    return make_plan(resolve(load(path, list(overrides)).spec))


def test_local_plan_names_its_path_and_calibration():
    prov = _plan(DEMO).to_dict()["provenance"]
    assert prov["layer_path"] == "local+sdpa"
    assert prov["calibration"]["status"] == "calibrated" and prov["calibration"]["fitted_on"] == "local+sdpa"
    assert "dlmspec/plan/calibration.py" in prov["calibration"]["text"]
    assert prov["outside_measured"] == [] and prov["paths"] is None  # the demo is what was measured


def test_te_plan_uses_the_local_constants_and_says_uncalibrated():
    plan = _plan(DEMO, 'model.transformer_impl="transformer_engine"', "objective.variable_length_prob=0.0")
    prov = plan.to_dict()["provenance"]
    assert plan.layout.impl == "transformer_engine" and "transformer_engine" not in CALIBRATED_PATHS
    assert plan.calibration == DEFAULT_CALIBRATION  # no constant invented for TE
    assert prov["calibration"]["status"] == "uncalibrated" and prov["calibration"]["fitted_on"] == "local+sdpa"
    assert prov["calibration"]["text"].startswith("UNCALIBRATED for transformer_engine")


def test_auto_plans_both_paths():
    resolved = resolve(load(SFT).spec)
    assert resolved.transformer_impl == "auto"
    plan = make_plan(resolved)
    paths = plan.to_dict()["provenance"]["paths"]
    assert [p["layer_path"] for p in paths] == ["transformer_engine", "local+sdpa"]
    assert [p["calibration"] for p in paths] == ["uncalibrated", "calibrated"]
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
    (['precision.fp8="hybrid"', 'model.transformer_impl="transformer_engine"',
      "objective.variable_length_prob=0.0"], "precision.fp8"),
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
    assert "calibration: local+sdpa: dlmspec/plan/calibration.py, fitted on 70 local+sdpa runs" in result.output
    assert "outside what the calibration runs measured" not in result.output
    result = runner.invoke(app, ["plan", str(SFT)])
    text = " ".join(result.output.split())
    assert 'transformer_impl = "auto" plans both layer paths:' in text
    assert "where Transformer Engine imports on the cluster: transformer_engine" in text and "(uncalibrated)" in text
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


# --- documents the current error (issue #21), not a target ---------------------------------
# The TE path's only measurements (one H200, Qwen3-1.7B-architecture DLM, untied, seq 4096, 4
# microbatches per step, issue #21): bf16 micro batch 8 40.9k tokens/s, micro batch 12 41.7k and
# 127.6 GiB allocated; fp8 (delayed) micro batch 8 50.6k. Planned with the local constants the
# plan is off by more than issue #21's targets (5% memory, 15% step time) and calls micro batch 12
# "does not fit". This test pins that error so the "uncalibrated" marker is seen to be needed;
# when TE calibration runs land (CALIBRATED_PATHS gains "transformer_engine"), replace it by
# their held-out comparison. No constant is derived from these numbers.
QWEN3_TE = [
    "data.mock=true", "data.train=[]", "data.valid=[]", 'data.tokenizer.type="NullTokenizer"',
    "data.tokenizer.vocab_size=151934", 'model.preset="qwen3-1.7b"', "model.num_layers=28", "model.hidden_size=2048",
    "model.ffn_hidden_size=6144", "model.num_attention_heads=16", "model.num_query_groups=8", "model.kv_channels=128",
    "model.vocab_size=151936", "model.max_position_embeddings=4096", "model.untie_embeddings_and_output_weights=true",
    "objective.mask_token_id=151935", "objective.variable_length_prob=0.0", "train.seq_length=4096",
    'model.transformer_impl="transformer_engine"',
]


def _qwen3_te(micro_batch: int, fp8: str):
    return _plan(DEMO, *QWEN3_TE, f"train.micro_batch_size={micro_batch}",
                 f"train.global_batch_size={4 * micro_batch}", f'precision.fp8="{fp8}"')


def test_documents_the_current_te_error_uncalibrated():
    GiB = 1024**3
    mb12 = _qwen3_te(12, "none")
    assert mb12.to_dict()["provenance"]["calibration"]["status"] == "uncalibrated"
    assert mb12.shape.total_params == 2031739904
    assert not mb12.fits  # planned ~143 GiB; it ran
    assert mb12.peak_allocated_bytes > 1.05 * 127.6 * GiB  # memory error above the 5% target
    for plan, measured, worse_than in ((_qwen3_te(8, "none"), 40.9e3, 0.10), (mb12, 41.7e3, 0.10),
                                       (_qwen3_te(8, "hybrid"), 50.6e3, 0.15)):
        assert plan.time.tokens_per_second / measured - 1 > worse_than  # planned faster than it ran
