"""``RuntimeObjective.prepare(batch, rng)`` is the one entry point: a mapping with ``"tokens"`` and an
:class:`ObjectiveRng` (or a bare generator, its ``masking``); the old tensor-and-keywords form is gone."""

from __future__ import annotations

import pytest
import torch

from dlmspec.backends.megatron.objective import AutoregressiveObjective, MaskedDiffusionObjective, ObjectiveRng


def test_tensor_with_generator_keyword_is_refused_with_the_mapping_form() -> None:
    tokens = torch.zeros(2, 8, dtype=torch.int64)
    with pytest.raises(TypeError, match=r"\{'tokens': tensor\}"):
        MaskedDiffusionObjective(99).prepare(tokens, torch.Generator().manual_seed(0))
    with pytest.raises(TypeError):
        MaskedDiffusionObjective(99).prepare(tokens, generator=torch.Generator().manual_seed(0))  # type: ignore[call-arg]


def test_generator_and_objective_rng_draw_the_same_masks() -> None:
    tokens = torch.arange(64, dtype=torch.int64).reshape(4, 16)
    obj = MaskedDiffusionObjective(99, variable_length_prob=0.0)
    bare = obj.prepare({"tokens": tokens}, torch.Generator().manual_seed(5))
    wrapped = obj.prepare({"tokens": tokens}, ObjectiveRng(torch.Generator().manual_seed(5)))
    assert torch.equal(bare.input_ids, wrapped.input_ids) and torch.equal(bare.loss_weights, wrapped.loss_weights)
    assert (bare.input_ids == 99).any()
    ar = AutoregressiveObjective().prepare({"tokens": tokens})
    assert torch.equal(ar.labels[:, :-1], tokens[:, 1:])
