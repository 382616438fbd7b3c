"""What a step commits under Fast-dLLM's parallel decoding rules (sampler.commit_positions): the confidence
threshold and the factor rule, each against its formula; forward passes per row when rows finish at
different steps; the vocabulary-parallel argmax and confidence (block_cache.vocab_parallel_greedy) equal the
gathered ones, at TP = 1 and over a 2-rank gloo group."""

from __future__ import annotations

import os

import pytest
import torch


def _fast_dllm_factor_count(sorted_conf: list[float], factor: float) -> int:
    """The factor rule as Fast-dLLM's llada/generate.py ``get_transfer_index_dynamic`` loops over one row:
    thresholds ``1 - factor / (n + 1)`` for n = 1..N, the first forced; stop at the first failure."""
    n_masked = len(sorted_conf)
    thresholds = [1 - factor / (n + 1) for n in range(1, n_masked + 1)]
    thresholds[0] = -1
    top_i = 0
    for top_i in range(n_masked):
        if sorted_conf[top_i] < thresholds[top_i]:
            break
    if top_i == 0 or top_i == n_masked - 1:
        top_i += 1
    return top_i


def test_the_factor_rule_commits_the_leading_run_of_confidences_above_one_minus_f_over_n_plus_one():
    from dlmspec.backends.generate.sampler import commit_positions

    # sorted: 0.95 (n=1, forced), 0.8 >= 1 - 1/3, 0.7 < 1 - 1/4: two committed, the two most confident
    confidence = torch.tensor([[0.7, 0.95, 0.1, 0.8, 0.05]], dtype=torch.float64)
    masked = torch.tensor([[True, True, True, True, True]])
    chosen = commit_positions(confidence, masked, factor=1.0)
    assert chosen.tolist() == [[False, True, False, True, False]]
    # a position not masked is never committed, however confident: 0.8 (forced), 0.7 >= 1 - 1/3, 0.1 < 1 - 1/4
    chosen = commit_positions(confidence, torch.tensor([[True, False, True, True, True]]), factor=1.0)
    assert chosen.tolist() == [[True, False, False, True, False]]
    # only the last of the masked fails (0.05 < 1 - 1/5): Fast-dLLM's loop commits all of them
    chosen = commit_positions(confidence, torch.tensor([[True, False, False, True, True]]), factor=1.0)
    assert chosen.tolist() == [[True, False, False, True, True]]


@pytest.mark.parametrize("factor", [0.25, 1.0, 2.0, 4.0])
def test_the_factor_rule_commits_what_fast_dllms_loop_commits(factor):
    from dlmspec.backends.generate.sampler import commit_positions

    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        confidence = torch.rand(3, 8, generator=g, dtype=torch.float64) ** 0.3
        masked = torch.rand(3, 8, generator=g) < 0.7
        masked[:, 0] = True
        chosen = commit_positions(confidence, masked, factor=factor)
        for row in range(3):
            conf = sorted(confidence[row][masked[row]].tolist(), reverse=True)
            count = _fast_dllm_factor_count(conf, factor)
            assert int(chosen[row].sum()) == count
            picked = confidence[row][chosen[row]]
            left = confidence[row][masked[row] & ~chosen[row]]
            assert left.numel() == 0 or picked.min() >= left.max()  # the most confident ones


def test_the_threshold_rule_commits_every_confidence_at_or_above_it_and_at_least_one():
    from dlmspec.backends.generate.sampler import commit_positions

    confidence = torch.tensor([[0.95, 0.5, 0.9, 0.2], [0.3, 0.6, 0.1, 0.5]], dtype=torch.float64)
    masked = torch.ones(2, 4, dtype=torch.bool)
    chosen = commit_positions(confidence, masked, threshold=0.9)
    assert chosen.tolist() == [[True, False, True, False], [False, True, False, False]]


class _RowConfidence:
    """Logits: row 0 certain at every position (one step a block under any parallel rule), row 1 nearly flat."""

    def __init__(self, vocab: int = 8) -> None:
        self.vocab = vocab

    def __call__(self, tokens, attention_mask=None):
        b, length = tokens.shape
        logits = torch.zeros(b, length, self.vocab)
        logits[0, :, 1] = 30.0
        logits[1:, :, 2] = 0.1 + 0.01 * torch.arange(length)  # the leftmost is least confident, never >= 0.9
        return logits


@pytest.mark.parametrize("remasking", ["threshold", "factor"])
def test_forward_passes_are_reported_per_row_when_rows_finish_at_different_steps(remasking):
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.sampler import generate

    config = GenerateConfig(gen_length=8, steps=8, block_length=4, remasking=remasking, mask_token_id=7,
                            threshold=0.9, factor=0.01)
    out = generate(_RowConfidence(), [[3, 4], [3, 5]], config)
    # row 0: one step a block; row 1: one token a step (factor: the last two together, Fast-dLLM's N - 1 rule)
    expected = [2, 8] if remasking == "threshold" else [2, 6]
    assert out.forward_passes_per_row == expected
    assert out.forward_passes == expected[1] and out.to_dict()["forward_passes_per_row"] == expected


def test_the_vocabulary_parallel_argmax_and_confidence_equal_the_gathered_ones_at_one_rank():
    from dlmspec.backends.generate.block_cache import vocab_parallel_greedy
    from dlmspec.backends.generate.sampler import sample_tokens

    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(1)) * 4
    logits[0, 0, 3] = logits[0, 0, 7] = 50.0  # a tie: the smallest id, as torch.argmax
    tokens, confidence = vocab_parallel_greedy(logits)
    ref_tokens, ref_confidence = sample_tokens(logits, temperature=0.0)
    assert torch.equal(tokens, ref_tokens) and tokens[0, 0] == 3
    assert torch.allclose(confidence, ref_confidence, rtol=1e-12, atol=0)


def _two_ranks(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from dlmspec.backends.generate.block_cache import vocab_parallel_greedy

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        logits = torch.randn(3, 5, 12, generator=torch.Generator().manual_seed(1)) * 4
        logits[0, 0, 2] = logits[0, 0, 9] = 50.0  # a tie across the shards: rank 0's id
        logits[1, 1, 8] = 60.0  # the maximum on rank 1's shard
        shard = logits[..., rank * 6:(rank + 1) * 6]
        tokens, confidence = vocab_parallel_greedy(shard, group=dist.group.WORLD, vocab_start=rank * 6)
        torch.save({"tokens": tokens, "confidence": confidence, "logits": logits}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.xdist_group("gloo")
def test_the_vocabulary_parallel_argmax_and_confidence_equal_the_gathered_ones_over_two_gloo_ranks(tmp_path):
    from cpu_world_kit import spawn_world
    from dlmspec.backends.generate.sampler import sample_tokens

    out = str(tmp_path / "result")
    spawn_world(_two_ranks, args=(str(tmp_path / "store"), out), nprocs=2)
    results = [torch.load(f"{out}.{rank}") for rank in range(2)]
    ref_tokens, ref_confidence = sample_tokens(results[0]["logits"], temperature=0.0)
    for r in results:
        assert torch.equal(r["tokens"], ref_tokens)
        assert torch.allclose(r["confidence"], ref_confidence, rtol=1e-12, atol=0)
    assert ref_tokens[0, 0] == 2 and ref_tokens[1, 1] == 8
