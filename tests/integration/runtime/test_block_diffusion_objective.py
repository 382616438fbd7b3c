"""Block diffusion's objective (backends/megatron/objectives/bd3lm.py): one noise level per block,
independent across blocks and inside the (clipped) range, the x_t (+) x_0 input with repeated
position ids, the loss weights 1/t on x_t's masked tokens, prompts kept clean under a loss mask,
the next-token loss on x_0, and ``block_size = L``'s reduction to the MDM loss through a model."""

from __future__ import annotations

import pytest
import torch

from block_diffusion_kit import TinyMaskedLM
from dlmspec.backends.megatron.objective import build_objective
from dlmspec.backends.megatron.objectives.base import ObjectiveRng
from dlmspec.backends.megatron.objectives.bd3lm import BlockDiffusionObjective
from dlmspec.backends.megatron.objectives.mdm import MaskedDiffusionObjective

MASK = 15


def _tokens(b: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 14, (b, n), generator=torch.Generator().manual_seed(seed))


def _block_t(ob, block: int) -> torch.Tensor:
    """Each block's t, read back from the weights 1/t of its masked positions (NaN: none masked)."""
    b, two_l = ob.loss_weights.shape
    w = ob.loss_weights[:, : two_l // 2].reshape(b, -1, block)
    masked = ob.masked[:, : two_l // 2].reshape(b, -1, block)
    inv = torch.where(masked, w, torch.full_like(w, float("nan")))
    return 1.0 / torch.nanmean(inv, dim=2)


def test_each_block_draws_its_own_noise_level_independent_of_the_others() -> None:
    block, blocks, rows = 256, 4, 2000
    obj = BlockDiffusionObjective(MASK, block_size=block)
    ob = obj.prepare({"tokens": _tokens(rows, block * blocks)}, ObjectiveRng(torch.Generator().manual_seed(1)))
    t = _block_t(ob, block)
    keep = ~torch.isnan(t).any(dim=1)
    t = t[keep]
    assert t.shape[0] > 1950
    # a block's masked share follows its own t: within a row the levels differ
    assert float((t.max(dim=1).values - t.min(dim=1).values).mean()) > 0.3
    corr = torch.corrcoef(t.T)
    off_diagonal = corr[~torch.eye(blocks, dtype=torch.bool)]
    assert float(off_diagonal.abs().max()) < 0.07, corr
    # each block's level is U(eps, 1): mean 1/2, variance 1/12
    assert torch.allclose(t.mean(dim=0), torch.full((blocks,), 0.5, dtype=t.dtype), atol=0.03)
    assert torch.allclose(t.var(dim=0), torch.full((blocks,), 1 / 12, dtype=t.dtype), atol=0.01)


def test_the_clipped_range_bounds_every_blocks_noise_level() -> None:
    obj = BlockDiffusionObjective(MASK, block_size=8, noise_range=(0.3, 0.8))
    ob = obj.prepare({"tokens": _tokens(500, 32)}, ObjectiveRng(torch.Generator().manual_seed(2)))
    t = _block_t(ob, 8)
    t = t[~torch.isnan(t)]
    assert float(t.min()) >= 0.3 - 1e-6 and float(t.max()) <= 0.8 + 1e-6
    assert float(t.min()) < 0.35 and float(t.max()) > 0.75


def test_the_input_is_x_t_then_x_0_with_position_ids_repeated() -> None:
    tokens = _tokens(3, 16)
    obj = BlockDiffusionObjective(MASK, block_size=4)
    ob = obj.prepare({"tokens": tokens}, ObjectiveRng(torch.Generator().manual_seed(3)))
    xt, x0 = ob.input_ids[:, :16], ob.input_ids[:, 16:]
    assert torch.equal(x0, tokens) and ob.input_ids.shape == (3, 32)
    assert torch.equal(xt, torch.where(ob.masked[:, :16], torch.full_like(tokens, MASK), tokens))
    assert torch.equal(ob.position_ids, torch.arange(16).repeat(2).expand(3, 32))
    assert torch.equal(ob.labels[:, :16], tokens)
    # the loss: 1/t at x_t's masked positions only, nothing on x_0 without an AR weight
    assert torch.equal(ob.loss_weights[:, :16] != 0, ob.masked[:, :16]) and not ob.loss_weights[:, 16:].any()
    assert int(ob.num_tokens) == 3 * 16 and not ob.token_mask[:, 16:].any()
    assert ob.attention_mask.name == "block_diffusion(n=16, block=4)"


def test_a_loss_mask_keeps_the_prompt_clean_and_noises_the_response_per_block() -> None:
    tokens = _tokens(200, 16, seed=4)
    loss_mask = torch.zeros(200, 16)
    loss_mask[:, 6:] = 1.0  # prompt of 6, response of 10
    obj = BlockDiffusionObjective(MASK, block_size=4)
    ob = obj.prepare({"tokens": tokens, "loss_mask": loss_mask}, ObjectiveRng(torch.Generator().manual_seed(5)))
    assert not ob.masked[:, :6].any() and torch.equal(ob.input_ids[:, :6], tokens[:, :6])
    assert not ob.loss_weights[:, :6].any() and ob.masked[:, 6:16].any()
    assert int(ob.num_tokens) == 200 * 10


def test_the_ar_loss_on_x_0_predicts_the_next_token_and_makes_x_0_causal() -> None:
    tokens = _tokens(2, 8)
    obj = BlockDiffusionObjective(MASK, block_size=4, ar_loss_weight=0.5)
    ob = obj.prepare({"tokens": tokens}, ObjectiveRng(torch.Generator().manual_seed(6)))
    assert torch.equal(ob.labels[:, 8:15], tokens[:, 1:])
    assert torch.equal(ob.loss_weights[:, 8:], torch.tensor([0.5] * 7 + [0.0]).expand(2, 8))
    allowed = ob.attention_mask.allowed(16, 16)[0, 0]
    assert torch.equal(allowed[8:, 8:], torch.ones(8, 8, dtype=torch.bool).tril())


def test_block_size_equal_to_the_length_is_the_mdm_loss() -> None:
    tokens, eps = _tokens(4, 12, seed=7), 1e-3
    bd3 = BlockDiffusionObjective(MASK, block_size=12, noise_range=(eps, 1.0))
    mdm = MaskedDiffusionObjective(MASK, eps=eps)
    ob = bd3.prepare({"tokens": tokens}, ObjectiveRng(torch.Generator().manual_seed(8)))
    om = mdm.prepare({"tokens": tokens}, ObjectiveRng(torch.Generator().manual_seed(8)))
    assert torch.equal(ob.masked[:, :12], om.masked) and torch.equal(ob.input_ids[:, :12], om.input_ids)
    torch.testing.assert_close(ob.loss_weights[:, :12], om.loss_weights)
    model = TinyMaskedLM(vocab=16, seed=9)
    ce = torch.nn.functional.cross_entropy
    logits_bd3 = model(ob.input_ids, ob.position_ids, ob.attention_mask)
    loss_bd3 = (ce(logits_bd3.transpose(1, 2), ob.labels, reduction="none") * ob.loss_weights).sum() / ob.num_tokens
    logits_mdm = model(om.input_ids, torch.arange(12).expand(4, 12), None)
    loss_mdm = (ce(logits_mdm.transpose(1, 2), om.labels, reduction="none") * om.loss_weights).sum() / om.num_tokens
    assert float(loss_mdm) > 0
    torch.testing.assert_close(loss_bd3, loss_mdm, rtol=1e-5, atol=1e-6)


def test_the_objective_is_built_from_the_compiled_options() -> None:
    from types import SimpleNamespace

    config = SimpleNamespace(kind="bd3lm", mask_token_id=MASK, eps=1e-3,
                             options={"block_size": 4, "noise_range": [0.2, 0.9], "ar_loss_weight": 0.0})
    obj = build_objective(config)
    assert isinstance(obj, BlockDiffusionObjective) and obj.block_size == 4 and obj.noise_range == (0.2, 0.9)
    with pytest.raises(ValueError, match="block_size"):
        build_objective(SimpleNamespace(kind="bd3lm", mask_token_id=MASK, eps=1e-3, options={}))


@pytest.mark.parametrize("kwargs,match", [
    (dict(block_size=0), "block_size"), (dict(block_size=4, noise_range=(0.8, 0.3)), "noise_range"),
    (dict(block_size=4, ar_loss_weight=float("nan")), "ar_loss_weight"),
])
def test_out_of_range_settings_are_refused(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        BlockDiffusionObjective(MASK, **kwargs)


def test_a_length_that_is_not_whole_blocks_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of block_size"):
        BlockDiffusionObjective(MASK, block_size=5).prepare({"tokens": _tokens(1, 12)})
