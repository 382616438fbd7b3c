"""The fast-sampling suite's scoring: Wilson interval, batching by prompt length, token agreement,
the targets beside the measured ratios, the table for docs/generate.md."""

from __future__ import annotations

import json

import pytest

from bench.sampling import fast_kit


def test_wilson_interval_matches_the_closed_form_values():
    lo, hi = fast_kit.wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    lo, hi = fast_kit.wilson(0, 500)
    assert lo == 0.0 and hi == pytest.approx(0.00762, abs=1e-4)  # not the Wald interval's [0, 0]
    assert fast_kit.wilson(0, 0) == (0.0, 1.0)


def test_eval_batches_hold_one_prompt_length_each_and_cover_every_prompt_once():
    lengths = [5, 7, 5, 5, 7, 9, 5]
    batches = fast_kit.eval_batches(lengths, 2)
    assert sorted(i for b in batches for i in b) == list(range(7))
    assert all(len({lengths[i] for i in b}) == 1 and len(b) <= 2 for b in batches)
    assert batches == [[0, 2], [3, 6], [1, 4], [5]]


def test_timing_prompts_take_the_commonest_length_and_cycle_it_to_the_batch():
    lengths = [5, 7, 5, 7, 7]
    assert fast_kit.timing_prompts(lengths, 2) == [1, 3]
    assert fast_kit.timing_prompts(lengths, 5) == [1, 3, 4, 1, 3]


def test_agreement_counts_equal_positions_and_equal_rows():
    a = [[1, 2, 3, 4], [5, 6, 7, 8]]
    b = [[1, 2, 3, 4], [5, 0, 7, 0]]
    got = fast_kit.agreement(a, b)
    assert got == {"tokens": 6 / 8, "rows": 0.5, "n": 2}


def test_accuracy_cuts_at_eos_and_uses_the_checker():
    decode = lambda ids: "".join(f" {i}" for i in ids)  # noqa: E731
    match = lambda completion, answer: completion.strip() == answer.strip()  # noqa: E731
    got = fast_kit.accuracy([[1, 2, 0, 9], [3, 0, 0, 0], [4, 4, 4, 4]], [" 1 2", " 3", " 5"], decode, 0, match)
    assert got["correct"] == 2 and got["n"] == 3
    assert got["interval_95"] == list(fast_kit.wilson(2, 3))


def _summary() -> dict:
    def t(tps: float) -> dict:
        return {"timing": {str(b): {"tokens_per_second": tps * b, "forward_passes": 10} for b in (1, 8, 32)}}
    s = {"dlmspec/none/low_confidence": t(100), "dlmspec/none/threshold": t(200), "dlmspec/prefix/threshold": t(600),
         "dlmspec/dual/threshold": t(450), "hf-loop/none/low_confidence": t(50), "hf-loop/none/threshold": t(150),
         "fast-dllm/prefix/threshold": t(500), "fast-dllm/dual/threshold": t(500)}
    s["dlmspec/none/low_confidence"]["accuracy"] = {"accuracy": 0.40, "interval_95": [0.36, 0.44], "n": 512}
    s["dlmspec/prefix/threshold"]["accuracy"] = {"accuracy": 0.42, "interval_95": [0.38, 0.46], "n": 512}
    s["dlmspec/dual/threshold"]["accuracy"] = {"accuracy": 0.30, "interval_95": [0.26, 0.34], "n": 512}
    return s


def test_targets_put_each_measured_ratio_beside_its_goal():
    got = {t["target"]: t for t in fast_kit.targets(_summary(), [1, 8, 32])}
    first = got["batch 1: dlmspec/none/low_confidence over hf-loop/none/low_confidence"]
    assert first["measured"] == pytest.approx(2.0) and first["goal"] == ">= 1.5" and first["met"] is True
    second = got["batch 1: dlmspec/none/threshold over hf-loop/none/threshold"]
    assert second["measured"] == pytest.approx(200 / 150) and second["met"] is False  # 1.33 < 1.5
    assert got["batch 32: dlmspec/prefix/threshold over dlmspec/none/low_confidence"]["measured"] == pytest.approx(6.0)
    assert got["batch 32: dlmspec/dual/threshold over dlmspec/none/low_confidence"]["met"] is False  # 4.5 < 5
    assert got["batch 8: dlmspec/prefix/threshold over fast-dllm/prefix/threshold"]["met"] is True  # 600 > 500
    assert got["batch 8: dlmspec/dual/threshold over fast-dllm/dual/threshold"]["met"] is False  # 450 < 500
    assert got["accuracy of dlmspec/prefix/threshold within dlmspec/none/low_confidence's 95% interval"]["met"] is True
    assert got["accuracy of dlmspec/dual/threshold within dlmspec/none/low_confidence's 95% interval"]["met"] is False
    # a configuration that was not measured gives no verdict, not a pass
    assert got["accuracy of dlmspec/prefix/factor within dlmspec/none/low_confidence's 95% interval"]["met"] is None


def test_table_has_a_row_per_measured_configuration_and_the_targets():
    values = {"settings": {"batches": [1, 8, 32]}, "configs": _summary()}
    values["targets"] = fast_kit.targets(values["configs"], [1, 8, 32])
    table = fast_kit.render_table(values)
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) == len(_summary())
    assert rows[0].startswith("| `dlmspec/none/low_confidence` | 100 (10) | 800 (10) | 3200 (10) | 0.400 [0.360, 0.440]")
    assert "| batch 32: dlmspec/dual/threshold over dlmspec/none/low_confidence | 4.50 | >= 5 | no |" in table
    json.dumps(values)  # what the report writes is JSON


def test_table_command_prints_a_results_settings_line_and_its_table(tmp_path, capsys):
    from bench.sampling import fast_measure

    values = {"settings": {"batches": [1, 8, 32], "gen_length": 64, "steps": 64, "block_length": 16, "threshold": 0.9,
                           "factor": 1.0, "held_out": 512}, "configs": _summary()}
    values["targets"] = fast_kit.targets(values["configs"], [1, 8, 32])
    path = tmp_path / "2026-12-06-h100-fast.json"
    path.write_text(json.dumps({"date": "2026-12-06", "hardware": {"gpu": "h100", "gpu_name": "NVIDIA H100 80GB HBM3"},
                                "values": values}))
    assert fast_measure.main(["table", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Measured 2026-12-06 on NVIDIA H100 80GB HBM3 (`2026-12-06-h100-fast.json`): gen_length 64")
    assert fast_kit.render_table(values) in out


def test_speedups_give_each_configuration_over_each_implementations_own_baseline():
    got = fast_kit.speedups(_summary(), [1, 32])
    assert got["dlmspec/prefix/threshold"]["32"]["dlmspec/none/low_confidence"] == pytest.approx(6.0)
    assert got["dlmspec/prefix/threshold"]["1"]["hf-loop/none/low_confidence"] == pytest.approx(12.0)
    assert got["fast-dllm/dual/threshold"]["1"]["fast-dllm/none/low_confidence"] is None  # not measured


def test_compile_configurations_run_only_when_asked_and_after_all_the_others():
    plain = [c.name for c in fast_kit.configs_of("dlmspec")]
    assert not any(n.endswith("+compile") for n in plain)
    both = [c.name for c in fast_kit.configs_of("dlmspec", with_compile=True)]
    assert both[:len(plain)] == plain
    assert both[len(plain):] == ["dlmspec/none/low_confidence+compile", "dlmspec/prefix/threshold+compile",
                                 "dlmspec/dual/threshold+compile"]
    assert [c.name for c in fast_kit.configs_of("dlmspec", ["dlmspec/dual/threshold+compile"])] == \
        ["dlmspec/dual/threshold+compile"]
