"""CPU tests of the deterministic masking RNG (backends/megatron/rng.py)."""

import itertools

import pytest
import torch

from dlmspec.backends.megatron.objective import MaskedDiffusionObjective
from dlmspec.backends.megatron.rng import (
    TRAIN_STREAM,
    VALID_STREAM,
    check_resume_seed,
    masking_generator,
    masking_seed,
)


def _masks(seed, iteration, dp_rank, mb, stream=TRAIN_STREAM):
    tokens = torch.arange(2 * 64).view(2, 64) % 50
    obj = MaskedDiffusionObjective(63, variable_length_prob=0.3)
    return obj.prepare({"tokens": tokens}, masking_generator(seed, iteration, dp_rank, mb, stream=stream))


def test_seed_is_pinned():
    # Changing the derivation would change every mask of a resumed run; these
    # values are part of the checkpoint contract.
    assert masking_seed(0, 0, 0, 0) == 2819122058408459604
    assert masking_seed(1234, 10, 3, 2, stream=VALID_STREAM) == 12857538434199350307


def test_resumed_run_draws_the_same_masks_as_uninterrupted_run():
    uninterrupted = [_masks(7, it, 1, mb) for it in range(6) for mb in range(3)]
    # "Resume" at iteration 3: a fresh process recomputes only from the key.
    resumed = [_masks(7, it, 1, mb) for it in range(3, 6) for mb in range(3)]
    for a, b in zip(uninterrupted[9:], resumed):
        assert torch.equal(a.input_ids, b.input_ids)
        assert torch.equal(a.loss_weights, b.loss_weights)
        assert torch.equal(a.lengths, b.lengths)


def test_data_parallel_ranks_and_microbatches_never_coincide():
    seeds = {
        masking_seed(1234, it, dp, mb, stream=st)
        for it, dp, mb, st in itertools.product(range(40), range(8), range(8), (TRAIN_STREAM, VALID_STREAM))
    }
    assert len(seeds) == 40 * 8 * 8 * 2
    a, b = _masks(1234, 5, 0, 0), _masks(1234, 5, 1, 0)
    assert not torch.equal(a.masked, b.masked)
    assert not torch.equal(_masks(1234, 5, 0, 0).masked, _masks(1234, 5, 0, 1).masked)


def test_streams_and_seeds_separate():
    assert not torch.equal(_masks(1, 0, 0, 0).masked, _masks(1, 0, 0, 0, stream=VALID_STREAM).masked)
    assert not torch.equal(_masks(1, 0, 0, 0).masked, _masks(2, 0, 0, 0).masked)


def test_generator_is_fresh_each_call():
    g1 = masking_generator(3, 4, 5, 6)
    first = torch.rand(5, generator=g1)
    g2 = masking_generator(3, 4, 5, 6)
    assert torch.equal(first, torch.rand(5, generator=g2))


@pytest.mark.parametrize("bad", [-1, 2**64])
def test_out_of_range_inputs_raise(bad):
    with pytest.raises(ValueError):
        masking_seed(bad, 0, 0, 0)
    with pytest.raises(ValueError):
        masking_seed(0, 0, bad, 0)


def test_non_int_inputs_raise():
    with pytest.raises(TypeError):
        masking_seed(1.0, 0, 0, 0)
    with pytest.raises(TypeError):
        masking_seed(True, 0, 0, 0)


def test_resume_seed_check():
    check_resume_seed(5, 5)
    with pytest.raises(ValueError, match="seed 4"):
        check_resume_seed(4, 5)
    with pytest.raises(ValueError):
        check_resume_seed(None, 5)
