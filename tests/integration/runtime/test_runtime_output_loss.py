"""The fused output projection + cross entropy (backends/megatron/output_loss.py) against the
plain computation: full logits, per-token cross entropy, weighted sum (what megatron's
GPTModel + reduce_loss do)."""

import pytest

torch = pytest.importorskip("torch")

from dlmspec.backends.megatron.output_loss import (  # noqa: E402
    ChunkedLinearCrossEntropy,
    linear_cross_entropy,
    resolve_fused_linear_impl,
)


def _reference(hidden, weight, labels, weights):
    logits = hidden.reshape(-1, hidden.shape[-1]) @ weight.t()
    ce = torch.nn.functional.cross_entropy(logits.float(), labels.reshape(-1), reduction="none")
    return (ce * weights.reshape(-1)).sum()


def _inputs(b=3, s=10, h=16, v=37, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, s, h, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, h, generator=g, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, v, (b, s), generator=g)
    # per-sequence weights 1/t on ~half the positions, zero elsewhere (an MDM batch)
    t = torch.rand(b, 1, generator=g, dtype=torch.float64) * 0.9 + 0.1
    masked = torch.rand(b, s, generator=g) < 0.5
    weights = torch.where(masked, 1.0 / t, torch.zeros_like(t)).float()
    return hidden, weight, labels, weights


@pytest.mark.parametrize("chunk_rows", [1, 4, 7, 1000])
def test_chunked_equals_full_logits_value_and_gradients(chunk_rows):
    hidden, weight, labels, weights = _inputs()
    ref = _reference(hidden, weight, labels, weights.double())
    gh_ref, gw_ref = torch.autograd.grad(ref * 2.5, (hidden, weight))
    got = linear_cross_entropy(hidden, weight, labels, weights, impl="torch", chunk_rows=chunk_rows)
    gh, gw = torch.autograd.grad(got * 2.5, (hidden, weight))  # a non-unit upstream gradient
    assert got.dtype == torch.float32
    # fp64 inputs; the logits are reduced in fp32 (as megatron does): fp32-level agreement
    torch.testing.assert_close(got.double(), ref.double(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(gh, gh_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw, gw_ref, rtol=1e-4, atol=1e-5)
    # rows of weight 0 get no gradient at all (they never reach the projection)
    assert float(gh.reshape(-1, gh.shape[-1])[weights.reshape(-1) == 0].abs().sum()) == 0.0


def test_bf16_matches_the_fp32_loss_within_bf16_rounding():
    hidden, weight, labels, weights = _inputs(b=2, s=64, h=32, v=101, dtype=torch.float32)
    ref = _reference(hidden, weight, labels, weights)
    got = linear_cross_entropy(hidden.bfloat16(), weight.detach().bfloat16().requires_grad_(), labels, weights, impl="torch")
    assert abs(float(got) - float(ref)) / float(ref) < 2e-2


def test_no_weighted_rows_gives_zero_and_a_connected_graph():
    hidden, weight, labels, _ = _inputs()
    got = linear_cross_entropy(hidden, weight, labels, torch.zeros(3, 10), impl="torch")
    assert float(got) == 0.0
    gh, gw = torch.autograd.grad(got, (hidden, weight))
    assert float(gh.abs().sum()) == 0.0 and float(gw.abs().sum()) == 0.0


def test_errors_and_impl_resolution():
    hidden, weight, labels, weights = _inputs()
    with pytest.raises(ValueError, match="agree"):
        linear_cross_entropy(hidden, weight, labels[:, :5], weights, impl="torch")
    with pytest.raises(ValueError, match="hidden size"):
        linear_cross_entropy(hidden, weight[:, :5], labels, weights, impl="torch")
    with pytest.raises(ValueError, match="impl"):
        linear_cross_entropy(hidden, weight, labels, weights, impl="nope")
    assert resolve_fused_linear_impl("auto", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="liger"):
        resolve_fused_linear_impl("liger", torch.device("cpu"))
    with pytest.raises(ValueError):
        resolve_fused_linear_impl("triton", torch.device("cpu"))


def test_autograd_function_without_weight_gradient():
    hidden, weight, labels, weights = _inputs()
    x = hidden.detach().reshape(-1, 16).requires_grad_()
    out = ChunkedLinearCrossEntropy.apply(x, weight.detach(), labels.reshape(-1), weights.reshape(-1), 5)
    (gx,) = torch.autograd.grad(out, (x,))
    ref = _reference(x.reshape(3, 10, 16), weight.detach(), labels, weights.double())
    (gx_ref,) = torch.autograd.grad(ref, (x,))
    torch.testing.assert_close(gx, gx_ref, rtol=1e-4, atol=1e-5)
