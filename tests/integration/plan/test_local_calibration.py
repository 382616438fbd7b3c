"""The local path's calibration driver (bench/gpu/local_calibration.py, ``bench/devbox/gpu.sh calibration``)
on CPU: the one-GPU entries of bench/plan/matrix.json, each cut to at most 40 steps and kept on the
local layers; ``--part K/N`` slices that cover every entry once; ``--dry`` compiles and checks the
flags; the launch loop records the local layer path; bench/calibration/run.py drives it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
sys.path.insert(0, str(ROOT / "bench" / "plan"))
import local_calibration  # noqa: E402
import te_calibration  # noqa: E402

MATRIX = json.loads((ROOT / "bench" / "plan" / "matrix.json").read_text())


def test_the_entries_are_the_one_gpu_matrix_cut_short_on_the_local_layers() -> None:
    entries = local_calibration.matrix_entries()
    assert [e["name"] for e in entries] == [e["name"] for e in MATRIX if e["gpus"] == 1 and e["runtime_supported"]]
    for entry in entries:
        sets = dict(o.split("=", 1) for o in entry["overrides"])  # the last value of a key wins, as with --set
        assert int(sets["train.train_iters"]) == entry["steps"] <= 40 and entry["warmup_steps"] == 10
        assert int(sets["train.eval_interval"]) <= 40
        assert sets["model.transformer_impl"] == '"local"' and entry["held_out"] is False
    original = next(e for e in MATRIX if e["name"] == entries[0]["name"])
    assert entries[0]["overrides"][:len(original["overrides"])] == original["overrides"]  # appended, not rewritten


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_parts_cover_every_entry_once_in_order(n) -> None:
    entries = local_calibration.matrix_entries()
    parts = [local_calibration.part_of(entries, f"{k}/{n}") for k in range(1, n + 1)]
    assert [e for part in parts for e in part] == entries
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    for bad in ("0/2", "3/2", "x", "1/0"):
        with pytest.raises(ValueError, match="K/N"):
            local_calibration.part_of(entries, bad)


def test_dry_compiles_and_checks_the_local_layers(tmp_path: Path) -> None:
    name = "demo-mdm-b8-s2048"
    dest = tmp_path / "localcal"
    assert local_calibration.main(["--dry", "--no-build", "--only", name, "--dest", str(dest)]) == 0
    entry = next(e for e in local_calibration.matrix_entries() if e["name"] == name)
    text = (dest / name / "train.py").read_text()
    assert local_calibration.check_flags(entry, text) == []
    assert local_calibration.check_flags(entry, text.replace("use_transformer_engine=False", "use_transformer_engine=True")) \
        == ["use_transformer_engine: want False, got True"]
    assert local_calibration.check_flags(entry, text.replace("micro_batch_size=8", "micro_batch_size=4")) \
        == ["micro_batch_size: want 8, got 4"]


def test_the_launch_loop_records_the_local_path(tmp_path: Path, monkeypatch) -> None:
    runs, dest, out = tmp_path / "runs", tmp_path / "dest", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "fake.py"
    script.write_text("import json, sys\nfrom pathlib import Path\nd = Path(sys.argv[1]); d.mkdir(parents=True)\n"
                      "rows = [{'event': 'train', 'iteration': i, 'loss': 1.0, 'step_time_s': 0.2 if i <= 10 else 0.1 + i / 1000,"
                      " 'tokens_per_s': 1.0, 'peak_mem_gib': 1.5} for i in range(5, 41, 5)]\n"
                      "(d / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\\n' for r in rows))\n")
    entry = local_calibration.matrix_entries()[0]
    (dest / entry["name"]).mkdir(parents=True)
    (dest / entry["name"] / "launch.sh").write_text(f"{sys.executable} {script} {runs / entry['name']}\n")
    monkeypatch.setattr(te_calibration, "planned", lambda e: {"step_seconds": 0.05})
    (record,) = te_calibration.run_all([entry], dest, out, budget_s=60, t_start=time.time(), min_start_s=1, repeats=0,
                                       impl=local_calibration.IMPL, runs=str(runs), tag="local_calibration")
    assert record["impl"] == "local+sdpa" and record["exit_code"] == 0 and record["gpus"] == 1
    assert record["steps_measured"] == 6 and abs(record["step_seconds"] - 0.1275) < 1e-9  # iterations 15..40
    assert record["peak_allocated_bytes"] == int(1.5 * 2**30)


def test_the_calibration_launcher_runs_the_local_driver_in_parts(tmp_path: Path) -> None:
    argv = [sys.executable, "bench/calibration/run.py", "--path", "local+sdpa", "--part", "2/2", "--dry",
            "--out", str(tmp_path / "results"), "--work-dir", str(tmp_path / "work")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "local_calibration.py" in proc.stdout and "--part 2/2" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].endswith("-cpu-local-matrix-part2of2.json")
    te = subprocess.run(argv[:3] + ["transformer_engine"] + argv[4:], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert te.returncode == 2 and "--part 2/2" in te.stderr and "--only" in te.stderr
