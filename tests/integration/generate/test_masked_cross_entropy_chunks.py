"""The ELBO's per-position cross entropy is computed in row chunks so that a large evaluation batch
does not cast all its logits to float64 at once; the chunking changes no value."""
import torch
import torch.nn.functional as F

from dlmspec.backends.generate import likelihood
from dlmspec.backends.generate.likelihood import elbo_nll, masked_cross_entropy


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 2, 7, 11, generator=g)
    targets = torch.randint(0, 11, (3, 2, 7), generator=g)
    masked = torch.rand(3, 2, 7, generator=g) < 0.5
    return logits, targets, masked


def test_chunked_cross_entropy_equals_the_whole_batch_in_float64_bit_for_bit() -> None:
    logits, targets, masked = _case()
    whole = torch.zeros(masked.shape, dtype=torch.float64)
    whole[masked] = F.cross_entropy(logits[masked].to(torch.float64), targets[masked], reduction="none")
    for rows in (1, 2, 5, 1000):
        got = masked_cross_entropy(logits, targets, masked, rows_per_chunk=rows)
        assert got.dtype == torch.float64
        assert torch.equal(got, whole), rows
    assert (masked_cross_entropy(logits, targets, masked)[~masked] == 0).all()


def test_no_masked_position_gives_zeros() -> None:
    logits, targets, masked = _case(1)
    got = masked_cross_entropy(logits, targets, torch.zeros_like(masked))
    assert torch.equal(got, torch.zeros(masked.shape, dtype=torch.float64))


def test_the_elbo_does_not_depend_on_the_chunk_size(monkeypatch) -> None:
    vocab, mask_id = 13, 12
    weight = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(3))

    def logits_fn(tokens, attention_mask=None):
        return weight[tokens]

    tokens = torch.randint(0, 12, (2, 9), generator=torch.Generator().manual_seed(4))
    runs = []
    for rows in (1, 3, likelihood.CE_ROWS_PER_CHUNK):
        monkeypatch.setattr(likelihood, "CE_ROWS_PER_CHUNK", rows)
        monkeypatch.setattr(likelihood.masked_cross_entropy, "__kwdefaults__", {"rows_per_chunk": rows})
        res = elbo_nll(logits_fn, tokens, mask_token_id=mask_id, generator=torch.Generator().manual_seed(5),
                       num_samples=8, samples_per_forward=4)
        runs.append(res.samples)
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    assert runs[0].abs().sum() > 0
