"""The lm-eval-harness model ``dlmspec`` on a tiny CPU model and a character tokenizer: its
loglikelihood is the library's ELBO call for the same seed (exact for AR), whatever the request
order; generate_until runs the sampler and cuts at stop strings; loglikelihood_rolling works for
both kinds; tiny local tasks of all three request types run end to end through
``lm_eval.simple_evaluate`` and through the ``lm_eval`` command line (no download)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from dlmspec.backends.generate import lm_eval_model  # noqa: E402
from dlmspec.backends.generate.lm_eval_model import DlmspecLM  # noqa: E402
from dlmspec.backends.generate.likelihood import ar_nll, continuation_nll  # noqa: E402

from tiny_ckpt import tiny_runs  # noqa: E402,F401 (a fixture)
from tiny_lm import PositionTable, TinyTransformer  # noqa: E402

from lm_eval_kit import (  # noqa: F401 (fixtures among them)
    _write_tasks,
    offline_lm_eval,
)

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,?"
EOS, MASK, VOCAB = 30, 31, 32


class CharTokenizer:
    """dlmspec's tokenizer interface over one id per character of :data:`ALPHABET`."""

    def tokenize(self, text: str) -> list[int]:
        return [ALPHABET.index(c) for c in text.lower() if c in ALPHABET]

    def detokenize(self, ids: list[int]) -> str:
        return "".join(ALPHABET[i] for i in ids if i < len(ALPHABET))


def _lm(kind: str = "mdm", **kwargs) -> DlmspecLM:
    model = TinyTransformer(VOCAB, seed=1, causal=kind == "ar")
    defaults = dict(logits_fn=model, tokenizer=CharTokenizer(), kind=kind, eos_token_id=EOS, seed=3, mc_samples=8,
                    samples_per_forward=4, progress=False)
    if kind == "mdm":
        defaults["mask_token_id"] = MASK
    defaults.update(kwargs)
    return DlmspecLM(**defaults)


def _ll(args, i=0) -> Instance:
    return Instance(request_type="loglikelihood", doc={}, arguments=args, idx=i)


def test_loglikelihood_is_the_library_elbo_for_the_same_seed() -> None:
    lm = _lm()
    pairs = [("the cat", " sat"), ("a dog", " ran far"), ("the cat", " sat")]
    got = lm.loglikelihood([_ll(p, i) for i, p in enumerate(pairs)])
    tok = CharTokenizer()
    for (context, continuation), (logprob, greedy) in zip(pairs, got):
        ctx = tok.tokenize(context)
        cont = tok.tokenize(context + continuation)[len(ctx):]
        nll, se, n = continuation_nll(lm.logits_fn, ctx, cont, kind="mdm", mask_token_id=MASK,
                                      generator=torch.Generator().manual_seed(3), num_samples=8,
                                      samples_per_forward=4)
        assert logprob == pytest.approx(-nll, abs=1e-9) and se > 0 and isinstance(greedy, bool)
    # the same request gets the same number wherever it stands (one seed per request)
    assert got[0] == got[2]
    assert lm.loglikelihood([_ll(pairs[1]), _ll(pairs[0])])[1] == got[0]
    # another seed, another estimate
    assert _lm(seed=4).loglikelihood([_ll(pairs[0])])[0][0] != got[0][0]


def test_the_context_trailing_space_goes_with_the_continuation() -> None:
    assert _lm().encode_pair("the cat ", "sat") == (CharTokenizer().tokenize("the cat"), CharTokenizer().tokenize(" sat"))


def test_ar_loglikelihood_is_exact_and_greedy_is_the_argmax() -> None:
    lm = _lm("ar")
    tok = CharTokenizer()
    ctx, cont = tok.tokenize("the cat"), tok.tokenize(" sat")
    seq = torch.tensor([ctx + cont])
    target = torch.zeros_like(seq, dtype=torch.bool)
    target[0, len(ctx):] = True
    expected = float(ar_nll(lm.logits_fn, seq, target_mask=target).nll[0])
    (logprob, greedy), = lm.loglikelihood([_ll(("the cat", " sat"))])
    assert logprob == pytest.approx(-expected, abs=1e-9) and not greedy
    # the model's own argmax continuation is greedy
    x = list(ctx)
    for _ in range(3):
        x.append(int(lm.logits_fn(torch.tensor([x]))[0, -1].argmax()))
    assert lm.score(ctx, x[len(ctx):])[1] is True


def test_an_empty_context_is_conditioned_on_eos_for_ar() -> None:
    lm = _lm("ar")
    (logprob, _), = lm.loglikelihood([_ll(("", "cat"))])
    expected = continuation_nll(lm.logits_fn, [EOS], CharTokenizer().tokenize("cat"), kind="ar")[0]
    assert logprob == pytest.approx(-expected)


def test_loglikelihood_rolling_ar_exact_and_mdm_bound() -> None:
    tok = CharTokenizer()
    text = "the cat sat on the mat"
    ids = tok.tokenize(text)
    lm = _lm("ar")
    request = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)
    (got,) = lm.loglikelihood_rolling([request])
    assert got == pytest.approx(-continuation_nll(lm.logits_fn, [EOS], ids, kind="ar")[0])
    # windows of 8 tokens: every token scored once, each window a conditional likelihood
    short = _lm("ar", max_length=8)
    (windowed,) = short.loglikelihood_rolling([request])
    assert math.isfinite(windowed) and windowed < 0 and windowed != got
    mdm = _lm()
    (bound,) = mdm.loglikelihood_rolling([request])
    nll = continuation_nll(mdm.logits_fn, [EOS], ids, kind="mdm", mask_token_id=MASK,
                           generator=torch.Generator().manual_seed(3), num_samples=8, samples_per_forward=4)[0]
    assert bound == pytest.approx(-nll)


def _table_model(prompt_len: int, text: str) -> PositionTable:
    """Logits whose argmax at column ``prompt_len + j`` is ``text[j]``."""
    table = torch.zeros(prompt_len + len(text), VOCAB)
    for j, c in enumerate(text):
        table[prompt_len + j, ALPHABET.index(c)] = 10.0
    return PositionTable(table)


def test_generate_until_cuts_at_the_first_stop_string() -> None:
    lm = _lm(logits_fn=_table_model(2, "hi. there"), gen_length=9, block_length=9, steps=9)
    request = Instance(request_type="generate_until", doc={}, arguments=("ab", {"until": ["."], "max_gen_toks": 9}),
                       idx=0)
    assert lm.generate_until([request]) == ["hi"]
    # the length defaults to the request's max_gen_toks, blocks and steps to that length
    lm = _lm(logits_fn=_table_model(2, "hi there"))
    request = Instance(request_type="generate_until", doc={}, arguments=("ab", {"until": ["zz"], "max_gen_toks": 8}),
                       idx=0)
    assert lm.generate_until([request]) == ["hi there"]
    ar = _lm("ar", logits_fn=_table_model(1, "hi, you"))  # AR: logits at column i predict token i + 1
    request = Instance(request_type="generate_until", doc={}, arguments=("ab", {"until": [","], "max_gen_toks": 6}),
                       idx=0)
    assert ar.generate_until([request]) == ["hi"]


def test_bad_model_args_are_named_with_a_remedy() -> None:
    with pytest.raises(ValueError, match="mc_sample: not a dlmspec model argument; did you mean mc_samples"):
        _lm(mc_sample=4)
    with pytest.raises(ValueError, match="mask_token_id"):
        DlmspecLM(logits_fn=TinyTransformer(VOCAB), tokenizer=CharTokenizer(), kind="mdm")
    with pytest.raises(ValueError, match="path="):
        DlmspecLM()
    with pytest.raises(ValueError, match="seed='x': not a whole number"):
        _lm(seed="x")






def test_tiny_tasks_run_end_to_end_through_simple_evaluate(tmp_path: Path, offline_lm_eval) -> None:
    import lm_eval

    tasks = _write_tasks(tmp_path / "data")
    lm = _lm(logits_fn=_table_model(2, "hi. there"), gen_length=9, block_length=9, steps=9)
    out = lm_eval.simple_evaluate(model=lm, tasks=tasks[1:2], task_manager=offline_lm_eval(), log_samples=False)
    assert out["results"]["tiny_gen"]["exact_match,none"] == 1.0

    lm = _lm(mc_samples=4, greedy_check=False)
    out = lm_eval.simple_evaluate(model=lm, tasks=[tasks[0], tasks[2]], task_manager=offline_lm_eval(),
                                  log_samples=False)
    docs = [json.loads(line) for line in (tmp_path / "data" / "mc.jsonl").read_text().splitlines()]
    hits = [max(range(2), key=lambda c: lm.loglikelihood([_ll((d["context"], d["choices"][c]))])[0][0]) == d["label"]
            for d in docs]
    assert out["results"]["tiny_mc"]["acc,none"] == pytest.approx(sum(hits) / len(hits))
    (bound,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("the cat sat",), 0)])
    assert out["results"]["tiny_ppl"]["word_perplexity,none"] == pytest.approx(math.exp(-bound / 3))
    assert out["config"]["dlmspec_seed"] == 3


def test_the_lm_eval_command_line_finds_model_dlmspec(tmp_path: Path, monkeypatch, offline_lm_eval) -> None:
    """``dlmspec-lm-eval --model dlmspec --model_args path=...`` (lm_eval's own CLI, this module
    imported first) with a task folder given by --include_path; the loader is the test's."""
    import types

    import yaml

    task = _write_tasks(tmp_path / "data")[0]
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tiny_mc.yaml").write_text(yaml.safe_dump(task))
    seen = {}

    def fake_from_path(path, **kwargs):
        seen["path"] = path
        return types.SimpleNamespace(logits_fn=TinyTransformer(VOCAB, seed=1), tokenizer=CharTokenizer(), kind="mdm",
                                     mask_token_id=MASK, eos_token_id=EOS, pad_token_id=EOS, max_length=64)

    monkeypatch.setattr(lm_eval_model, "from_path", fake_from_path)
    lm_eval_model.main(["--model", "dlmspec", "--model_args", f"path={tmp_path / 'run'},mc_samples=4,seed=1,greedy_check=False",
                        "--tasks", "tiny_mc", "--include_path", str(tmp_path / "tasks"),
                        "--output_path", str(tmp_path / "out")])
    assert seen["path"] == str(tmp_path / "run")
    results = list((tmp_path / "out").rglob("results*.json"))
    assert results, list((tmp_path / "out").rglob("*"))
    assert "acc,none" in json.loads(results[0].read_text())["results"]["tiny_mc"]


def test_an_ar_checkpoint_from_path_generates_with_the_kv_cache(tiny_runs) -> None:
    """``path=`` of an AR run: ``generate_until`` decodes with megatron-core's KV cache (the
    loaded model's ``ar_step_fn``) and gives the full recompute's text."""
    from dlmspec.backends.generate.models import GPTKVCacheStep

    lm = DlmspecLM(path=str(tiny_runs["ar"][0]), device="cpu", progress=False)
    try:
        assert lm.step_fn_factory is not None and isinstance(lm.step_fn_factory(), GPTKVCacheStep)
        request = Instance(request_type="generate_until", doc={},
                           arguments=("The quick brown fox", {"until": ["\n\n"], "max_gen_toks": 5}), idx=0)
        cached = lm.generate_until([request])
        lm.step_fn_factory = None  # full recompute
        assert lm.generate_until([request]) == cached
    finally:
        lm.loaded.close()


@pytest.mark.parametrize("kind", ["mdm", "ar"])
def test_loglikelihood_equals_dlmspec_evals_for_the_same_seed(tiny_runs, tmp_path, capsys, kind) -> None:
    """the "the lm-eval wrapper's loglikelihood equals `dlmspec eval`'s for the same seed":
    `dlmspec eval --choices` scores every (context, choice) with the wrapper's text split and a
    generator seeded with --seed for each choice, so each choice's NLL is minus the wrapper's
    loglikelihood of the same request (the empty context included: EOS for AR, nothing for MDM)."""
    from dlmspec.cli import main

    items = [{"context": "The sky is", "choices": [" blue", " green today"], "label": 0},
             {"context": "One, two, ", "choices": ["three", "dog"], "label": 0},
             {"context": "", "choices": ["Hello", "world"], "label": 1}]
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    run_dir = str(tiny_runs[kind][0])
    capsys.readouterr()
    code = main(["eval", run_dir, "--choices", str(path), "--num-samples", "6", "--seed", "5", "--device", "cpu",
                 "--json"])
    env = json.loads(capsys.readouterr().out)
    assert code == 0, env
    nll = env["result"]["choices"]["nll"]
    lm = DlmspecLM(path=run_dir, device="cpu", seed=5, mc_samples=6, greedy_check=False, progress=False)
    try:
        requests = [_ll((i["context"], c), n) for n, i in enumerate(items) for c in i["choices"]]
        got = [ll for ll, _ in lm.loglikelihood(requests)]
    finally:
        lm.loaded.close()
    want = [-x for row in nll for x in row]
    assert got == pytest.approx(want, abs=1e-9)


def test_the_lm_eval_command_line_reports_a_path_that_is_no_checkpoint_without_a_traceback(
        tmp_path: Path, monkeypatch, offline_lm_eval, capsys) -> None:
    """``dlmspec-lm-eval --model_args path=EMPTY`` exits 2 naming the flag, the path and why
    (found by a new-user trial: it ended in a LoadError traceback)."""
    task = _write_tasks(tmp_path / "data")[0]
    import yaml

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tiny_mc.yaml").write_text(yaml.safe_dump(task))
    (tmp_path / "emptyrun").mkdir()
    with pytest.raises(SystemExit) as stop:
        lm_eval_model.main(["--model", "dlmspec", "--model_args", f"path={tmp_path / 'emptyrun'}",
                            "--tasks", "tiny_mc", "--include_path", str(tmp_path / "tasks")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--model_args path=" in err and "emptyrun" in err and "Traceback" not in err
