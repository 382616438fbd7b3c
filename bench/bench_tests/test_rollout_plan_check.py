"""The rollout plan check (bench/sampling/rollout_plan_check.py): each measured sampler call of a committed
result planned by today's planner; on the committed H100 results, the RL rollout and the default sampler
(low-confidence, no cache) are planned within 15 %."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "sampling"))
import rollout_plan_check as check  # noqa: E402

SPEC = ROOT / "specs" / "task-addition-dlm-rl-coupled.toml"
RESULTS = ROOT / "bench" / "results"
ROLLOUT = RESULTS / "rl" / "2026-12-07-h100-rollout-cuda-graphs-vs-d1.json"
SAMPLING = RESULTS / "sampling" / "2026-12-07-h100-fast-task-addition-dlm-sft-gen32-b1-8-32-cuda-graphs-undertrained.json"


def _timing(seconds: float, graphs: bool = True, passes: int = 8, cache: str = "none") -> dict:
    return {"seconds": seconds, "forward_passes": passes, "prompt_tokens": 16, "cuda_graph": graphs,
            "cuda_graph_fallback": None if graphs else "off", "cache_run": cache}


def test_each_graph_run_of_a_dlmspec_configuration_is_planned_at_its_batch_canvas_and_passes() -> None:
    doc = {"hardware": {"gpu": "h100"}, "values": {
        "settings": {"gen_length": 8, "block_length": 8, "temperature": 0.0},
        "configs": {"dlmspec/none/low_confidence": {"timing": {"1": _timing(0.01), "4": _timing(0.02, graphs=False)}},
                    "hf-loop/none/low_confidence": {"timing": {"1": _timing(0.5)}}}}}
    cases = check.sampling_cases(doc, SPEC, ["model.qk_layernorm=false"])
    assert [c["case"] for c in cases] == ["sampling dlmspec/none/low_confidence batch 1 (8 passes, canvas 24)"]
    expected = check.planned_rollout(SPEC, ["model.qk_layernorm=false", *check._rows_sets(1, 24, "h100"),
                                            "generate.gen_length=8", "generate.block_length=8", "generate.steps=8",
                                            "generate.temperature=0.0", 'generate.cache="none"',
                                            'generate.remasking="low_confidence"'])
    assert cases[0]["planned_s"] == pytest.approx(expected) and cases[0]["measured_s"] == 0.01
    assert cases[0]["planned_over_measured"] == pytest.approx(expected / 0.01)


def test_the_script_writes_every_case_its_command_and_the_largest_error(tmp_path: Path) -> None:
    doc = {"settings": {"gen_length": 8, "steps": 8, "block_length": 8, "temperature": 1.0,
                        "remasking": "low_confidence", "grpo_group_size": 8, "grpo_prompts_per_step": 2,
                        "prompt_lengths": [16]},
           "rows": 16, "tokens_per_second": {"dlmspec/rl-rollout": 16 * 8 / 0.02, "d1/whole-batch": 10.0}}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    out = tmp_path / "out.json"
    assert check.main(["--rollout", str(tmp_path / "r.json"), "--rl-spec", str(SPEC), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [c["case"].split(";")[1] for c in result["cases"]] == [" planned at the spec's seq_length)",
                                                                 " planned at the canvas 24)"]
    assert all(c["measured_s"] == pytest.approx(0.02) for c in result["cases"])
    assert result["largest_error"] == pytest.approx(max(abs(c["planned_over_measured"] - 1) for c in result["cases"]))
    assert result["command"].startswith("python bench/sampling/rollout_plan_check.py --rollout ")


@pytest.mark.gpu_results
def test_the_committed_h100_rollouts_are_planned_within_15_percent() -> None:
    if not (ROLLOUT.exists() and SAMPLING.exists()):
        pytest.skip("the committed H100 sampler results are absent")
    rl = check.rollout_cases(json.loads(ROLLOUT.read_text()), SPEC, ["model.qk_layernorm=false"], 7.17, "h100")
    at_spec = [c for c in rl if "spec's seq_length" in c["case"]]
    assert len(at_spec) == 2  # graphs and eager
    assert all(abs(c["planned_over_measured"] - 1) <= 0.15 for c in at_spec), at_spec
    sampling = check.sampling_cases(json.loads(SAMPLING.read_text()), SPEC, ["model.qk_layernorm=false"])
    default = [c for c in sampling if "dlmspec/none/low_confidence" in c["case"]]
    assert len(default) == 3  # batch 1, 8, 32
    assert all(abs(c["planned_over_measured"] - 1) <= 0.15 for c in default), default
