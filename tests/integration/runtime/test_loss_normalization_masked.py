"""``train.loss_normalization = "micro_batch_masked"`` (backends/megatron/objective.py): each
micro-batch's weighted loss sum divided by its own masked positions, averaged over micro-batches
(and data-parallel ranks): the Dream team's SFT trainers' loss (DreamLM/Dream-Coder
``instruct/src/trainer/fsdp_sft_trainer.py:830-831, 850-853``). The step objective is computed as
megatron-core's schedule computes it with ``calculate_per_token_loss`` off (each micro-batch's
sum divided by its ``num_tokens`` and by the number of micro-batches), on CPU."""

import math

import torch

from dlmspec.backends.megatron.objective import (
    ObjectiveBatch,
    apply_loss_normalization,
    build_objective,
    reduce_loss,
)

MASK = 99


def _megatron_step(triples):
    """megatron-core's step objective with calculate_per_token_loss = False."""
    return sum(float(t[0]) / int(t[1]) for t in triples) / len(triples)


def _logged(triples):
    total = sum(t[2]["lm loss"] for t in triples)
    return float(total[0] / total[1])


def _batch(masked_rows, weight_rows):
    """An MDM objective batch of the given masked positions and loss weights (every position a token)."""
    masked = torch.tensor(masked_rows, dtype=torch.bool)
    weights = torch.tensor(weight_rows, dtype=torch.float32)
    zeros = torch.zeros(masked.shape, dtype=torch.int64)
    return ObjectiveBatch(input_ids=zeros, labels=zeros, loss_weights=weights,
                          num_tokens=torch.tensor(masked.numel(), dtype=torch.int), token_mask=torch.ones_like(masked),
                          masked=masked, mask_ratio=torch.full((masked.shape[0],), 0.5))


def test_hand_case_divides_each_micro_batch_by_its_masked_positions():
    """micro-batch A (2 x 4): masked (0,1) (0,3) (1,0), weights 1, 0.5, 2, CE 2, 4, 1 -> sum 2 + 2 + 2 = 6 over
    3 masked = 2; micro-batch B (1 x 4): masked (0,2), weight 1, CE 5 -> 5 over 1 = 5. Step: (2 + 5) / 2 = 3.5.
    'micro_batch' divides by all 8 and 4 positions instead: (6/8 + 5/4) / 2 = 1.0."""
    a = _batch([[0, 1, 0, 1], [1, 0, 0, 0]], [[0, 1, 0, 0.5], [2, 0, 0, 0]])
    ce_a = torch.tensor([[9.0, 2, 9, 4], [1, 9, 9, 9]])
    b = _batch([[0, 0, 1, 0]], [[0, 0, 1, 0]])
    ce_b = torch.tensor([[9.0, 9, 5, 9]])
    masked = [reduce_loss(ce, apply_loss_normalization(ob, "micro_batch_masked")) for ob, ce in ((a, ce_a), (b, ce_b))]
    assert [int(t[1]) for t in masked] == [3, 1]
    assert math.isclose(_megatron_step(masked), 3.5, rel_tol=1e-6)
    assert math.isclose(_logged(masked), 3.5, rel_tol=1e-6)
    per_position = [reduce_loss(ce, apply_loss_normalization(ob, "micro_batch")) for ob, ce in ((a, ce_a), (b, ce_b))]
    assert math.isclose(_megatron_step(per_position), 1.0, rel_tol=1e-6)


def test_matches_the_dream_formula_on_a_cart_weighted_shifted_batch():
    """Real MDM batches (t ~ U(0, 1): eps 0, CART weights, shifted labels) on two data-parallel ranks of two
    micro-batches each: megatron's objective, averaged over the ranks as DDP averages gradients, equals
    mean over (rank, micro-batch) of sum(w * CE) / #masked, the trainer's loss."""
    obj = build_objective("mdm", mask_token_id=MASK, eps=0.0, loss_weighting="cart", shift=True, cart_p=0.1)
    ranks = []
    expected = []
    for rank in range(2):
        triples = []
        for micro in range(2):
            g = torch.Generator()
            g.manual_seed(100 * rank + micro)
            tokens = torch.randint(0, 50, (3, 16), generator=g)
            ob = obj.prepare({"tokens": tokens}, g)
            ce = torch.rand(ob.loss_weights.shape, generator=g) * 5
            assert int(ob.masked.sum()) > 0
            expected.append(float((ce * ob.loss_weights).sum()) / int(ob.masked.sum()))
            triples.append(reduce_loss(ce, apply_loss_normalization(ob, "micro_batch_masked")))
        ranks.append(_megatron_step(triples))
    assert math.isclose(sum(ranks) / len(ranks), sum(expected) / len(expected), rel_tol=1e-5)


def test_a_micro_batch_without_a_masked_position_adds_zero_not_nan():
    ob = _batch([[0, 0, 0]], [[0, 0, 0]])
    loss, count, report = reduce_loss(torch.tensor([[1.0, 2, 3]]), apply_loss_normalization(ob, "micro_batch_masked"))
    assert int(count) == 1 and float(loss) == 0.0 and not torch.isnan(report["lm loss"]).any()


def test_context_parallelism_keeps_the_whole_count_and_scales_by_cp():
    """Under CP megatron averages the CP ranks' losses: the count of the whole micro-batch is kept (the
    slice keeps num_tokens for this normalisation, backends/megatron/stage.py) and the weights are
    multiplied by cp, so the average of the ranks' shares is the micro-batch's masked mean."""
    ob = _batch([[1, 1, 0, 1]], [[1, 1, 0, 1]])
    ce = torch.tensor([[1.0, 2, 9, 6]])
    normed = apply_loss_normalization(ob, "micro_batch_masked", context_parallel_size=2)
    assert int(normed.num_tokens) == 3 and normed.loss_weights.tolist() == [[2, 2, 0, 2]]
    halves = [float((ce[:, :2] * normed.loss_weights[:, :2]).sum()) / 3,
              float((ce[:, 2:] * normed.loss_weights[:, 2:]).sum()) / 3]
    assert math.isclose(sum(halves) / 2, (1 + 2 + 6) / 3, rel_tol=1e-6)


def test_compiled_runtime_config_turns_per_token_loss_off():
    from dlmspec.backends.megatron.checks import check_loss_normalization
    from dlmspec.backends.megatron.config import ObjectiveConfig

    class TC:
        calculate_per_token_loss = False

    check_loss_normalization(ObjectiveConfig(kind="mdm", loss_normalization="micro_batch_masked"), TC())
    TC.calculate_per_token_loss = True
    try:
        check_loss_normalization(ObjectiveConfig(kind="mdm", loss_normalization="micro_batch_masked"), TC())
    except ValueError as exc:
        assert "calculate_per_token_loss=False" in str(exc)
    else:
        raise AssertionError("per-token loss accepted with micro_batch_masked")


def test_the_spec_accepts_it_and_train_py_turns_per_token_loss_off():
    from pathlib import Path

    from dlmspec.render.compile import render
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load

    root = Path(__file__).resolve().parents[3]
    spec = load(root / "specs" / "demo-dlm.toml", ['train.loss_normalization="micro_batch_masked"']).spec
    resolved = resolve(spec)
    source = render(resolved, "specs/demo-dlm.toml")["train.py"]
    assert "calculate_per_token_loss=False" in source
    assert "loss_normalization='micro_batch_masked'" in source
