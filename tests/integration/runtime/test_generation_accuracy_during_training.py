"""[eval.generation] at run time (backends/megatron/generation_eval.py): completions sampled with
the current model are scored by exact match, counted over the prompts, and logged as the `eval`
record (eval/generation_accuracy) with its count and Wilson interval; a bad prompts file stops the
run before the first step."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from cpu_world_kit import megatron_cpu_world
from generation_eval_kit import EOS, MASK, Oracle, WordTokenizer, addition_rows, tiny_gpt

from dlmspec.backends.generate.config import GenerateConfig
from dlmspec.backends.megatron.generation_eval import (GenerationEvalConfig, GenerationEvaluator, build_generation_eval,
                                                       log_generation_eval, score_prompts)

PAIRS = [(12, 34), (5, 7), (99, 1), (40, 2), (8, 80), (61, 39)]


@pytest.mark.parametrize("kind", ["mdm", "ar"])
def test_accuracy_counts_exactly_the_completions_whose_answer_matches(kind):
    rows = addition_rows(PAIRS)
    wrong = {rows[1]["prompt"], rows[4]["prompt"]}
    oracle = Oracle(rows, wrong, causal=(kind == "ar"))
    tok = WordTokenizer()
    config = GenerateConfig(kind=kind, gen_length=4, steps=4, block_length=4, mask_token_id=MASK if kind == "mdm" else None,
                            eos_token_id=EOS, pad_token_id=EOS)
    result = score_prompts(oracle, rows, encode=tok.tokenize, decode=tok.detokenize, config=config, batch_size=4,
                           device="cpu")
    assert (result["correct"], result["count"]) == (4, 6)
    assert [c["correct"] for c in result["completions"]] == [True, False, True, True, False, True]
    assert result["completions"][0]["completion"] == " 4 6"  # generated ids stop before EOS


def _evaluator(path, kind="mdm", **overrides):
    cfg = GenerationEvalConfig(prompts=str(path), every=2, max_prompts=overrides.get("max_prompts", 500),
                               batch_size=overrides.get("batch_size", 4),
                               generate=dict(gen_length=4, steps=4, block_length=4), preset="llada-gsm8k")
    return GenerationEvaluator(cfg, kind=kind, mask_token_id=MASK, eos_token_id=EOS, tokenizer=WordTokenizer())


def test_a_tiny_gptmodel_is_scored_and_logged_beside_the_validation_loss(tmp_path, tmp_path_factory):
    from dlmspec.backends.megatron.config import LoggingConfig
    from dlmspec.backends.megatron.metrics import MetricsLogger

    prompts = tmp_path / "test.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in addition_rows(PAIRS)))
    evaluator = _evaluator(prompts, max_prompts=5)
    assert [evaluator.due(i) for i in (0, 1, 2, 3, 4)] == [False, False, True, False, True]
    logger = MetricsLogger(LoggingConfig(run_dir=str(tmp_path / "run"), tensorboard=False, console="plain"), enabled=True)
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        model = tiny_gpt()
        model.train()
        parts = SimpleNamespace(model=[model], ddp_config=None, device=torch.device("cpu"))
        log_generation_eval(evaluator, parts, logger, 4)
        log_generation_eval(evaluator, parts, logger, 3)  # not due: nothing logged
        assert model.training  # the training mode comes back
    logger.close()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (record,) = [r for r in records if r["event"] == "eval"]
    assert record["iteration"] == 4 and record["generation_count"] == 5  # max_prompts of the file's 6 rows
    assert record["generation_accuracy"] == record["generation_correct"] / 5
    low, high = record["generation_interval_95"]
    assert 0.0 <= low <= record["generation_accuracy"] <= high <= 1.0
    assert record["generation_preset"] == "llada-gsm8k" and record["generation_settings"]["gen_length"] == 4
    assert record["generation_forward_passes"] > 0


def test_the_same_checkpoint_gives_the_same_completions_at_any_batch_size(tmp_path, tmp_path_factory):
    prompts = tmp_path / "test.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in addition_rows(PAIRS)))
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        model = tiny_gpt()
        outs = []
        for batch_size in (1, 6):
            evaluator = _evaluator(prompts, batch_size=batch_size)
            outs.append(evaluator.run([model], device=torch.device("cpu"))["generation_examples"])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("content, expected", [
    ('{"prompt": " 1 =", "answer": " 1"}\n[1, 2]\n', "test.jsonl:2: a JSON list, not an object"),
    ('{"prompt": " 1 ="}\n', "test.jsonl:1: no 'answer' key"),
    ('not json\n', "test.jsonl:1: not JSON"),
    ('', "test.jsonl: no rows"),
])
def test_a_bad_prompts_file_stops_the_run_before_the_first_step_naming_file_and_line(tmp_path, capsys, content,
                                                                                        expected):
    prompts = tmp_path / "test.jsonl"
    prompts.write_text(content)
    cfg = GenerationEvalConfig(prompts=str(prompts), every=10,
                               tokenizer=dict(tokenizer_type="NullTokenizer", vocab_size=16))
    run = SimpleNamespace(generation_eval=cfg, objective=SimpleNamespace(kind="mdm", mask_token_id=17),
                          data=SimpleNamespace(eod_id=16))
    with pytest.raises(SystemExit) as exit_info:
        build_generation_eval(run)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert expected in err and "Fix:" in err and "Traceback" not in err


def test_no_generation_eval_builds_nothing():
    assert build_generation_eval(SimpleNamespace(generation_eval=None)) is None


def test_a_model_trained_with_the_fused_output_loss_is_sampled_from_its_logits(tmp_path, tmp_path_factory):
    """Under cross_entropy = "fused_linear" the training model returns hidden states; the
    evaluation projects them with the output weight and samples what the plain model samples."""
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.megatron.generation_eval import model_logits_fn
    from dlmspec.backends.megatron.output_loss import defer_output_projection

    prompts = tmp_path / "test.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in addition_rows(PAIRS)))
    tokens = torch.tensor([[1, 2, 10, 3, 11, MASK, MASK]])
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        model = tiny_gpt().eval()
        plain = gpt_logits_fn(model)(tokens)
        before = _evaluator(prompts).run([model], device=torch.device("cpu"))["generation_examples"]
        defer_output_projection(model)
        assert gpt_logits_fn(model)(tokens).shape[-1] == 32  # hidden states now
        torch.testing.assert_close(model_logits_fn(model)(tokens), plain, rtol=1e-5, atol=1e-5)
        after = _evaluator(prompts).run([model], device=torch.device("cpu"))["generation_examples"]
    assert after == before
