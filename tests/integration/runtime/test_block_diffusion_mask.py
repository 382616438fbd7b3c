"""Block diffusion's x_t (+) x_0 mask (backends/megatron/masks.py ``block_diffusion``) equals the
paper's definition (Arriola et al. 2025, eq. 8: block-diagonal within x_t, offset block-causal from
x_t to x_0, block-causal within x_0), written here as plain loops over a dense matrix, for small
lengths and every block size that divides them; its FlexAttention BlockMask keeps exactly the
allowed pairs, and its causal-x_0 form (a next-token loss on x_0) is causal inside the clean half."""

from __future__ import annotations

import pytest
import torch

from dlmspec.backends.megatron import masks


def paper_mask(n: int, block: int, *, clean_causal: bool = False) -> torch.Tensor:
    """``[2n, 2n]`` bool, ``True`` = attended, by the paper's three parts, one pair at a time."""
    out = torch.zeros(2 * n, 2 * n, dtype=torch.bool)
    for q in range(2 * n):
        for k in range(2 * n):
            q_clean, k_clean = q >= n, k >= n
            bq, bk = (q % n) // block, (k % n) // block
            if not q_clean and not k_clean:
                out[q, k] = bq == bk  # block-diagonal M_BD
            elif not q_clean and k_clean:
                out[q, k] = bk < bq  # offset block-causal M_OBC
            elif q_clean and k_clean:
                out[q, k] = (k <= q) if clean_causal else (bk <= bq)  # block-causal M_BC
            # a clean query never sees the noised half
    return out


CASES = [(n, b) for n in (1, 2, 4, 6, 8, 12) for b in range(1, n + 1) if n % b == 0]


@pytest.mark.parametrize("n,block", CASES)
@pytest.mark.parametrize("clean_causal", [False, True])
def test_block_diffusion_mask_equals_the_papers_three_parts(n: int, block: int, clean_causal: bool) -> None:
    mask = masks.block_diffusion(n, block, clean_causal=clean_causal)
    dense = mask.allowed(2 * n, 2 * n)[0, 0]
    assert torch.equal(dense, paper_mask(n, block, clean_causal=clean_causal))


def test_block_diffusion_mask_sdpa_lowering_is_the_dense_mask_and_megatron_form_its_negation() -> None:
    mask = masks.block_diffusion(8, 4)
    attn, causal = mask.sdpa(16, 16)
    assert not causal and torch.equal(attn[0, 0], paper_mask(8, 4))
    assert torch.equal(mask.dense(16)[0, 0], ~paper_mask(8, 4))


def test_block_diffusion_block_mask_keeps_exactly_the_allowed_pairs() -> None:
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    n, block, tile = 16, 4, 8
    mask = masks.block_diffusion(n, block)
    block_mask = mask.block_mask(2 * n, 2 * n, "cpu", tile=tile)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 2 * n, 8) for _ in range(3))
    got = flex.flex_attention(q, k, v, block_mask=block_mask)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=paper_mask(n, block))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # tiles wholly masked are skipped: fewer than all (2n/tile)^2 tiles are visited
    visited = int(block_mask.kv_num_blocks.sum()) + int(block_mask.full_kv_num_blocks.sum())
    assert visited < (2 * n // tile) ** 2


@pytest.mark.parametrize("n,block", [(6, 4), (0, 1), (4, 0)])
def test_block_diffusion_mask_refuses_a_length_that_is_not_whole_blocks(n: int, block: int) -> None:
    with pytest.raises(ValueError, match="multiple of block_size"):
        masks.block_diffusion(n, block)


@pytest.mark.parametrize("n,block", [(8, 2), (12, 4), (16, 16), (6, 1)])
@pytest.mark.parametrize("clean_causal", [False, True])
def test_the_planners_keys_per_query_count_the_masks_attended_pairs(n: int, block: int, clean_causal: bool) -> None:
    from dlmspec.objectives.bd3lm import attended_keys_block_diffusion

    pairs = int(masks.block_diffusion(n, block, clean_causal=clean_causal).allowed(2 * n, 2 * n).sum())
    assert attended_keys_block_diffusion(n, block, clean_causal=clean_causal) == pytest.approx(pairs / (2 * n))
