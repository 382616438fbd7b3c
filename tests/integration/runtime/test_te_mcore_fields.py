"""train.py's megatron-core keywords against megatron-core 0.16.1 (installed) and 0.19.2 (recorded in
bench/results/mcore_0.19.2_fields.json by bench/gpu/mcore_fields.py from the 0.19.2 wheel: it needs
Python 3.12, so it is read, not imported), for the bundled specs and their TE / fp8 variants."""

from __future__ import annotations

import ast
import dataclasses
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from dlmspec.render.compile import render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from dlmspec.spec.models import Spec

ROOT = Path(__file__).resolve().parents[3]
RECORD = ROOT / "bench" / "results" / "mcore_0.19.2_fields.json"
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import mcore_fields  # noqa: E402

#: The TE / fp8 settings bench/devbox/gpu/te_matrix.sh runs, on top of each bundled spec.
VARIANTS: dict[str, dict[str, Any]] = {
    "as-is": {},
    "te-bf16": {"model.transformer_impl": "transformer_engine", "objective.variable_length_prob": 0.0},
    "te-varlen": {"model.transformer_impl": "transformer_engine", "objective.variable_length_prob": 0.5},
    **{f"fp8-{r}": {"model.transformer_impl": "transformer_engine", "precision.fp8": "hybrid",
                    "precision.fp8_recipe": r, "objective.variable_length_prob": 0.0}
       for r in ("delayed", "tensorwise", "blockwise")},
    "recompute-selective": {"model.transformer_impl": "transformer_engine", "recompute.granularity": "selective",
                            "recompute.modules": ["core_attn", "mlp"], "objective.variable_length_prob": 0.0},
    "recompute-full": {"model.transformer_impl": "transformer_engine", "recompute.granularity": "full",
                       "recompute.method": "uniform", "recompute.num_layers": 1, "objective.variable_length_prob": 0.0},
}
CLASSES = ("TransformerConfig", "DistributedDataParallelConfig", "OptimizerConfig")


def _installed() -> dict[str, list[str]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.transformer.transformer_config import TransformerConfig
    return {c.__name__: sorted(f.name for f in dataclasses.fields(c))
            for c in (TransformerConfig, DistributedDataParallelConfig, OptimizerConfig)}


def test_the_reader_matches_dataclasses_on_the_installed_version() -> None:
    import megatron.core

    read = mcore_fields.read_fields(Path(megatron.core.__file__).parents[2])
    assert read["version"] == megatron.core.__version__
    assert read["classes"] == _installed()


def test_the_record_is_0_19_2() -> None:
    record = json.loads(RECORD.read_text())
    assert record["version"] == "0.19.2" and set(record["classes"]) == set(CLASSES)
    assert "fp8_recipe" in record["classes"]["TransformerConfig"]
    # precision.fp8_recipe's values are megatron-core's (both versions)
    schema = Spec.model_json_schema()["$defs"]["PrecisionSpec"]["properties"]["fp8_recipe"]["enum"]
    assert set(schema) <= set(record["literals"]["TransformerConfig.fp8_recipe"])


def _keywords(train_py: str) -> dict[str, set[str]]:
    tree = ast.parse(train_py)
    sizes = next(n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", None) == "PARALLEL_SIZES")
    out: dict[str, set[str]] = {c: set() for c in CLASSES}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in out:
            for k in node.keywords:
                out[node.func.id] |= {k.arg} if k.arg else {s.arg for s in sizes.keywords}
    return out


def _spec(path: Path, changes: dict[str, Any]) -> Spec:
    return load(path, [f"{k}={json.dumps(v)}" for k, v in changes.items()]).spec


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_keyword_is_a_field_of_both_versions(variant: str) -> None:
    record = json.loads(RECORD.read_text())["classes"]
    installed = _installed()
    missing = []
    for path in sorted((ROOT / "specs").glob("*.toml")):
        if path.stem in ("megadlms-1.7b-sft",):  # stage.kind = "sft": refused by the runtime rules
            continue
        text = render(resolve(_spec(path, VARIANTS[variant])), f"specs/{path.name}")["train.py"]
        for cls, keywords in _keywords(text).items():
            assert keywords, (path.name, cls)
            missing += [(path.name, cls, k, v) for v, fields in (("0.16.1", installed), ("0.19.2", record))
                        for k in sorted(keywords - set(fields[cls]))]
    assert not missing, missing
