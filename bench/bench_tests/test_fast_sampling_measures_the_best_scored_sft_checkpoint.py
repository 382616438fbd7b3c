"""The fast-sampling suite's model part: pre-training 400 iterations, SFT 900 scored every 100, then
SFT on rows of the measured canvas; the model measured is the last stage's checkpoint with the highest
validation accuracy (not the run's latest, not one stopped at 0 %), the first stage's when the canvas
stage left none scored; its default time limits fit one 9-minute GPU call with the measurements' ~90 s."""

from __future__ import annotations

import json
import sys

from bench.bench_tests import fast_sampling_kit as kit
from bench.sampling import fast_sampling


def _stub(code: str) -> list:
    return [sys.executable, "-c", code]


def test_the_measured_model_is_the_sft_checkpoint_with_the_best_validation_score(tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    sft = work / "run-sft"
    scores = {100: 0.0, 200: 0.41, 300: 0.97, 400: 0.95, 500: 0.97, 600: 0.12}  # 700: scored, never saved
    make = (f"import json, pathlib; run = pathlib.Path({str(sft)!r}); scores = {scores!r}\n"
            "for it, acc in scores.items():\n"
            "    d = run / 'checkpoints' / f'iter_{it:07d}'; d.mkdir(parents=True); (d / 'dlmspec.json').write_text('{}')\n"
            "rows = [{'event': 'valid', 'iteration': it, 'generation_accuracy': acc} for it, acc in scores.items()]\n"
            "rows.append({'event': 'valid', 'iteration': 700, 'generation_accuracy': 0.99})\n"
            "(run / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\\n' for r in rows))\n")
    seen = tmp_path / "measure-argv.json"
    steps = [("train-sft", _stub(make), {}),
             ("measure-dlmspec", _stub(f"import json, sys; open({str(seen)!r}, 'w').write(json.dumps(sys.argv))")
              + ["--ckpt", str(sft / "checkpoints")], {})]
    monkeypatch.setattr(fast_sampling, "plan", lambda args, w, out: steps)
    rc = fast_sampling.main([*kit.suite_inputs(tmp_path), "--budget-s", "300", "--measure-reserve-s", "20"], probe=lambda p: None)
    assert rc in (0, 1)  # nothing measured for real: partial
    argv = json.loads(seen.read_text())
    assert argv[argv.index("--ckpt") + 1] == str(sft / "checkpoints" / "iter_0000500")  # 0.97, the latest of equals
    result = json.loads(next((tmp_path / "results" / "sampling").glob("*.json")).read_text())
    picked = result["values"]["steps"]["measured-model"]
    assert picked["iteration"] == 500 and picked["accuracy"] == 0.97 and len(picked["candidates"]) == 6
    assert "measured model:" in capsys.readouterr().out


def test_default_limits_fit_one_nine_minute_call(tmp_path):
    args = fast_sampling.parse_args(["--dry", *kit.suite_inputs(tmp_path)])
    assert args.train_iters == 400 and args.sft_iters == 900 and args.sft_every == 100 and args.sft_seq_length == 24
    assert args.sft_canvas_iters == 300 and args.sft_canvas_seq_length == 48
    # H100 timings (bench/results/sampling/2026-12-07-h100-fast-*-sft-canvas8.log and -logs.tgz): task + data +
    # compiles ~40 s, pre-training 400 iterations 101 s; an SFT run starts in ~41 s, then ~0.075 s an
    # iteration, ~1 s a scoring, ~2.5 s a save, ~6 s to exit; both measurements 92 s, report ~10 s
    def sft_s(iters, scores, saves):
        return 41 + 0.075 * iters + scores + 2.5 * saves + 6

    assert args.train_timeout_s >= 101 + 10 and args.measure_reserve_s >= 92 + 20
    assert args.sft_timeout_s >= sft_s(900, 9, 3) and args.sft_canvas_timeout_s >= sft_s(300, 3 * 2, 3)
    worst = 40 + args.train_timeout_s + args.sft_timeout_s + args.sft_canvas_timeout_s + args.measure_reserve_s + 30
    assert worst <= args.budget_s <= 560 - 15, worst  # gpu.sh: 560 s less the install (~15 s)


def test_the_canvas_stage_checkpoint_is_measured_when_it_was_scored(tmp_path, monkeypatch):
    work = tmp_path / "work"
    for run, scores in (("run-sft", {800: 0.9, 900: 0.95}), ("run-sft-canvas", {100: 0.6, 200: 0.8, 300: 0.7})):
        for it, acc in scores.items():
            d = work / run / "checkpoints" / f"iter_{it:07d}"
            d.mkdir(parents=True)
            (d / "dlmspec.json").write_text("{}")
        rows = [{"event": "valid", "iteration": it, "generation_accuracy": acc} for it, acc in scores.items()]
        (work / run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record: dict = {}
    cmd = fast_sampling.with_measured_checkpoint(["m", "--ckpt", "x"], work, record)
    assert cmd[-1] == str(work / "run-sft-canvas" / "checkpoints" / "iter_0000200")  # not the first stage's 0.95
    assert record["measured-model"]["run"] == "run-sft-canvas"
    (work / "run-sft-canvas" / "metrics.jsonl").write_text("")  # a canvas stage stopped before its first score
    cmd = fast_sampling.with_measured_checkpoint(["m", "--ckpt", "x"], work, record)
    assert cmd[-1] == str(work / "run-sft" / "checkpoints" / "iter_0000900")
    assert record["measured-model"]["run"] == "run-sft"
