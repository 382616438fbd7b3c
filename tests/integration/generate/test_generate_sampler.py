"""CPU tests of the sampler (backends/generate/sampler.py) and its settings (config.py) on tiny models."""

from __future__ import annotations

import json

import pytest
import torch

from dlmspec.backends.generate.config import GenerateConfig, GenerateConfigError
from dlmspec.backends.generate.sampler import (
    classifier_free_guidance,
    commit_positions,
    filter_logits,
    generate,
    generate_ar,
    num_transfer_tokens,
    sample_tokens,
)
from tiny_lm import PositionTable, TinyTransformer

VOCAB = 8  # ids 0..6 are text, 7 is the mask
MASK = 7
EOS = 6


def _config(**kw):
    base = dict(gen_length=12, steps=6, block_length=4, mask_token_id=MASK)
    base.update(kw)
    return GenerateConfig(**base)


def _record(events):
    def on_step(event):
        events.append((event.step, event.block, event.tokens.clone(), event.committed.clone()))
    return on_step


# ------------------------------------------------------------------ settings


def test_defaults_are_llada_and_are_recorded():
    c = GenerateConfig(mask_token_id=126336)
    d = c.to_dict()
    assert (d["steps"], d["gen_length"], d["block_length"], d["temperature"], d["cfg_scale"], d["remasking"]) == (
        128, 128, 128, 0.0, 0.0, "low_confidence")
    out = generate(TinyTransformer(VOCAB), [[1, 2]], _config(seed=3))
    assert out.config == _config(seed=3).to_dict() and out.to_dict()["config"]["seed"] == 3
    assert json.loads(json.dumps(out.to_dict()))["generated"] == out.generated  # what --json would print


@pytest.mark.parametrize("kw, field, fix", [
    (dict(block_length=5), "block_length", "block_length = 4"),
    (dict(steps=7), "steps", "steps = 6"),
    (dict(steps=13), "steps", "steps = 12"),
    (dict(remasking="greedy"), "remasking", "'threshold'"),
    (dict(threshold=0.0), "threshold", "0.9"),
    (dict(temperature=-1.0), "temperature", "temperature = 0.0"),
    (dict(top_p=1.5), "top_p", "0.95"),
    (dict(top_k=0), "top_k", "50"),
    (dict(mask_token_id=None), "mask_token_id", "126336"),
    (dict(eos_token_id=MASK), "eos_token_id", "EOS"),
    (dict(gen_length=0), "gen_length", "128"),
])
def test_a_bad_setting_names_field_value_and_a_remedy(kw, field, fix):
    with pytest.raises(GenerateConfigError) as err:
        _config(**kw)
    assert isinstance(err.value, ValueError) and err.value.field == field
    message = str(err.value)
    assert message.startswith(f"{field} = {kw[field]!r}") and fix in message


def test_the_suggested_remedy_is_accepted():
    for kw in (dict(block_length=5), dict(steps=7), dict(steps=13)):
        with pytest.raises(GenerateConfigError) as err:
            _config(**kw)
        field, value = err.value.fix.split(" = ")
        _config(**{**kw, field: int(value)})  # no error


def test_config_is_frozen():
    with pytest.raises(Exception):
        _config().steps = 3  # type: ignore[misc]


# ------------------------------------------------------------------ building blocks


def test_transfer_schedule_is_llada_s():
    sched = num_transfer_tokens(torch.tensor([10, 4, 0, 3]), 4)
    assert sched.tolist() == [[3, 3, 2, 2], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0]]


def test_commit_positions_by_count_and_threshold():
    conf = torch.tensor([[0.1, 0.9, 0.5, 0.95], [0.2, 0.3, 0.1, 0.0]])
    masked = torch.tensor([[True, True, True, False], [True, True, True, True]])
    by_count = commit_positions(conf, masked, count=torch.tensor([2, 1]))
    assert by_count.tolist() == [[False, True, True, False], [False, True, False, False]]
    by_threshold = commit_positions(conf, masked, threshold=0.4)
    # row 0: 0.9 and 0.5 pass (0.95 is not masked); row 1: none passes, the most confident is taken.
    assert by_threshold.tolist() == [[False, True, True, False], [False, True, False, False]]


def test_gumbel_max_draws_from_softmax_over_temperature():
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0]).expand(40000, 4)
    g = torch.Generator().manual_seed(0)
    tokens, conf = sample_tokens(logits, temperature=2.0, generator=g)
    freq = torch.bincount(tokens, minlength=4).double() / len(tokens)
    expected = torch.softmax(logits[0].double() / 2.0, dim=0)
    assert torch.allclose(freq, expected, atol=0.01)
    # the confidence is the probability of the draw without the temperature (LLaDA's x0_p)
    assert torch.allclose(conf, torch.softmax(logits[0].double(), 0)[tokens])


def test_top_k_and_top_p_never_draw_outside_their_set():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0]).expand(5000, 5)
    g = torch.Generator().manual_seed(1)
    tokens, _ = sample_tokens(logits, temperature=1.0, top_k=2, generator=g)
    assert set(tokens.tolist()) == {0, 1}
    p = torch.softmax(logits[0], 0)  # 0.64, 0.23, 0.09, ...: top_p = 0.8 keeps {0, 1}
    assert float(p[0]) < 0.8 < float(p[:2].sum())
    tokens, _ = sample_tokens(logits, temperature=1.0, top_p=0.8, generator=g)
    assert set(tokens.tolist()) == {0, 1}
    kept = filter_logits(logits[:1], top_p=0.5)
    assert torch.isfinite(kept).tolist() == [[True, False, False, False, False]]


def test_cfg_scale_zero_is_the_conditional_logits():
    cond, uncond = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    assert torch.equal(classifier_free_guidance(cond, uncond, 0.0), cond)
    assert torch.allclose(classifier_free_guidance(cond, uncond, 1.5), uncond + 2.5 * (cond - uncond))


# ------------------------------------------------------------------ masked diffusion


@pytest.mark.parametrize("kw", [
    dict(),
    dict(remasking="random"),
    dict(remasking="threshold", threshold=0.3),
    dict(temperature=1.0, top_k=4),
    dict(temperature=0.7, top_p=0.9, cfg_scale=1.0),
])
def test_a_committed_token_never_changes(kw):
    events = []
    out = generate(TinyTransformer(VOCAB, seed=2), [[1, 2, 3], [4]], _config(**kw), on_step=_record(events))
    assert events and not bool((out.sequences == MASK).any())
    seen = torch.zeros_like(out.sequences, dtype=torch.bool)
    value = out.sequences.clone()
    for _, _, tokens, committed in events:
        # what was committed before is still there, and a position is committed once
        assert torch.equal(tokens[seen], value[seen])
        assert not bool((committed & seen).any())
        assert not bool((tokens[committed] == MASK).any())
        seen |= committed
        value = torch.where(committed, tokens, value)
    assert torch.equal(value[seen], out.sequences[seen])


def test_committed_per_step_follows_the_schedule_within_the_block():
    # gen 10, block 5, 6 steps: 2 blocks of 3 steps; 5 masks over 3 steps -> [2, 2, 1]
    cfg = GenerateConfig(gen_length=10, block_length=5, steps=6, mask_token_id=MASK)
    events = []
    out = generate(TinyTransformer(VOCAB, seed=4), [[1, 2], [3, 4]], cfg, on_step=_record(events))
    assert out.steps == 6 and out.forward_passes == 6
    plen = out.prompt_length
    for step, block, _, committed in events:
        assert committed.sum(dim=1).tolist() == [[2, 2, 1][step % 3]] * 2
        assert block == step // 3
        columns = committed.nonzero()[:, 1]
        lo, hi = plen + 5 * block, plen + 5 * (block + 1)
        assert bool(((columns >= lo) & (columns < hi)).all())  # only the current block


def test_low_confidence_commits_the_most_confident_first():
    # position-only logits: column c of the generated region has confidence rising with c
    table = torch.zeros(6, VOCAB)
    for c in range(2, 6):
        table[c, 1] = float(c)  # token 1, more and more confident to the right
    cfg = GenerateConfig(gen_length=4, block_length=4, steps=4, mask_token_id=MASK)
    events = []
    generate(PositionTable(table), [[0, 0]], cfg, on_step=_record(events))
    order = [int(committed[0].nonzero()) for _, _, _, committed in events]
    assert order == [5, 4, 3, 2]


def test_threshold_commits_at_least_one_per_step_and_all_confident_at_once():
    flat = TinyTransformer(VOCAB, seed=5)
    events = []
    out = generate(flat, [[1, 2, 3]], _config(remasking="threshold", threshold=1.0), on_step=_record(events))
    counts = [int(c.sum()) for *_, c in events]
    assert min(counts) >= 1 and sum(counts) == 12 and out.forward_passes == len(events)
    assert counts == [1] * 12  # no prediction is certain: one per step, as the schedule-free floor
    confident = torch.full((20, VOCAB), -9.0)
    confident[:, 3] = 9.0
    events = []
    out = generate(PositionTable(confident), [[1, 2, 3]], _config(remasking="threshold", threshold=0.9),
                   on_step=_record(events))
    assert [int(c.sum()) for *_, c in events] == [4, 4, 4]  # each block in one step
    assert out.generated[0] == [3] * 12


def test_eos_ends_the_output_and_skips_blocks_after_an_all_eos_block():
    # generated columns 0..3 say token 2, columns 4.. say EOS; prompt of 2
    table = torch.full((2 + 16, VOCAB), -5.0)
    table[:, 2] = 5.0
    table[2 + 4:, 2] = -5.0
    table[2 + 4:, EOS] = 5.0
    model = PositionTable(table)
    cfg = GenerateConfig(gen_length=16, block_length=4, steps=8, mask_token_id=MASK, eos_token_id=EOS)
    out = generate(model, [[1, 1]], cfg)
    assert out.generated == [[2, 2, 2, 2]] and out.finish_reasons == ["eos"]
    # block 0 (text) and block 1 (all EOS) ran, 2 steps each; blocks 2 and 3 were skipped
    assert out.forward_passes == 4 and len(model.calls) == 4
    assert out.sequences[0, 2 + 8:].tolist() == [EOS] * 8
    # without eos_token_id every block runs and nothing is cut
    out = generate(PositionTable(table), [[1, 1]], GenerateConfig(**{**cfg.to_dict(), "eos_token_id": None}))
    assert out.forward_passes == 8 and out.finish_reasons == ["length"] and len(out.generated[0]) == 16


def test_a_finished_row_leaves_the_batch():
    table = torch.full((3 + 8, VOCAB), -5.0)
    table[:, EOS] = 5.0  # every column says EOS
    model_rows = []

    def logits_fn(tokens, attention_mask=None):
        model_rows.append(tokens.shape[0])
        out = table[: tokens.shape[1]].unsqueeze(0).repeat(tokens.shape[0], 1, 1)
        out[tokens[:, 0] == 4] = torch.tensor([5.0 if v == 2 else -5.0 for v in range(VOCAB)])  # the row starting 4: text
        return out

    cfg = GenerateConfig(gen_length=8, block_length=4, steps=4, mask_token_id=MASK, eos_token_id=EOS)
    out = generate(logits_fn, [[4, 1, 1], [1, 1, 1]], cfg)
    assert model_rows == [2, 2, 1, 1]  # row 1 came out all EOS in block 0 and was not run again
    assert out.generated == [[2] * 8, []] and out.finish_reasons == ["length", "eos"]


def test_prompts_of_different_lengths_match_each_prompt_alone():
    model = TinyTransformer(VOCAB, seed=6)
    prompts = [[1, 2, 3, 4, 5], [3], [2, 5, 1]]
    cfg = _config()
    batched = generate(model, prompts, cfg)
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], cfg)
        assert batched.generated[row] == alone.generated[0]
    assert batched.prompt_length == 5
    assert batched.sequences[1, :4].tolist() == [0] * 4  # left padding (pad id 0: no EOS set)


def test_one_argument_logits_fn_serves_a_batch_without_padding():
    model = TinyTransformer(VOCAB, seed=7)
    out = generate(lambda tokens: model(tokens), [[1, 2], [3, 4]], _config())
    assert out.generated == generate(model, [[1, 2], [3, 4]], _config()).generated


def test_cfg_scale_zero_equals_no_guidance_and_positive_guidance_masks_the_prompt():
    model = TinyTransformer(VOCAB, seed=8)
    plain = generate(model, [[1, 2, 3]], _config(temperature=0.8, seed=1))
    model.calls.clear()
    zero = generate(model, [[1, 2, 3]], _config(temperature=0.8, seed=1, cfg_scale=0.0))
    assert torch.equal(zero.sequences, plain.sequences)
    assert all(shape[0] == 1 for shape in model.calls)  # no second pass

    seen = []

    def spy(tokens, attention_mask=None):
        seen.append(tokens.clone())
        return model(tokens)

    guided = generate(spy, [[1, 2, 3]], _config(cfg_scale=2.0))
    assert all(t.shape[0] == 2 for t in seen)
    assert all(t[1, :3].tolist() == [MASK] * 3 and t[0, :3].tolist() == [1, 2, 3] for t in seen)
    assert torch.equal(seen[0][0, 3:], seen[0][1, 3:])  # the two copies differ only in the prompt
    assert guided.config["cfg_scale"] == 2.0


def test_sampling_is_reproducible_from_the_seed():
    model = TinyTransformer(VOCAB, seed=9)
    a = generate(model, [[1, 2]], _config(temperature=1.0, seed=11))
    b = generate(model, [[1, 2]], _config(temperature=1.0, seed=11))
    outs = {tuple(generate(model, [[1, 2]], _config(temperature=1.0, seed=s)).generated[0]) for s in range(5)}
    assert a.generated == b.generated and len(outs) > 1


def test_bad_prompts_are_refused():
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        generate(TinyTransformer(VOCAB), [[1], []], _config())
    with pytest.raises(ValueError, match="at least one prompt"):
        generate(TinyTransformer(VOCAB), [], _config())


def test_a_prompt_with_the_mask_token_and_a_bad_logits_fn_are_refused():
    with pytest.raises(ValueError, match="mask token"):
        generate(TinyTransformer(VOCAB), [[1, MASK]], _config())
    with pytest.raises(ValueError, match=r"\[batch, length, vocab\]"):
        generate(lambda t: torch.zeros(t.shape[0], VOCAB), [[1]], _config())
    with pytest.raises(ValueError, match="generate_ar"):
        generate(TinyTransformer(VOCAB), [[1]], GenerateConfig(kind="ar"))


# ------------------------------------------------------------------ autoregressive


def test_ar_greedy_matches_a_hand_loop_and_stops_at_eos():
    model = TinyTransformer(VOCAB, seed=10, causal=True)
    cfg = GenerateConfig(kind="ar", gen_length=6)
    out = generate_ar(model, [[1, 2]], cfg)
    x = torch.tensor([[1, 2]])
    for _ in range(6):
        x = torch.cat([x, model(x)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert out.generated[0] == x[0, 2:].tolist() and out.forward_passes == 6
    eos = x[0, 3].item()  # the second generated token, declared EOS
    cut = generate_ar(model, [[1, 2]], GenerateConfig(kind="ar", gen_length=6, eos_token_id=eos))
    first = x[0, 2:].tolist().index(eos)
    assert cut.generated[0] == x[0, 2:2 + first].tolist() and cut.finish_reasons == ["eos"]
    assert cut.forward_passes == first + 1


def test_ar_batches_prompts_of_different_lengths_and_takes_a_step_fn():
    model = TinyTransformer(VOCAB, seed=12, causal=True)
    cfg = GenerateConfig(kind="ar", gen_length=4)
    batched = generate_ar(model, [[1, 2, 3], [4]], cfg)
    assert batched.generated[1] == generate_ar(model, [[4]], cfg).generated[0]
    calls = []

    def step_fn(tokens, attention_mask):  # the KV-cache seam: one column more each call
        calls.append(tokens.shape[1])
        return model(tokens, attention_mask)[:, -1]

    via_step = generate_ar(None, [[1, 2, 3], [4]], cfg, step_fn=step_fn)
    assert via_step.generated == batched.generated and calls == [3, 4, 5, 6]
    with pytest.raises(ValueError, match="generate\\(\\)"):
        generate_ar(model, [[1]], _config())
