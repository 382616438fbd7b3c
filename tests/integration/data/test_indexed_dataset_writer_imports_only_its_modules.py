"""`dlmspec data prepare` imports megatron-core's indexed-dataset writer without the library's
``__init__`` (:func:`dlmspec.data.builder.indexed_dataset_classes`): in a fresh interpreter the
writer comes without wandb or megatron-core's transformer modules, leaves no ``megatron.core``
module behind, writes the bytes of the writer of a full ``import megatron.core``, and a later full
import works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import json, sys, warnings
import numpy as np
warnings.simplefilter("ignore")
from dlmspec.data.builder import indexed_dataset_classes

DType, Light = indexed_dataset_classes()
report = {"light_module": Light.__module__, "dtype_code": DType.code_from_dtype(np.int32),
          "left": sorted(m for m in sys.modules if m == "megatron.core" or m.startswith("megatron.core.")),
          "wandb": "wandb" in sys.modules}
import megatron.core
import megatron.core.tensor_parallel  # the library's own __init__ ran in full
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder as Full, IndexedDataset

report["full_is_another_class"] = Full is not Light
for name, cls in (("light", Light), ("full", Full)):
    builder = cls(f"{name}.bin", dtype=np.int32)
    builder.add_document(np.arange(7, dtype=np.int32), [3, 4])
    builder.add_document(np.arange(2, dtype=np.int32), [2])
    builder.finalize(f"{name}.idx")
report["same_bytes"] = all(open(f"light{e}", "rb").read() == open(f"full{e}", "rb").read() for e in (".bin", ".idx"))
report["sequences"] = len(IndexedDataset("light"))
print(json.dumps(report))
"""


def test_the_writer_comes_without_megatron_cores_init_and_writes_its_bytes(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["light_module"] == "megatron.core.datasets.indexed_dataset"
    assert report["left"] == [] and report["wandb"] is False, report
    assert report["full_is_another_class"] and report["same_bytes"], report
    assert report["sequences"] == 3 and report["dtype_code"] == 4, report
