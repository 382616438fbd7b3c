"""Layers per pipeline rank and virtual stage under megatron-core's uneven splits
(:mod:`dlmspec.pipeline_split`), against counts worked out by hand from megatron-core 0.16.1's
``get_num_layers_to_build`` and ``PipelineParallelLayerLayout``."""

from __future__ import annotations

import pytest

from dlmspec.pipeline_split import (MAX_EXPANDED, LayoutError, Split, chunk_layers, expand_layout, layer_ranges,
                                    layout_string, rank_layers, split_problems)


def test_llama_405b_accounted_split_on_pp8_vpp8_by_hand() -> None:
    """126 layers + embedding + loss = 128 = 8 ranks x 16 = 8 ranks x 8 virtual stages x 2: every
    virtual stage holds 2 layers except the first of rank 0 (beside the embedding) and the last of
    rank 7 (beside the loss), which hold 1."""
    split = Split(126, 8, 8, embedding=True, loss=True)
    assert split_problems(split) == []
    chunks = chunk_layers(split)
    assert chunks[0] == (1, 2, 2, 2, 2, 2, 2, 2)
    assert chunks[7] == (2, 2, 2, 2, 2, 2, 2, 1)
    assert all(chunks[i] == (2,) * 8 for i in range(1, 7))
    assert rank_layers(split) == (15, 16, 16, 16, 16, 16, 16, 15)
    # rank 0's virtual stages hold layers 0, then 15-16 (after ranks 1-7's first stages: 7 x 2 = 14), ...
    assert layer_ranges(split, 0)[:2] == [(0, 1), (15, 17)]
    assert layer_ranges(split, 7)[-1] == (125, 126)


def test_one_accounting_flag_without_interleaving_by_hand() -> None:
    """31 layers + the loss = 32 = 4 x 8: the last rank builds 7."""
    assert chunk_layers(Split(31, 4, None, loss=True)) == ((8,), (8,), (8,), (7,))
    assert chunk_layers(Split(31, 4, None, embedding=True)) == ((7,), (8,), (8,), (8,))
    (problem,) = split_problems(Split(31, 4, None, embedding=True, loss=True))  # 31 + 2 = 33: not a multiple of 4
    assert problem.rule == "pipeline-accounted-layers-divide" and "33" in problem.why


def test_first_and_last_stage_counts_by_hand() -> None:
    """30 layers, PP 4, 6 on the first and 6 on the last: 18 left over 2 middle ranks = 9 each;
    with VPP 3 every count is a multiple of 3, so each virtual stage holds a third of its rank's."""
    assert chunk_layers(Split(30, 4, None, first=6, last=6)) == ((6,), (9,), (9,), (6,))
    assert chunk_layers(Split(30, 4, 3, first=6, last=6)) == ((2, 2, 2), (3, 3, 3), (3, 3, 3), (2, 2, 2))
    assert chunk_layers(Split(10, 3, None, first=2)) == ((2,), (4,), (4,))
    assert rank_layers(Split(10, 2, None, last=3)) == (7, 3)


def test_a_layout_string_by_hand() -> None:
    """'Et*3|(t*4|)*2t*3L' on PP 4: stages 'Et*3', 't*4', 't*4', 't*3L' -> 3, 4, 4, 3 layers; on
    PP 2 the same four stages are 2 virtual stages per rank, stage c*PP + i on rank i."""
    text = "Et*3|(t*4|)*2t*3L"
    assert expand_layout(text) == ["Ettt", "tttt", "tttt", "tttL"]
    assert split_problems(Split(14, 4, None, layout=text)) == []
    assert chunk_layers(Split(14, 4, None, layout=text)) == ((3,), (4,), (4,), (3,))
    assert chunk_layers(Split(14, 2, 2, layout=text)) == ((3, 4), (4, 3))
    assert layer_ranges(Split(14, 2, 2, layout=text), 1) == [(3, 7), (11, 14)]


def test_the_written_layout_of_a_split_places_the_same_layers() -> None:
    split = Split(126, 8, 8, embedding=True, loss=True)
    text = layout_string(chunk_layers(split))
    assert text.startswith("Et|t*2|") and text.endswith("|tL")
    as_layout = Split(126, 8, 8, layout=text)
    assert split_problems(as_layout) == [] and chunk_layers(as_layout) == chunk_layers(split)


@pytest.mark.parametrize(("layers", "pp", "vpp"), [(8, 2, None), (8, 2, 2), (24, 4, 3), (32, 8, 4), (6, 4, None), (12, 2, 4)])
def test_the_even_split_and_its_stand_in_are_the_planners_former_ranges(layers: int, pp: int, vpp: int | None) -> None:
    """Without uneven options the ranges are the even split's (chunk c of rank i holds
    [(c*pp + i)*Lc, (c*pp + i + 1)*Lc)), and a split megatron-core refuses keeps the planner's
    stand-in (the first L % pp ranks one layer more), so even plans do not change."""
    split = Split(layers, pp, vpp)
    v = vpp or 1
    for rank in range(pp):
        if layers % (pp * v) == 0:
            lc = layers // (pp * v)
            want = [((c * pp + rank) * lc, (c * pp + rank + 1) * lc) for c in range(v)]
        else:
            base, extra = divmod(layers, pp)
            start = rank * base + min(rank, extra)
            want = [(start, start + base + (1 if rank < extra else 0))]
        assert layer_ranges(split, rank) == want


def test_a_layout_that_expands_past_the_cap_is_refused_before_it_is_expanded() -> None:
    with pytest.raises(LayoutError, match="expands to more than"):
        expand_layout("E(t|)*999999999999L")
    with pytest.raises(LayoutError, match="expands to more than"):
        expand_layout("Et*" + str(MAX_EXPANDED) + "L")
    with pytest.raises(LayoutError, match="more than"):
        expand_layout("t" * (MAX_EXPANDED + 1))
    with pytest.raises(LayoutError, match="expands to more than"):  # a count Python's int() refuses to read
        expand_layout("Et*" + "9" * 5000 + "L")


def test_an_unknown_layer_character_names_itself_and_the_known_ones() -> None:
    with pytest.raises(LayoutError, match="'x' is not a layer character"):
        expand_layout("Et*4|x*4L")
    (problem,) = split_problems(Split(8, 2, None, layout="Et*4|x*4L"))
    assert problem.rule == "pipeline-layout-grammar" and "'E', 'L', 't', 'm'" in problem.why
