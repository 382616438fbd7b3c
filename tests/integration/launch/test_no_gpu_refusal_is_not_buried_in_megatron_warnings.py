"""Without a GPU the compiled train.py's one-line refusal is what it prints: megatron-core's import-time
warnings (no Apex / Transformer Engine) are silenced before its first megatron-core import
(dlmspec.backends.launch.no_gpu)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

_PROBE = ("import sys; "
          "from dlmspec.backends.launch.no_gpu import quiet_megatron_without_gpu; "
          "print(quiet_megatron_without_gpu(sys.argv[1] == 'gpu')); "
          "import megatron.core.optimizer, megatron.core.models.gpt.gpt_layer_specs")


def _stderr(kind: str) -> str:
    proc = subprocess.run([sys.executable, "-c", _PROBE, kind], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_megatron_import_warnings_are_silenced_without_a_gpu() -> None:
    pytest.importorskip("megatron.core")
    quiet = _stderr("none")
    assert "UserWarning" not in quiet and "megatron" not in quiet, quiet
    noisy = _stderr("gpu")  # with a GPU they are left alone (worth reading there)
    try:
        import apex  # noqa: F401
    except ImportError:
        assert "Apex is not installed" in noisy


def test_compiled_train_py_silences_them_before_its_first_megatron_import() -> None:
    for train in sorted((ROOT / "tests" / "golden" / "compiled").rglob("train.py")):
        text = train.read_text(encoding="utf-8")
        quiet = text.index("quiet_megatron_without_gpu()")
        assert quiet < text.index("from megatron"), train
