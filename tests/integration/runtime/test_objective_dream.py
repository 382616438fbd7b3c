"""CPU tests of Dream's two objective options against hand computations
(backends/megatron/objective.py; sources and formulas: docs/recipes.md, "Dream 7B"):

* ``shift``: the logits at output position ``i - 1`` predict the token at ``i`` (Dream keeps the AR
  head's alignment: DreamLM/Dream@fac0a7f ``eval/eval.py:352-354``, DreamLM/Dream-Coder@87409da
  ``instruct/src/trainer/fsdp_sft_trainer.py:777-786``), so megatron's labels are the clean ids
  shifted left; position 0 (no logit before it) is never masked and the last output position has
  no target.
* ``loss_weighting = "cart"``: per masked position ``n``, ``w_n = 1/2 * sum_{i != n} 1[x_t^i != M]
  * p * (1 - p)^(|n - i| - 1)`` (Dream-Coder ``fsdp_sft_trainer.py:93-112, 802-818``), no ``1/t``.
"""

import math

import pytest
import torch

from dlmspec.backends.megatron.objective import MaskedDiffusionObjective, build_objective, cart_weights, reduce_loss

MASK = 99


def _gen(seed=0):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _fake_draws(monkeypatch, values):
    """torch.rand returns ``values`` in turn (then real draws): the objective's t uniforms [b], then
    the per-token uniforms [b, s]."""
    draws = iter(values)
    real_rand = torch.rand

    def fake_rand(*args, **kwargs):
        try:
            return next(draws)
        except StopIteration:
            return real_rand(*args, **kwargs)

    monkeypatch.setattr(torch, "rand", fake_rand)


def test_shift_hand_case(monkeypatch):
    """A 4-token row with only position 2 masked: one loss term, the logits of output position 1
    against x0[2], weight 1/t; the labels are x0 shifted left."""
    tokens = torch.tensor([[10, 11, 12, 13]])
    # t = 0.5 (eps 0 is fine here: the weight is 1/t = 2); uniforms: only position 2 below t
    _fake_draws(monkeypatch, [torch.tensor([0.5]), torch.tensor([[0.9, 0.9, 0.1, 0.9]])])
    obj = MaskedDiffusionObjective(MASK, eps=0.0, loss_weighting="realised", shift=True)
    ob = obj.prepare({"tokens": tokens}, _gen())
    assert ob.input_ids.tolist() == [[10, 11, MASK, 13]]
    assert ob.labels[0, :3].tolist() == [11, 12, 13]
    # realised ratio: 1 masked of the 3 maskable positions (position 0 cannot be masked): weight 3
    assert ob.loss_weights.tolist() == [[0.0, 3.0, 0.0, 0.0]]
    ce = torch.tensor([[1.0, 2.0, 4.0, 8.0]])  # CE of each output position against its label
    loss_sum, num_tokens, _ = reduce_loss(ce, ob)
    assert float(loss_sum) == 3.0 * 2.0  # only output position 1 (which predicts x0[2]) counts
    assert int(num_tokens) == 4  # the normaliser still counts the window's positions (b * s)


def test_shift_never_masks_position_zero(monkeypatch):
    """Every uniform below t: without shift all 4 positions are masked, with it positions 1..3; the
    llada weight 1/t moves one position left, the last output position weighs 0."""
    tokens = torch.tensor([[10, 11, 12, 13]])
    _fake_draws(monkeypatch, [torch.tensor([0.5]), torch.zeros(1, 4)])
    ob = MaskedDiffusionObjective(MASK, eps=0.0, loss_weighting="llada", shift=True).prepare({"tokens": tokens}, _gen())
    assert ob.masked.tolist() == [[False, True, True, True]]
    assert ob.input_ids.tolist() == [[10, MASK, MASK, MASK]]
    assert ob.loss_weights.tolist() == [[2.0, 2.0, 2.0, 0.0]]
    assert ob.labels[0, :3].tolist() == [11, 12, 13]


def test_shift_with_a_forced_mask_never_forces_position_zero():
    """min_masked_tokens draws among the maskable positions: with shift, position 0 is not one."""
    tokens = torch.arange(2).view(1, 2) + 10
    for seed in range(20):
        obj = MaskedDiffusionObjective(MASK, eps=0.0, loss_weighting="realised", min_masked_tokens=1, shift=True)
        ob = obj.prepare({"tokens": tokens}, _gen(seed))
        assert ob.masked.tolist() == [[False, True]]
        assert ob.loss_weights.tolist() == [[1.0, 0.0]]  # ratio 1 / 1 maskable position


def test_shift_off_is_todays_stream():
    """shift = False (the default) draws and returns exactly what the objective returned before."""
    tokens = torch.randint(0, 50, (3, 16), generator=_gen(5))
    a = MaskedDiffusionObjective(MASK).prepare({"tokens": tokens}, _gen(1))
    b = MaskedDiffusionObjective(MASK, shift=False).prepare({"tokens": tokens}, _gen(1))
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_weights, b.loss_weights)
    assert torch.equal(a.labels, tokens)


def _cart_by_hand(masked_row, p, length=None):
    """The direct double sum of Dream-Coder's weight for one row (python floats)."""
    s = len(masked_row)
    length = s if length is None else length
    out = []
    for n in range(s):
        if not masked_row[n] or n >= length:
            out.append(0.0)
            continue
        out.append(0.5 * sum(p * (1 - p) ** (abs(n - i) - 1)
                             for i in range(length) if i != n and not masked_row[i]))
    return out


def test_cart_weights_against_the_double_sum():
    """A 5-token row, masks at 1, 2 and 4, p = 0.1: w_1 = 1/2 (p + p(1-p)^2 ... ) by hand."""
    masked = torch.tensor([[False, True, True, False, True]])
    p = 0.1
    w = cart_weights(masked, torch.ones_like(masked), p)
    # position 1: clean 0 (distance 1), 3 (distance 2) -> 1/2 (p + p(1-p))
    assert w[0, 1].item() == pytest.approx(0.5 * (p + p * (1 - p)), rel=1e-6)
    # position 2: clean 0 (distance 2), 3 (distance 1) -> 1/2 (p(1-p) + p)
    assert w[0, 2].item() == pytest.approx(0.5 * (p * (1 - p) + p), rel=1e-6)
    # position 4: clean 3 (distance 1), 0 (distance 4) -> 1/2 (p + p(1-p)^3)
    assert w[0, 4].item() == pytest.approx(0.5 * (p + p * (1 - p) ** 3), rel=1e-6)
    assert w[0, 0].item() == 0.0 and w[0, 3].item() == 0.0  # clean positions weigh nothing
    assert w[0].tolist() == pytest.approx(_cart_by_hand(masked[0].tolist(), p), rel=1e-6)


def test_cart_weights_random_rows_and_the_valid_length():
    """Random rows, several p, against the double sum; positions beyond a row's length (a
    per-sequence cut: not attended) are not context and carry no weight."""
    g = _gen(3)
    for p in (0.05, 0.1, 0.5, 0.9):
        masked = torch.rand(4, 23, generator=g) < 0.5
        present = torch.ones_like(masked)
        present[1, 17:] = False
        w = cart_weights(masked & present, present, p)
        for j in range(4):
            length = 17 if j == 1 else 23
            assert w[j].tolist() == pytest.approx(_cart_by_hand(masked[j].tolist(), p, length), rel=1e-5, abs=1e-7)


def test_cart_objective_uses_the_cart_weight_and_no_one_over_t(monkeypatch):
    """loss_weighting = "cart": the masked positions' weights are the CART weights of the drawn
    mask (no 1/t factor, Dream-Coder fsdp_sft_trainer.py:802-824), with shift moved one left."""
    tokens = torch.tensor([[10, 11, 12, 13, 14]])
    _fake_draws(monkeypatch, [torch.tensor([0.25]), torch.tensor([[0.0, 0.1, 0.9, 0.9, 0.2]])])
    p = 0.3
    ob = MaskedDiffusionObjective(MASK, loss_weighting="cart", cart_p=p).prepare({"tokens": tokens}, _gen())
    row = [True, True, False, False, True]
    assert ob.masked[0].tolist() == row
    assert ob.loss_weights[0].tolist() == pytest.approx(_cart_by_hand(row, p), rel=1e-6)

    _fake_draws(monkeypatch, [torch.tensor([0.25]), torch.tensor([[0.0, 0.1, 0.9, 0.9, 0.2]])])
    ob = MaskedDiffusionObjective(MASK, loss_weighting="cart", cart_p=p, shift=True).prepare({"tokens": tokens}, _gen())
    row = [False, True, False, False, True]  # position 0 is never masked with shift
    assert ob.masked[0].tolist() == row
    assert ob.loss_weights[0].tolist() == pytest.approx(_cart_by_hand(row, p)[1:] + [0.0], rel=1e-6)


def test_cart_and_shift_through_build_objective_and_bad_values():
    obj = build_objective("mdm", mask_token_id=MASK, loss_weighting="cart", cart_p=0.1, shift=True)
    assert (obj.loss_weighting, obj.cart_p, obj.shift) == ("cart", 0.1, True)
    for bad in (0.0, 1.0, -0.5, math.nan):
        with pytest.raises(ValueError, match="cart_p"):
            MaskedDiffusionObjective(MASK, loss_weighting="cart", cart_p=bad)


# ---------------------------------------------------------------- MegaDLMs' 2,049-token window (objective.unshift)
def _window_step(objective, s=8, rows=2):
    from dlmspec.backends.megatron.microbatches import MicrobatchItem
    from dlmspec.backends.megatron.rng import TRAIN_STREAM
    from dlmspec.backends.megatron.stage import ObjectiveForwardStep

    # megatron's GPTDataset with add_extra_token_to_sequence: s + 1 ids drawn, tokens = text[:-1], labels = text[1:]
    text = torch.arange(rows * (s + 1)).view(rows, s + 1) + 1000
    batch = {"tokens": text[:, :-1].clone(), "labels": text[:, 1:].clone(),
             "position_ids": torch.arange(s).expand(rows, s).clone(), "loss_mask": torch.ones(rows, s)}
    step = ObjectiveForwardStep(objective, seed=7, data_parallel_rank=0, eod_id=0, device=torch.device("cpu"))
    return text, [step.prepare(MicrobatchItem(TRAIN_STREAM, it, 0, batch)) for it in range(40)]


def test_unshift_sees_ids_1_to_s_minus_1_of_the_window():
    """MegaDLMs gpt_model.py:427-431: input_ids[:, 1:], position_ids[:, 1:], labels[:, :-1]: of the s + 1
    ids drawn, the model sees and predicts text[1 : s] (s - 1 positions), at positions 1 .. s - 1."""
    s = 8
    obj = MaskedDiffusionObjective(MASK, eps=0.0, loss_weighting="realised", min_masked_tokens=1, unshift=True)
    text, prepared = _window_step(obj, s)
    ob, position_ids, attention_mask = prepared[0]
    assert ob.labels.tolist() == text[:, 1:s].tolist()
    assert position_ids.tolist() == [list(range(1, s))] * 2
    assert ob.input_ids.shape == (2, s - 1) and attention_mask is None
    unmasked = ~ob.masked
    assert torch.equal(ob.input_ids[unmasked], text[:, 1:s][unmasked])
    assert int(ob.num_tokens) == 2 * (s - 1)


def test_unshift_with_the_micro_batch_cut_keeps_megadlms_range():
    """The cut comes first (L' ~ U{2 .. s} of the s tokens, gpt_model.py:418-421), then the unshift: the
    model sees text[1 : L'], L' - 1 in 1 .. s - 1 positions, every row alike."""
    s = 8
    obj = MaskedDiffusionObjective(MASK, variable_length_prob=1.0, variable_length="micro_batch", unshift=True)
    text, prepared = _window_step(obj, s)
    lengths = set()
    for ob, position_ids, _ in prepared:
        n = ob.input_ids.shape[1]
        lengths.add(n)
        assert 1 <= n <= s - 1
        assert ob.labels.tolist() == text[:, 1:1 + n].tolist()
        assert position_ids[0].tolist() == list(range(1, 1 + n))
    assert len(lengths) > 3


def test_the_dataset_draws_the_extra_token_exactly_for_ar_and_unshift():
    from dlmspec.backends.megatron.objective import dataset_extra_token

    assert dataset_extra_token(build_objective("ar")) is True
    assert dataset_extra_token(build_objective("mdm", mask_token_id=MASK)) is False
    assert dataset_extra_token(build_objective("mdm", mask_token_id=MASK, unshift=True)) is True
