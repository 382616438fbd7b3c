"""The converter on a machine like CI's fresh virtualenv (no psutil)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from dlmspec.backends.convert.hf_io import SafetensorsReader


_NO_PSUTIL = """
import sys
sys.modules["psutil"] = None  # as on a machine without psutil
from dlmspec.backends.convert import hf_to_mcore, mcore_to_hf
from dlmspec.backends.convert.tiny import make_tiny_hf
from megatron.core.dist_checkpointing.strategies import filesystem_async
assert not filesystem_async.HAVE_PSUTIL
src, _ = make_tiny_hf("mistral", sys.argv[1] + "/hf")
hf_to_mcore(src, sys.argv[1] + "/mcore")
mcore_to_hf(sys.argv[1] + "/mcore", sys.argv[1] + "/back")
"""


def test_conversion_works_without_psutil(tmp_path):
    """megatron's writer needs psutil only for a log line; without it the save must not hang."""
    repo = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-c", _NO_PSUTIL, str(tmp_path)], cwd=repo, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = SafetensorsReader(tmp_path / "hf"), SafetensorsReader(tmp_path / "back")
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
