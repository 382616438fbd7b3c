"""bench/gpu/uneven_pipeline.py --dry on CPU: each configuration compiles, its train.py passes the
pipeline split keywords to TransformerConfig, megatron-core's config checks accept it, and its plan
places the layers the split says."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _driver():
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    spec = importlib.util.spec_from_file_location("uneven_pipeline_driver", ROOT / "bench" / "gpu" / "uneven_pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_compiles_checks_and_plans_each_split(tmp_path: Path, capsys) -> None:
    driver = _driver()
    names = ["first-stage-pp2", "accounting-pp2-vpp2"]
    assert driver.main(["--dry", "--dest", str(tmp_path / "c"), "--only", ",".join(names)]) == 0
    text = capsys.readouterr().out
    assert "megatron config checks passed" in text and "flags wrong []" in text
    assert "'layers_per_stage': [4, 8]" in text and "'layers_per_stage': [7, 7]" in text
    train = (tmp_path / "c" / "accounting-pp2-vpp2" / "train.py").read_text(encoding="utf-8")
    assert "account_for_loss_in_pipeline_split=True" in train and "layers per rank 7, 7" in train
