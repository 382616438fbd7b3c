"""``bench/<suite>/run.py --dry`` with a peer's package missing exits 2 and names the module, who needs it
and how to get it (bench/common.py: missing_peers, report_missing); with everything present it exits 0."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "throughput"


def _run_module():
    for folder in (BENCH, ROOT / "bench"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("bench_throughput_run_missing_peers", BENCH / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _dry(run, monkeypatch, tmp_path, capsys, checked):
    monkeypatch.setattr(run, "import_check", lambda python, modules, cwd=None: {m: checked.get(m, "ok") for m in modules})
    args = run.parse_args(["--dry-run", "--megatron-variants", "reference", "--megatron-micro-batch-sizes", "4",
                           "--hf-micro-batch-sizes", "4", "--peers", "plain,liger"])
    code = run.dry_run(args, run.job_order(args), tmp_path, [])
    return code, capsys.readouterr()


def test_missing_peer_exits_2_with_the_module_and_how_to_get_it(monkeypatch, tmp_path, capsys):
    run = _run_module()
    code, out = _dry(run, monkeypatch, tmp_path, capsys,
                     {"liger_kernel.transformers": "ModuleNotFoundError: No module named 'liger_kernel'"})
    assert code == 2, out.err
    assert "liger_kernel.transformers (needed by hf liger* impls" in out.err
    assert "get it: pip install liger-kernel" in out.err and "--peers plain" in out.err
    assert "result: " in out.out  # the commands are still printed


def test_every_peer_present_exits_0(monkeypatch, tmp_path, capsys):
    run = _run_module()
    code, out = _dry(run, monkeypatch, tmp_path, capsys, {})
    assert code == 0 and "error:" not in out.err


def test_missing_peers_lists_only_imports_with_a_way_to_get_each():
    sys.path.insert(0, str(ROOT / "bench"))
    import common

    lines = common.missing_peers({"transformers": "ModuleNotFoundError: x", "torch": "ok",
                                  "a check (not an import)": "MISMATCH"}, {"transformers": "hf", "torch": "both"})
    assert lines == ["transformers (needed by hf): ModuleNotFoundError: x; get it: "
                     "pip install 'transformers>=4.45' (in dlmspec[runtime])"]
    assert common.report_missing([], "python") == 0 and common.report_missing(lines, "python") == 2
