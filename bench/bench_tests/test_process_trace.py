"""The suite's process trace (bench/suite/process_trace.py): the hook is inert without
``DLMSPEC_PROCESS_TRACE``, records a process's own CPU and the test that started it, uninstalls
cleanly, and the report sums the pytest processes apart from their subprocesses, by kind and test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench_scripts import load_script

process_trace = load_script(Path("bench/suite/process_trace.py"), "bench_suite_process_trace")


def test_the_hook_records_a_process_only_when_asked_and_uninstalls(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    written = process_trace.install(site)
    assert [p.name for p in written] == ["_dlmspec_process_trace.py", "zz_dlmspec_process_trace.pth"]
    trace = tmp_path / "trace.jsonl"
    code = f"import site; site.addsitedir({str(site)!r}); import json"  # a .pth runs when its folder is a site dir
    env = {k: v for k, v in os.environ.items() if k != "DLMSPEC_PROCESS_TRACE"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    assert not trace.exists()  # inert without the variable
    env.update(DLMSPEC_PROCESS_TRACE=str(trace), PYTEST_CURRENT_TEST="tests/x/test_y.py::test_z (call)")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    (rec,) = process_trace.read(trace)
    assert rec["test"] == "tests/x/test_y.py::test_z (call)" and rec["cpu"] >= 0 and rec["torch"] is False
    assert {p.name for p in process_trace.uninstall(site)} == {p.name for p in written}
    assert list(site.iterdir()) == []


def test_the_report_keeps_the_pytest_processes_apart_and_sums_subprocesses_by_kind_and_test(tmp_path: Path) -> None:
    recs = [
        {"argv": ["-c"], "cpu": 600.0, "test": "", "xdist_worker": "gw0", "megatron": True, "torch": True},
        {"argv": ["/v/pytest/__main__.py", "-n", "2"], "cpu": 20.0, "test": "", "xdist_worker": ""},
        {"argv": ["/v/bin/dlmspec", "data", "prepare"], "cpu": 4.0, "torch": True,
         "test": "tests/a/test_p.py::test_one (call)", "xdist_worker": "gw0"},
        {"argv": ["train.py"], "cpu": 9.0, "torch": True, "megatron": True,
         "test": "tests/a/test_p.py::test_two (call)", "xdist_worker": "gw1"},
        {"argv": ["-c"], "cpu": 0.5, "test": "", "xdist_worker": ""},
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in recs) + "\nnot json\n")
    s = process_trace.summary(process_trace.read(trace))
    assert s["pytest_processes"] == 2 and s["pytest_cpu_s"] == 620.0
    assert s["subprocesses"] == 3 and s["subprocess_cpu_s"] == 13.5
    assert s["by_kind"]["megatron"] == {"processes": 1, "cpu_s": 9.0}
    assert s["by_kind"]["torch"] == {"processes": 1, "cpu_s": 4.0}
    assert dict(s["by_test"]) == {"tests/a/test_p.py": 13.0, "(no test in its environment)": 0.5}
    assert dict(s["by_command"])["dlmspec data prepare"] == 4.0


def test_a_missing_trace_or_venv_exits_2_naming_what_to_pass(tmp_path: Path, capsys) -> None:
    assert process_trace.main(["report", str(tmp_path / "none.jsonl")]) == 2
    assert "DLMSPEC_PROCESS_TRACE=" in capsys.readouterr().err
    assert process_trace.main(["install", "--venv", str(tmp_path)]) == 2
    assert "no bin/python" in capsys.readouterr().err
