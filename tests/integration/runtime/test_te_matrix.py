"""bench/devbox/gpu/te_matrix.sh's driver (bench/gpu/te_matrix.py) on CPU: ``--dry`` compiles configurations
and checks their train.py flags; the launch loop (lanes, the save-kill-resume check, the loss
comparison and the JSON per configuration) runs on stand-in launch scripts that log losses."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import te_matrix  # noqa: E402


def test_dry_compiles_and_checks_the_flags(tmp_path: Path) -> None:
    dest = tmp_path / "te"
    # one configuration (each compiles in ~1 s; the first build_configs() imports megatron-core)
    assert te_matrix.main(["--dry", "--no-data", "--only", "te-fp8-blockwise", "--dest", str(dest)]) == 0
    text = (dest / "te-fp8-blockwise" / "train.py").read_text()
    assert te_matrix.check_flags("te-fp8-blockwise", text) == []
    wrong = te_matrix.check_flags("te-fp8-blockwise", text.replace("fp8_recipe='blockwise'", "fp8_recipe='delayed'"))
    assert wrong == ["fp8_recipe: want 'blockwise', got 'delayed'"]
    assert te_matrix.check_flags("te-bf16", text)  # fp8 present where te-bf16 wants none


def test_agreement() -> None:
    a = {i: 10.0 for i in range(1, 41)}
    b = {**a, 7: 10.1}
    r = te_matrix.agreement(a, b, rtol=0.02)
    assert r["agree"] and r["worst_iteration"] == 7 and abs(r["max_abs_diff"] - 0.1) < 1e-9
    assert not te_matrix.agreement(a, b, rtol=0.005)["agree"]
    short = te_matrix.agreement(a, {i: 10.0 for i in range(1, 30)}, rtol=0.02)
    assert not short["agree"] and short["missing"] == list(range(30, 41))
    assert te_matrix.agreement(a, {**a, 3: float("nan")}, rtol=0.02)["finite"] is False


FAKE = textwrap.dedent('''\
    import json, os, sys, time
    name, runs = sys.argv[1], sys.argv[2]
    scale = {"local-bf16-again": 1.001, "te-fp8-delayed": 1.02}.get(name, 1.0)
    run = os.path.join(runs, name)
    latest = os.path.join(run, "checkpoints", "latest")
    os.makedirs(run, exist_ok=True)
    start = 21 if os.path.exists(latest) else 1
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        for i in range(start, 41):
            f.write(json.dumps({"event": "train", "iteration": i, "loss": scale * 10 / (1 + 0.1 * i),
                                "peak_mem_gib": 12.0 + i / 100, "step_time_s": 0.1}) + "\\n")
            f.flush()
            if name == "te-resume" and i == 20 and start == 1:
                os.makedirs(os.path.dirname(latest), exist_ok=True)
                open(latest, "w").write("iter_0000020")
                time.sleep(2)  # killed by the driver meanwhile (else it goes on logging 21..40)
    ''')


def test_the_launch_loop_on_stand_in_runs(tmp_path: Path, monkeypatch) -> None:
    runs, dest, out = tmp_path / "runs", tmp_path / "dest", tmp_path / "out"
    out.mkdir()
    (tmp_path / "fake.py").write_text(FAKE)
    names = ["local-bf16", "local-bf16-again", "te-bf16", "te-fp8-delayed", "te-resume"]
    for n in names:
        (dest / n).mkdir(parents=True)
        # setsid: like torchrun's workers, the run is in a session of its own (a group signal misses it)
        (dest / n / "launch.sh").write_text(f"setsid {sys.executable} {tmp_path / 'fake.py'} {n} {runs}\n")
    monkeypatch.setattr(te_matrix, "RUNS", runs)
    results = {n: {"config": n, "compile_exit": 0} for n in names}
    t0 = time.time()
    floor = te_matrix.run_matrix(results, dest, out, deadline=time.time() + 60, width=2)
    assert time.time() - t0 < 30
    assert abs(floor - 0.001 / 1.001) < 1e-9  # local-bf16-again: 0.1% off
    for n in names:
        row = json.loads((out / f"{n}.json").read_text())
        assert len(row["losses"]) == 40, n
    row = json.loads((out / "te-fp8-delayed.json").read_text())
    assert row["memory_gib"]["peak_mem_gib"] == 12.4 and row["median_step_time_s"] == 0.1
    fp8 = row["agreement"]
    assert fp8["agree"] and fp8["tolerance"] == te_matrix.FP8_RTOL and fp8["against"] == "local-bf16"
    resume = json.loads((out / "te-resume.json").read_text())
    assert resume["resume"]["killed_after"] == "iter_0000020"
    assert resume["launches"]["te-resume.launch1"]["exit"] != 0 and resume["launches"]["te-resume.launch2"]["exit"] == 0
    assert resume["agreement"]["agree"] and resume["agreement"]["compared"] == 20  # steps 21..40 against te-bf16
    assert json.loads((out / "te-bf16.json").read_text())["agreement"]["agree"]
    # the stopped launch is gone, not still logging beside the resumed one
    time.sleep(2.5)
    lines = (runs / "te-resume" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == list(range(1, 41))


def test_a_reused_committed_record_is_the_reference(tmp_path: Path, monkeypatch) -> None:
    """``--reuse`` of a record run on another machine (no run directory here): the TE row is compared
    with the record's losses (the te-init-from-hf against the local-init-from-hf
    compared 0 steps before this), and the reused row keeps its recorded memory and start record."""
    runs, dest, out, earlier = tmp_path / "runs", tmp_path / "dest", tmp_path / "out", tmp_path / "earlier"
    out.mkdir()
    earlier.mkdir()
    (tmp_path / "fake.py").write_text(FAKE)
    (dest / "te-bf16").mkdir(parents=True)
    (dest / "te-bf16" / "launch.sh").write_text(f"{sys.executable} {tmp_path / 'fake.py'} te-bf16 {runs}\n")
    record = {"config": "local-bf16", "losses": {str(i): 10 / (1 + 0.1 * i) * 1.003 for i in range(1, 41)},
              "memory_gib": {"peak_mem_gib": 9.7, "peak_reserved_gib": 10.5}, "median_step_time_s": 0.2,
              "start": {"layer_spec": "local"}, "launches": {"local-bf16": {"exit": 0, "wall_s": 90.0}}}
    (earlier / "local-bf16.json").write_text(json.dumps(record))
    monkeypatch.setattr(te_matrix, "RUNS", runs)
    monkeypatch.setattr(te_matrix, "compile_config", lambda name, d: (0, ""))
    monkeypatch.setattr(te_matrix, "check_flags", lambda name, text: [])
    monkeypatch.setattr(te_matrix, "build_objects", lambda train_py: None)
    monkeypatch.setattr(te_matrix, "mc19_unknown_keywords", lambda text: [])
    (dest / "te-bf16" / "train.py").write_text("")
    (dest / "local-bf16").mkdir()
    (dest / "local-bf16" / "train.py").write_text("")
    code = te_matrix.main([str(out), "--dest", str(dest), "--only", "te-bf16", "--reuse", f"{earlier}:local-bf16",
                           "--no-data", "--budget-s", "60", "--lanes", "1"])
    te = json.loads((out / "te-bf16.json").read_text())
    assert te["agreement"]["against"] == "local-bf16" and te["agreement"]["compared"] == 40
    assert te["agreement"]["agree"] and abs(te["agreement"]["max_rel_diff"] - 0.003 / 1.003) < 1e-9
    local = json.loads((out / "local-bf16.json").read_text())
    assert local["memory_gib"] == record["memory_gib"] and local["start"] == record["start"]
    assert local["launches"] == record["launches"] and "record" not in local["reused"]
    assert code == 0


def test_rescore_compares_records_again(tmp_path: Path) -> None:
    curve = {str(i): 10 / (1 + 0.1 * i) for i in range(1, 41)}
    (tmp_path / "local-init-from-hf.json").write_text(json.dumps({"losses": curve}))
    te = {k: v * (1.0001 if k == "5" else 1.0) for k, v in curve.items()}
    (tmp_path / "te-init-from-hf.json").write_text(json.dumps({"losses": te, "agreement": {"compared": 0}}))
    assert te_matrix.main(["--rescore", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "te-init-from-hf.json").read_text())
    assert row["rescored"] and row["agreement"]["compared"] == 40 and row["agreement"]["worst_iteration"] == 5
    assert row["agreement"]["agree"] and row["first_step"]["compared"] == 1
    assert te_matrix.main(["--rescore", str(tmp_path / "none")]) == 1  # nothing to compare
