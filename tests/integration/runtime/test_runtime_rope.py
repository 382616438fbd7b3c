"""dlmspec.backends.megatron.rope: the fused RoPE computes megatron-core's RoPE and is routed in and out."""

import pytest
import torch

from megatron.core.models.common.embeddings import rope_utils

from dlmspec.backends.megatron import rope


def _freqs(s, d, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    return torch.cat([angles, angles], dim=-1)[:, None, None, :]  # [s, 1, 1, d], megatron's layout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_equals_megatron_unfused_rope(dtype):
    torch.manual_seed(0)
    t = torch.randn(16, 2, 4, 8, dtype=dtype)
    freqs = _freqs(16, 8)
    ours = rope.rope_reference(t, freqs)
    theirs = rope_utils._apply_rotary_pos_emb_bshd(t, freqs)
    assert ours.shape == theirs.shape == t.shape
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_reference_result_is_laid_out_bhsd_for_attention():
    t = torch.randn(16, 2, 4, 8)
    out = rope.rope_reference(t, _freqs(16, 8))
    assert out.permute(1, 2, 0, 3).is_contiguous()  # what SDPACoreAttention hands to SDPA


def test_gradient_equals_megatron():
    torch.manual_seed(1)
    t1 = torch.randn(8, 2, 3, 16, requires_grad=True)
    t2 = t1.detach().clone().requires_grad_()
    freqs = _freqs(8, 16)
    g = torch.randn(8, 2, 3, 16)
    rope.rope_reference(t1, freqs).backward(g)
    rope_utils._apply_rotary_pos_emb_bshd(t2, freqs).backward(g)
    torch.testing.assert_close(t1.grad, t2.grad)


def test_install_routes_megatron_and_keeps_other_cases_on_the_original():
    original = rope_utils._apply_rotary_pos_emb_bshd
    try:
        assert rope.install_fused_rope() and rope.install_fused_rope()  # idempotent
        assert rope_utils._apply_rotary_pos_emb_bshd is rope._fused_bshd
        t = torch.randn(16, 2, 4, 8)
        freqs = _freqs(16, 8)
        # CPU tensors (and interleaved / MLA / mscale cases) go to megatron-core's function
        torch.testing.assert_close(rope_utils._apply_rotary_pos_emb_bshd(t, freqs), original(t, freqs))
        torch.testing.assert_close(
            rope_utils._apply_rotary_pos_emb_bshd(t, freqs, rotary_interleaved=True),
            original(t, freqs, rotary_interleaved=True),
        )
    finally:
        rope.uninstall_fused_rope()
    assert rope_utils._apply_rotary_pos_emb_bshd is original
