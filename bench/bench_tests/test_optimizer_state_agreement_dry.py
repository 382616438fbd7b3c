"""bench/throughput/optimizer_state_agreement.py --dry on CPU: every optimizer-state variant and its
baseline compile (their train.py passes the options to OptimizerConfig), and the loss-agreement
commands compare each variant's 200 steps with the baseline's, the baseline rerun as noise floor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "throughput" / "optimizer_state_agreement.py"


def test_dry_run_compiles_every_optimizer_state_variant_and_prints_the_agreement_commands(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--layers", "local", "--work-dir", str(tmp_path / "w"),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for variant in ("local-bf16", "local-bf16-bf16-states", "local-bf16-cpu-offload"):
        assert f"# megatron-{variant} mb4: compiled" in out
    assert out.count("keywords as expected") == 4  # baseline, two variants, baseline again (noise)
    assert "FAILED" not in out
    agreement = [line for line in out.splitlines() if line.startswith("# agreement:")]
    assert len(agreement) == 2 and all("--steps 200 --noise" in line for line in agreement)
    compiled = (tmp_path / "w" / "main" / "megatron-local-bf16-cpu-offload_mb4.compiled" / "train.py").read_text()
    assert "optimizer_cpu_offload=True" in compiled and "require_fused_adam(cpu_offload=True)" in compiled
