""":func:`dlmspec.pipeline_split.split_problems` refuses exactly the splits the installed
megatron-core refuses (``TransformerConfig.__post_init__``, ``get_num_layers_to_build``,
``PipelineParallelLayerLayout``), and :func:`~dlmspec.pipeline_split.chunk_layers` places as many
layers on every rank and virtual stage as megatron-core builds there, over a grid of layer counts,
PP and VPP sizes and each uneven option."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from megatron.core.transformer.enums import LayerType
from megatron.core.transformer.transformer_block import get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig

from dlmspec.pipeline_split import Split, chunk_layers, split_problems

LAYOUTS = ["Et*4|t*4L", "Et*3|t*5L", "Et|t*2|t*2|t*2|tL", "Et*2|t*2|t*2|t*2L", "Et*3|t*3|t*3|t*3L", "t*4|Et*4L",
           "Et*4|t*4|L", "E|t*4|t*4|L", "Et*4|t*4", "EEt*4|t*4L", "(Et*2|)*2t*2|t*2L", "Et*2|t*2|m|t*2L"]


def _cases() -> list[Split]:
    cases = []
    for layers, pp, vpp in itertools.product((6, 8, 10, 14), (1, 2, 4), (None, 2, 4)):
        cases.append(Split(layers, pp, vpp))
        for embedding, loss in ((True, False), (False, True), (True, True)):
            cases.append(Split(layers, pp, vpp, embedding=embedding, loss=loss))
        for first, last in ((1, None), (2, None), (None, 2), (2, 2), (4, 2), (4, 4), (3, 1)):
            cases.append(Split(layers, pp, vpp, first=first, last=last))
        cases.append(Split(layers, pp, vpp, first=2, embedding=True))
    for layout, pp, vpp in itertools.product(LAYOUTS, (1, 2, 4), (None, 2)):
        cases.append(Split(8, pp, vpp, layout=layout))
        cases.append(Split(8, pp, vpp, layout=layout, loss=True))
    cases.append(Split(126, 8, 8, embedding=True, loss=True))
    cases.append(Split(126, 8, 2, embedding=True, loss=True))
    cases.append(Split(126, 8, 8))
    return cases


def _megatron(split: Split) -> tuple[tuple[int, ...], ...] | None:
    """Layers megatron-core builds per (rank, virtual stage), or None when it refuses the split."""
    options = {}
    if split.first is not None:
        options["num_layers_in_first_pipeline_stage"] = split.first
    if split.last is not None:
        options["num_layers_in_last_pipeline_stage"] = split.last
    if split.layout is not None:
        options["pipeline_model_parallel_layout"] = split.layout
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = TransformerConfig(
                num_layers=split.num_layers, hidden_size=64, num_attention_heads=4, add_bias_linear=False,
                pipeline_model_parallel_size=split.pp, virtual_pipeline_model_parallel_size=split.vpp,
                pipeline_dtype=torch.bfloat16, account_for_embedding_in_pipeline_split=split.embedding,
                account_for_loss_in_pipeline_split=split.loss, **options)
        v = config.virtual_pipeline_model_parallel_size or 1
        if config.pipeline_model_parallel_layout is None and split.pp == 1:
            v = 1  # get_num_layers_to_build ignores VPP at PP 1: one chunk
        if config.pipeline_model_parallel_layout is not None:
            layout = config.pipeline_model_parallel_layout.layout
            return tuple(tuple(layout[i][c].count(LayerType.decoder) for c in range(v)) for i in range(split.pp))
        return tuple(tuple(get_num_layers_to_build(config, vp_stage=c if split.vpp else None, pp_rank=i)
                           for c in range(v)) for i in range(split.pp))
    except (ValueError, AssertionError, IndexError):
        return None


CASES = _cases()


@pytest.mark.parametrize("split", CASES, ids=[f"L{s.num_layers}-pp{s.pp}-vpp{s.vpp}-f{s.first}-l{s.last}"
                                              f"-e{int(s.embedding)}{int(s.loss)}-{s.layout}" for s in CASES])
def test_refusals_and_layer_counts_agree_with_megatron_core(split: Split) -> None:
    ours = split_problems(split)
    theirs = _megatron(split)
    if [p.rule for p in ours] == ["pipeline-layout-virtual-size"] and split.vpp is None:
        # dlmspec's own: megatron-core takes the virtual size from the layout; the spec must write it
        assert theirs is not None
        return
    assert (not ours) == (theirs is not None), (ours, theirs)
    if split.pp == 1 and split.vpp is not None and split.layout is None:
        return  # VPP at PP 1 (refused by vpp-needs-pp): megatron-core's count depends on which virtual stage asks
    if theirs is not None:
        assert chunk_layers(split) == theirs


def test_the_grid_holds_splits_megatron_core_builds_and_refuses() -> None:
    built = sum(1 for s in CASES if not split_problems(s))
    assert 40 < built < len(CASES) - 40, built
