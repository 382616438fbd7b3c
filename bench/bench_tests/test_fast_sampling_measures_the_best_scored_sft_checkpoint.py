"""The fast-sampling suite's model part is the RL chain's: pre-training 400 iterations, SFT up to
1,200 scored every 100, and the model measured is the SFT checkpoint with the highest validation
accuracy (not the run's latest, not one stopped at 0 %); its default time limits fit one 9-minute
GPU call with the measurement's ~90 s."""

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


def test_default_limits_fit_one_nine_minute_call_with_the_rl_chain_model(tmp_path):
    args = fast_sampling.parse_args(["--dry", *kit.suite_inputs(tmp_path)])
    assert args.train_iters == 400 and args.sft_iters == 1200 and args.sft_every == 100 and args.sft_seq_length == 24
    # H100 timings (bench/results/rl, bench/results/sampling): task + data + compiles ~40 s, pre-training 400
    # iterations ~90 s, SFT 1,200 iterations scored 12 times 152 s, both measurements ~90 s, report ~10 s
    assert args.train_timeout_s >= 90 and args.sft_timeout_s >= 152 + 15 and args.measure_reserve_s >= 90 + 40
    worst = 40 + args.train_timeout_s + args.sft_timeout_s + args.measure_reserve_s + 30  # report's reserve
    assert worst <= args.budget_s <= 540, worst
