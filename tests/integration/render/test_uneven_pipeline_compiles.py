"""Uneven pipeline splits from the spec to megatron-core, on CPU: the bundled Llama-3.1-405B layout
(126 layers, PP 8 x VPP 8, embedding and loss accounted) validates, plans, compiles, and the
compiled train.py's ``build_configs()`` builds a TransformerConfig that passes megatron-core's own
``__post_init__`` and builds the layers :func:`dlmspec.pipeline_split.chunk_layers` places; the
first/last stage counts and an explicit layout reach it the same way."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from dlmspec.check import load_for
from dlmspec.pipeline_split import chunk_layers, split_of
from dlmspec.plan import make_plan
from dlmspec.render.compile import check_spec, render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

from compile_megatron_kit import _import
from spec_kit import spec_file

ROOT = Path(__file__).resolve().parents[3]
SPEC_405B = ROOT / "specs" / "llama-3.1-405b-pretrain.toml"


def _built_layers(tc: Any, pp: int, vpp: int | None) -> tuple[tuple[int, ...], ...]:
    """Layers megatron-core builds on each (rank, virtual stage) of a TransformerConfig."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    v = vpp or 1
    if tc.pipeline_model_parallel_layout is not None:
        layout = tc.pipeline_model_parallel_layout.layout
        return tuple(tuple(layout[i][c].count(LayerType.decoder) for c in range(v)) for i in range(pp))
    return tuple(tuple(get_num_layers_to_build(tc, vp_stage=c if vpp else None, pp_rank=i) for c in range(v))
                 for i in range(pp))


def _compiled_config(path: Path, tmp_path: Path):
    loaded = load(path)
    resolved = resolve(loaded.spec)
    check_spec(loaded, resolved)
    train = tmp_path / "train.py"
    train.write_text(render(resolved, path.name)["train.py"], encoding="utf-8")
    module = _import(train)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tc, _, _, _ = module.build_configs()  # megatron-core's __post_init__ runs here
    return resolved, tc, train.read_text(encoding="utf-8")


def test_the_published_405b_layout_validates_plans_compiles_and_megatron_core_builds_it(tmp_path: Path) -> None:
    _, _, issues = load_for("validate", SPEC_405B, [])
    assert [i for i in issues if i.severity == "error"] == []
    resolved, tc, text = _compiled_config(SPEC_405B, tmp_path)
    assert (resolved.world_size, resolved.tp, resolved.pp, resolved.vpp, resolved.cp, resolved.dp) == (1024, 8, 8, 8, 2, 8)
    assert make_plan(resolved).memory.peak.peak_bytes < resolved.gpu.memory_bytes
    assert "transformer layers per rank 15, 16, 16, 16, 16, 16, 16, 15" in text
    assert tc.account_for_embedding_in_pipeline_split and tc.account_for_loss_in_pipeline_split
    assert (tc.num_layers, tc.pipeline_model_parallel_size, tc.virtual_pipeline_model_parallel_size) == (126, 8, 8)
    built = _built_layers(tc, 8, 8)
    assert built[0] == (1,) + (2,) * 7 and built[7] == (2,) * 7 + (1,)
    assert built == chunk_layers(split_of(126, resolved.spec.parallel))
    assert sum(map(sum, built)) == 126


@pytest.mark.parametrize("changes", [
    {"model.num_layers": 10, "parallel.pipeline_model_parallel_size": 4,
     "parallel.num_layers_in_first_pipeline_stage": 1, "parallel.num_layers_in_last_pipeline_stage": 3},
    {"model.num_layers": 12, "parallel.pipeline_model_parallel_size": 2, "parallel.virtual_pipeline_model_parallel_size": 2,
     "parallel.num_layers_in_last_pipeline_stage": 4},
    {"model.num_layers": 7, "parallel.pipeline_model_parallel_size": 2,
     "parallel.pipeline_model_parallel_layout": "Et*3|t*4L"},
    {"model.num_layers": 6, "parallel.pipeline_model_parallel_size": 2, "parallel.virtual_pipeline_model_parallel_size": 2,
     "parallel.pipeline_model_parallel_layout": "Et|(t*2|)*2tL"},
    {"model.num_layers": 14, "parallel.pipeline_model_parallel_size": 4, "parallel.virtual_pipeline_model_parallel_size": 2,
     "parallel.account_for_embedding_in_pipeline_split": True, "parallel.account_for_loss_in_pipeline_split": True},
], ids=["first-last", "last-vpp2", "layout", "layout-vpp2", "accounting-vpp2"])
def test_each_uneven_option_reaches_the_compiled_transformer_config(changes: dict[str, Any], tmp_path: Path) -> None:
    path = spec_file(tmp_path, {"data.mock": True, "train.micro_batch_size": 1, "train.global_batch_size": 32}, changes)
    resolved, tc, _ = _compiled_config(path, tmp_path)
    p = resolved.spec.parallel
    assert tc.num_layers_in_first_pipeline_stage == p.num_layers_in_first_pipeline_stage
    assert tc.num_layers_in_last_pipeline_stage == p.num_layers_in_last_pipeline_stage
    assert tc.account_for_embedding_in_pipeline_split == bool(p.account_for_embedding_in_pipeline_split)
    assert tc.account_for_loss_in_pipeline_split == bool(p.account_for_loss_in_pipeline_split)
    assert (tc.pipeline_model_parallel_layout is None) == (p.pipeline_model_parallel_layout is None)
    assert tc.virtual_pipeline_model_parallel_size == resolved.vpp
    assert _built_layers(tc, resolved.pp, resolved.vpp) == chunk_layers(split_of(resolved.spec.model.num_layers, p))


def test_a_layout_string_reaches_train_py_only_through_python_escaping(tmp_path: Path) -> None:
    """The layout is a user string: train.py holds it as a Python literal (the ``py`` filter), and
    a string that would break out of it is refused by the validator before anything is written."""
    path = spec_file(tmp_path, {"data.mock": True, "model.num_layers": 8, "parallel.pipeline_model_parallel_size": 2,
                                "parallel.pipeline_model_parallel_layout": "Et*4|t*4L\"); import os; (\""})
    _, _, issues = load_for("validate", path, [])
    (issue,) = [i for i in issues if i.severity == "error"]
    assert issue.rule == "pipeline-layout-grammar" and issue.fix is not None
    assert issue.fix.set == {"parallel.pipeline_model_parallel_layout": "Et*4|t*4L"}
