"""CPU tests of the objective options against hand computations
(backends/megatron/objective.py, rng.py): ``eps = 0`` with MegaDLMs' forced mask
(``min_masked_tokens``), the per-micro-batch variable-length cut (``variable_length =
"micro_batch"``, the same on every data-parallel rank) and the three loss normalisations
(``loss_normalization``), whose step objective is computed here as megatron-core's schedule
computes it (``pipeline_parallel/schedules.py`` ``forward_step_calc_loss``: with
``calculate_per_token_loss`` off each micro-batch's sum is divided by its ``num_tokens`` and by
the number of micro-batches; with it on the sums and counts of the step are added)."""

import math

import pytest
import torch

from dlmspec.backends.megatron.objective import (
    LOSS_NORMALIZATIONS,
    MaskedDiffusionObjective,
    AutoregressiveObjective,
    ObjectiveRng,
    apply_loss_normalization,
    build_objective,
    reduce_loss,
)
from dlmspec.backends.megatron.rng import variable_length_generator

MASK = 99



def _gen(seed=0):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def test_eps_zero_is_accepted():
    obj = MaskedDiffusionObjective(MASK, eps=0.0, loss_weighting="realised", min_masked_tokens=1)
    assert obj.eps == 0.0 and obj.min_masked_tokens == 1


def test_forced_mask_hand_case(monkeypatch):
    """A row whose uniforms are all >= t draws no mask; with min_masked_tokens = 1 exactly one
    of its positions is masked and, under realised weighting, its weight is l / 1 = l (MegaDLMs
    gpt_model.py:315-322: p_mask = 1 / l, loss / p_mask)."""
    tokens = torch.arange(8, dtype=torch.int64).view(2, 4)
    # row 0: u = 0.5 -> t = 0.5 (eps 0), uniforms 0.1 0.9 0.9 0.9 -> one mask at 0
    # row 1: u = 0.0 -> t = 0.0: nothing can be masked by the draw
    draws = iter([torch.tensor([0.5, 0.0]), torch.tensor([[0.1, 0.9, 0.9, 0.9], [0.3, 0.2, 0.6, 0.7]])])
    real_rand = torch.rand

    def fake_rand(*args, **kwargs):
        try:
            return next(draws)
        except StopIteration:
            return real_rand(*args, **kwargs)

    monkeypatch.setattr(torch, "rand", fake_rand)
    plain = MaskedDiffusionObjective(MASK, eps=0.0, loss_weighting="realised")
    ob = plain.prepare({"tokens": tokens}, _gen(0))
    assert ob.masked.tolist() == [[True, False, False, False], [False] * 4]
    assert ob.loss_weights[1].tolist() == [0.0] * 4  # nothing masked: weight 0, never 0 / 0
    assert ob.loss_weights[0].tolist() == [4.0, 0.0, 0.0, 0.0]  # r = 1/4

    draws = iter([torch.tensor([0.5, 0.0]), torch.tensor([[0.1, 0.9, 0.9, 0.9], [0.3, 0.2, 0.6, 0.7]])])
    forced = MaskedDiffusionObjective(MASK, eps=0.0, loss_weighting="realised", min_masked_tokens=1)
    ob = forced.prepare({"tokens": tokens}, _gen(0))
    assert ob.masked[0].tolist() == [True, False, False, False]  # row 0 had one: untouched
    assert int(ob.masked[1].sum()) == 1  # row 1 gets exactly one
    k = int(ob.masked[1].nonzero()[0, 0])
    assert ob.input_ids[1, k] == MASK and ob.loss_weights[1, k] == 4.0  # weight l = 4
    assert float(ob.loss_weights[1].sum()) == 4.0


def test_forced_mask_position_is_uniform_and_k_is_honoured():
    obj = MaskedDiffusionObjective(MASK, eps=0.0, loss_weighting="realised", min_masked_tokens=3)
    tokens = torch.zeros(4000, 5, dtype=torch.int64)
    ob = obj.prepare({"tokens": tokens}, _gen(1))
    assert torch.all(ob.masked.sum(dim=1) >= 3)
    one = MaskedDiffusionObjective(MASK, eps=0.0, loss_weighting="realised", min_masked_tokens=1)
    # t tiny for every row: force through a huge batch of short rows and count where the forced one lands
    ob = one.prepare({"tokens": torch.zeros(20000, 4, dtype=torch.int64)}, _gen(2))
    assert torch.all(ob.masked.sum(dim=1) >= 1)
    lonely = ob.masked[ob.masked.sum(dim=1) == 1].float().mean(dim=0)  # position frequencies of single masks
    assert torch.all((lonely - 0.25).abs() < 0.03), lonely


def test_min_masked_zero_leaves_the_stream_as_today():
    tokens = torch.randint(0, 90, (3, 16), generator=_gen(4))
    a = MaskedDiffusionObjective(MASK, eps=1e-3).prepare({"tokens": tokens}, _gen(7))
    b = MaskedDiffusionObjective(MASK, eps=1e-3, min_masked_tokens=0).prepare({"tokens": tokens}, _gen(7))
    assert torch.equal(a.masked, b.masked) and torch.equal(a.loss_weights, b.loss_weights)


def test_min_masked_is_bounded_by_the_valid_length():
    obj = MaskedDiffusionObjective(MASK, eps=0.0, loss_weighting="realised", min_masked_tokens=4)
    loss_mask = torch.tensor([[1, 1, 0, 0]])
    ob = obj.prepare({"tokens": torch.zeros(1, 4, dtype=torch.int64), "loss_mask": loss_mask}, _gen(3))
    assert ob.masked.tolist() == [[True, True, False, False]]


def test_micro_batch_cut_is_one_length_for_every_row_and_every_rank():
    """Two "ranks" build the cut generator from (seed, iteration, micro-batch index) alone and cut
    the same micro-batch alike; every row is sliced to that one length, dense (no key-padding
    mask), and every position of it counts."""
    obj = MaskedDiffusionObjective(MASK, variable_length_prob=1.0, variable_length="micro_batch")
    tokens = torch.randint(0, 90, (3, 32), generator=_gen(5))
    lengths = set()
    for rank in (0, 1):
        cut = variable_length_generator(1234, 17, 2)
        ob = obj.prepare({"tokens": tokens}, ObjectiveRng(_gen(100 + rank), cut))
        assert ob.attention_mask is None
        assert ob.input_ids.shape[0] == 3 and ob.labels.shape == ob.input_ids.shape
        assert torch.equal(ob.labels, tokens[:, : ob.input_ids.shape[1]])
        assert int(ob.num_tokens) == 3 * ob.input_ids.shape[1]
        assert ob.lengths.tolist() == [ob.input_ids.shape[1]] * 3
        lengths.add(ob.input_ids.shape[1])
    assert len(lengths) == 1
    # another micro-batch index or iteration draws anew; the draw ignores any rank
    drawn = {obj.cut_length(32, variable_length_generator(1234, it, k)) or 32 for it in range(4) for k in range(4)}
    assert len(drawn) > 1 and all(1 <= n <= 32 for n in drawn)


def test_micro_batch_cut_probability_and_range():
    obj = MaskedDiffusionObjective(MASK, variable_length_prob=0.25, variable_length="micro_batch")
    cuts = [obj.cut_length(8, variable_length_generator(0, it, 0)) for it in range(4000)]
    share = sum(1 for c in cuts if c is not None) / len(cuts)
    assert abs(share - 0.25 * 7 / 8) < 0.02  # a draw of L = 8 is no cut
    assert {c for c in cuts if c is not None} <= set(range(1, 9))
    # a length multiple (context parallelism 2: 2 * cp = 4) rounds down, never below it
    assert {obj.cut_length(8, variable_length_generator(0, it, 0), multiple=4) for it in range(400)} <= {None, 4, 8}


def test_micro_batch_without_cut_generator_never_cuts():
    """Evaluation passes no cut generator: nothing is cut."""
    obj = MaskedDiffusionObjective(MASK, variable_length_prob=1.0, variable_length="micro_batch")
    ob = obj.prepare({"tokens": torch.zeros(2, 8, dtype=torch.int64)}, _gen(0))
    assert ob.input_ids.shape == (2, 8) and ob.attention_mask is None


def _ob(ce_rows, weight_rows):
    """An AR objective batch with given weights: each row j has n_j loss-carrying positions."""
    weights = torch.tensor(weight_rows, dtype=torch.float32)
    tokens = torch.zeros(weights.shape, dtype=torch.int64)
    ob = AutoregressiveObjective().prepare({"tokens": tokens, "labels": tokens, "loss_mask": weights})
    return ob, torch.tensor(ce_rows, dtype=torch.float32)


def _megatron_step(triples, per_token):
    """The step objective megatron-core's schedule builds from the loss functions' triples."""
    if per_token:
        return sum(float(t[0]) for t in triples) / sum(int(t[1]) for t in triples)
    return sum(float(t[0]) / max(int(t[1]), 1) for t in triples) / len(triples)


def _logged(triples):
    total = sum(t[2]["lm loss"] for t in triples)
    return float(total[0] / total[1])


def test_three_normalisations_against_a_hand_sum():
    """Two micro-batches: one of 2 rows x 4 positions, one of 2 rows x 2 (a cut one), known CE.

    micro-batch A: row 0 CE 1 2 3 4 (all count), row 1 CE 2 2 2 2 with the last two at weight 0
    micro-batch B: row 0 CE 6 6, row 1 CE 3 0 with the last at weight 0
      sums: A = 10 + 4 = 14 over 6 tokens, B = 12 + 3 = 15 over 3 tokens
      global_token: (14 + 15) / 9 = 29 / 9
      micro_batch:  (14 / 6 + 15 / 3) / 2 = (7/3 + 5) / 2 = 11 / 3
      sequence:     rows' means 10/4, 4/2, 12/2, 3/1 -> (2.5 + 2 + 6 + 3) / 4 = 13.5 / 4
    """
    a = _ob([[1, 2, 3, 4], [2, 2, 2, 2]], [[1, 1, 1, 1], [1, 1, 0, 0]])
    b = _ob([[6, 6], [3, 0]], [[1, 1], [1, 0]])
    expected = {"global_token": 29 / 9, "micro_batch": 11 / 3, "sequence": 13.5 / 4}
    # the fourth, "micro_batch_masked", counts masked positions (tests/integration/runtime/test_loss_normalization_masked.py)
    assert set(LOSS_NORMALIZATIONS) == set(expected) | {"micro_batch_masked"}
    for mode, value in expected.items():
        triples = [reduce_loss(ce, apply_loss_normalization(ob, mode)) for ob, ce in (a, b)]
        step = _megatron_step(triples, per_token=(mode == "global_token"))
        assert math.isclose(step, value, rel_tol=1e-6), (mode, step, value)
        assert math.isclose(_logged(triples), value, rel_tol=1e-6), (mode, _logged(triples))
    assert len({round(v, 6) for v in expected.values()}) == 3


def test_sequence_normalisation_with_context_parallelism_scales_by_cp():
    """Under CP megatron averages the CP ranks' losses (calculate_per_token_loss off): each rank's
    share of a row's mean is multiplied by cp so the average is the mean over sequences."""
    ob, ce = _ob([[1, 2, 3, 4]], [[1, 1, 1, 1]])
    normed = apply_loss_normalization(ob, "sequence", context_parallel_size=2)
    assert normed.loss_weights.tolist() == [[0.5, 0.5, 0.5, 0.5]] and int(normed.num_tokens) == 1
    # the two CP halves: (1+2)*0.5 / 1 and (3+4)*0.5 / 1, averaged: 2.5 = mean of the row
    assert (1.5 + 3.5) / 2 == 2.5


def test_unknown_options_are_refused():
    with pytest.raises(ValueError):
        MaskedDiffusionObjective(MASK, variable_length="batch")
    with pytest.raises(ValueError):
        MaskedDiffusionObjective(MASK, min_masked_tokens=-1)
    with pytest.raises(ValueError):
        apply_loss_normalization(_ob([[1.0]], [[1.0]])[0], "token")
    obj = build_objective("mdm", mask_token_id=MASK, eps=0.0, loss_weighting="realised", min_masked_tokens=1,
                          variable_length="micro_batch", variable_length_prob=0.01)
    assert obj.variable_length == "micro_batch" and obj.min_masked_tokens == 1
