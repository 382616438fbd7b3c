"""bench/devbox/gpu/te_calibration.sh's driver (bench/gpu/te_calibration.py) on CPU, and the committed TE matrix
and predictions (bench/plan/te_matrix.json, te_holdout_predictions.json): ``--dry`` compiles an entry and
checks its train.py flags; the one-at-a-time launch loop (each launch's own limit, the budget, the
repeats, the records calibrate.py reads) runs on stand-in launch scripts that log metrics.jsonl."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
sys.path.insert(0, str(ROOT / "bench" / "plan"))
import te_calibration  # noqa: E402

ENTRIES = json.loads((ROOT / "bench" / "plan" / "te_matrix.json").read_text())


def test_the_matrix_covers_the_te_and_fp8_cases() -> None:
    sets = [dict(o.split("=", 1) for o in e["overrides"]) for e in ENTRIES]
    assert len(ENTRIES) >= 8 and sum(e["held_out"] for e in ENTRIES) == 3
    assert all(s["model.transformer_impl"] == '"transformer_engine"' and s["train.seq_length"] == "4096" for s in sets)
    assert {s.get("precision.fp8_recipe") for s in sets if s.get("precision.fp8") == '"hybrid"'} == {'"delayed"', '"tensorwise"'}
    assert any("precision.fp8" not in s for s in sets)
    assert {int(s["train.micro_batch_size"]) for s in sets} >= {4, 8, 12, 16}
    assert {s.get("recompute.granularity") for s in sets} >= {'"selective"', '"full"'}
    assert any(s.get("model.moe_grouped_gemm") == "true" for s in sets)


def test_every_entry_has_a_prediction_made_at_a_commit() -> None:
    preds = json.loads((ROOT / "bench" / "plan" / "te_holdout_predictions.json").read_text())
    assert len(preds["made_at_commit"]) == 40 and not preds["planner_modified_at_commit"]
    by_name = {p["name"]: p for p in preds["predictions"]}
    assert set(by_name) == {e["name"] for e in ENTRIES}
    for e in ENTRIES:
        p = by_name[e["name"]]
        assert p["held_out"] == e["held_out"]
        assert p["planned_step_seconds"] > 0 and p["planned_peak_reserved_bytes"] >= p["planned_peak_allocated_bytes"] > 0


def test_dry_compiles_and_checks_the_flags(tmp_path: Path) -> None:
    dest = tmp_path / "tecal"
    assert te_calibration.main(["--dry", "--no-build", "--only", "te-fp8-tensorwise-mb16-full", "--dest", str(dest)]) == 0
    entry = next(e for e in ENTRIES if e["name"] == "te-fp8-tensorwise-mb16-full")
    text = (dest / entry["name"] / "train.py").read_text()
    assert te_calibration.check_flags(entry, text) == []
    assert te_calibration.check_flags(entry, text.replace("fp8_recipe='tensorwise'", "fp8_recipe='delayed'")) == [
        "fp8_recipe: want 'tensorwise', got 'delayed'"]
    bf16 = next(e for e in ENTRIES if e["name"] == "te-bf16-mb8")
    assert any(w.startswith("fp8:") for w in te_calibration.check_flags(bf16, text))


FAKE = textwrap.dedent('''\
    import json, sys, time
    from pathlib import Path
    name, runs, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    d = runs / name
    d.mkdir(parents=True, exist_ok=True)
    print("[dlmspec] stand-in: layer spec transformer_engine, cross entropy fused_linear (torch), RoPE unfused", flush=True)
    with open(d / "metrics.jsonl", "w") as f:
        f.write(json.dumps({"event": "host_launch", "host_launch_us": 9.0}) + "\\n")
        for i in range(1, 11):
            if mode == "hang" and i == 3:
                time.sleep(600)
            t = 5.0 if i <= 3 else 0.1 + 0.001 * i
            f.write(json.dumps({"event": "train", "iteration": i, "loss": 10.0 - i * 0.1, "step_time_s": t,
                                "tokens_per_s": 1000 / t, "peak_mem_gib": 2.0 + i / 100,
                                "peak_reserved_gib": 3.0}) + "\\n")
            f.flush()
    ''')


def test_the_launch_loop_on_stand_in_runs(tmp_path: Path, monkeypatch) -> None:
    runs, dest, out = tmp_path / "runs", tmp_path / "dest", tmp_path / "out"
    out.mkdir()
    (tmp_path / "fake.py").write_text(FAKE)
    entries = [dict(e, steps=10, warmup_steps=3) for e in ENTRIES[:3]]
    modes = {entries[0]["name"]: "ok", entries[1]["name"]: "hang", entries[2]["name"]: "ok"}
    for e in entries:
        (dest / e["name"]).mkdir(parents=True)
        (dest / e["name"] / "launch.sh").write_text(
            f"{sys.executable} {tmp_path / 'fake.py'} {e['name']} {runs} {modes[e['name']]}\n")
    monkeypatch.setattr(te_calibration, "RUNS", str(runs))
    monkeypatch.setattr(te_calibration, "STARTUP_S", 1.0)
    monkeypatch.setattr(te_calibration, "planned", lambda e: {"step_seconds": 0.05})
    t0 = time.time()
    records = te_calibration.run_all(entries, dest, out, budget_s=20, t_start=t0, min_start_s=0.5, repeats=1)
    assert time.time() - t0 < 20
    first, hung, third = records[:3]
    assert abs(first["step_seconds"] - 0.107) < 1e-9 and first["steps_measured"] == 7  # median of iterations 4..10
    assert first["peak_allocated_bytes"] == int(2.1 * 2**30) and first["peak_reserved_bytes"] == 3 * 2**30
    assert first["host_launch_us"] == 9.0 and first["impl"] == "transformer_engine" and first["exit_code"] == 0
    assert first["overrides"] == entries[0]["overrides"] and first["held_out"] is False
    assert first["fused_linear_backend"] == "torch"  # read from the runtime's start-up line in its log
    # the hung launch is killed at its own limit (1 s + 3 x 10 x 0.05 s): its two warm-up steps give
    # memory, no step time, and an error calibrate.py skips it by
    assert hung["killed_at_limit"] and hung["limit_s"] == 2.5 and hung["wall_s"] < 5
    assert hung["steps_measured"] == 0 and "step_seconds" not in hung and "killed at its limit" in hung["error"]
    assert len(hung["step_times"]) == 2
    assert third["exit_code"] == 0 and (out / f"{third['name']}.log").is_file()
    repeats = records[3:]
    assert repeats and all(r["repeat"] == 1 for r in repeats)
    assert (out / f"{repeats[0]['name']}.r1.log").is_file()
    # no time left: recorded as not run
    left = te_calibration.run_all(entries[:1], dest, out, budget_s=1, t_start=time.time() - 5, min_start_s=0.5, repeats=1)
    assert left == [{"name": entries[0]["name"], "held_out": entries[0]["held_out"], "impl": "transformer_engine",
                     "error": "not run: budget spent"}]


def test_calibrate_plans_a_te_record_with_the_backend_it_ran() -> None:
    """A record's ``fused_linear_backend`` decides how calibrate.py plans it; a TE record without
    one (the earlier GPU runs) is planned with PyTorch row chunks, as their logs say they ran."""
    import calibrate

    entry = next(e for e in ENTRIES if e["name"] == "te-bf16-mb8")
    base = {"name": entry["name"], "base": entry["base"], "overrides": entry["overrides"], "impl": "transformer_engine"}
    assert calibrate._resolve_run(base, {}).spec.kernels.fused_linear_impl == "torch"
    liger = calibrate._resolve_run({**base, "fused_linear_backend": "liger"}, {})
    assert liger.spec.kernels.fused_linear_impl == "liger"
    local = calibrate._resolve_run({**base, "impl": "local+sdpa"}, {})
    assert local.spec.kernels.fused_linear_impl == "auto"  # the rule is the TE records'
