"""Accepted nonsense that failed later: the validator refuses it, naming the key.

Every rule here has a failing example whose issue names the key, says why and suggests a fix;
the suggested value is in the hint, and the spec with that value applied has no issue of the
rule any more. Values beyond int64 are refused by the loader (before anything computes with
them), and no absurd magnitude makes ``validate``, ``plan`` or ``plan --search`` crash or hang.
"""

from __future__ import annotations

import copy
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from dlmspec.check import RULES, find
from dlmspec.errors import SpecError
from dlmspec.spec.load import load
from dlmspec.spec.models import Spec

from rule_cases_kit import (  # noqa: F401 (fixtures among them)
    BASE,
    CASES,
    MASK_RULE,
)

#: The scopes of the rules that read a spec and this machine's files.
FILES = ("spec", "paths")



def make(changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """BASE with dotted-key changes; a value of None deletes the key."""
    data = copy.deepcopy(BASE)
    for key, value in (changes or {}).items():
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)  # a later key may write into it: CASES stay as written
    return data


def issues_of(data: dict[str, Any], rule: str) -> list:
    return [i for i in find(FILES, Spec.model_validate(data)) if i.rule == rule]


def test_base_is_clean() -> None:
    assert find(FILES, Spec.model_validate(make())) == []






def test_every_new_rule_has_a_case() -> None:
    new = {"seed-range", "eod-id-range", "rotary-dims", MASK_RULE, "train-length-overflow",
           "train-length-implausible", "float32-range", "lr-implausible", "num-workers-range",
           "num-workers-implausible", "world-size-range", "blank-value"}
    assert new <= set(RULES)
    assert {c[0] for c in CASES} | {MASK_RULE} == new


@pytest.mark.parametrize(("rule", "changes", "key", "fix", "hint"), CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_and_its_remedy_validates(rule: str, changes: dict[str, Any], key: str, fix: dict[str, Any],
                                          hint: str) -> None:
    found = [i for i in issues_of(make(changes), rule) if i.key == key]
    assert found, f"{rule} did not name {key}: {issues_of(make(changes), rule)}"
    issue = found[0]
    assert issue.severity == RULES[rule].severity and issue.source == RULES[rule].source
    assert issue.message and issue.hint and hint in issue.hint, issue.hint
    fixed = make({**changes, **fix})
    assert issues_of(fixed, rule) == [], "the suggested fix does not satisfy the rule"
    errors = [i for i in find(("spec",), Spec.model_validate(fixed)) if i.severity == "error"]
    assert errors == [], errors


def test_legal_values_stay_quiet() -> None:
    for changes in ({"train.seed": 0}, {"train.seed": 2**32 - 1}, {"data.tokenizer.eod_id": 999},
                    {"model.kv_channels": 63, "model.position_embedding_type": "learned_absolute"},
                    {"model.rotary_percent": 0.5}, {"train.lr": 1.0, "train.min_lr": 0.1},
                    {"train.train_iters": 10**9}, {"data.num_workers": 64}, {"cluster.nodes": 1024},
                    {"description": " "}, {"stage.kind": "sft", "stage.sft": {}, "checkpoint.init_from": "hf:x"}):
        data = make(changes)
        rules = {i.rule for i in find(FILES, Spec.model_validate(data))}
        assert not rules & {c[0] for c in CASES}, (changes, rules)


# --- [MASK] on an ordinary token of a real tokenizer ----------------------------------------


def _hf_folder(tmp_path: Path) -> Path:
    """A Hugging Face tokenizer.json: 30 ordinary tokens (ids 0..29), a special <|mask|> (30), a
    non-special added <think> (31)."""
    folder = tmp_path / "hf"
    folder.mkdir()
    vocab = {chr(ord("a") + i) if i < 26 else f"t{i}": i for i in range(30)}
    (folder / "tokenizer.json").write_text(json.dumps({
        "added_tokens": [{"id": 30, "content": "<|mask|>", "special": True},
                         {"id": 31, "content": "<think>", "special": False}],
        "model": {"type": "BPE", "vocab": vocab, "merges": []}}), encoding="utf-8")
    return folder


def _mask(tokenizer: dict[str, Any], mask: int | None, vocab: int = 1000, divisible_by: int = 128) -> list:
    changes: dict[str, Any] = {"data.tokenizer": tokenizer, "model.vocab_size": vocab,
                               "model.make_vocab_size_divisible_by": divisible_by}
    if mask is not None:
        changes["objective.mask_token_id"] = mask
    return issues_of(make(changes), MASK_RULE)


def test_mask_on_an_ordinary_hf_token_warns_and_special_or_reserved_ids_do_not(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path)
    for model in (str(folder), str(folder / "tokenizer.json")):
        tok = {"type": "HuggingFaceTokenizer", "model": model, "eod_id": 29}
        (issue,) = _mask(tok, 5)
        assert (issue.key, issue.value, issue.severity) == ("objective.mask_token_id", 5, "warning")
        assert "'f'" in issue.message and "ordinary" in issue.message
        assert "mask_token_id = 30" in issue.hint  # the tokenizer's own special mask token
        assert _mask(tok, 30) == []
        (think,) = _mask(tok, 31)
        assert "'<think>'" in think.message
        assert _mask(tok, 500) == [] and _mask(tok, None) == []  # beyond the tokenizer: reserved rows


def test_mask_on_an_ordinary_hf_token_of_a_unigram_model(tmp_path: Path) -> None:
    folder = tmp_path / "uni"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps({
        "added_tokens": [{"id": 0, "content": "<unk>", "special": True}],
        "model": {"type": "Unigram", "vocab": [["<unk>", 0.0], ["▁a", -1.0], ["▁b", -2.0]]}}), encoding="utf-8")
    tok = {"type": "HuggingFaceTokenizer", "model": str(folder), "eod_id": 2}
    (issue,) = _mask(tok, 1)
    assert "'▁a'" in issue.message and "mask_token_id = 3" in issue.hint
    assert _mask(tok, 3) == [] and _mask(tok, 0) == []


def test_mask_on_an_ordinary_gpt2_token_warns(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"a": 0, "Ġthe": 1, "<|endoftext|>": 50256}), encoding="utf-8")
    tok = {"type": "GPT2BPETokenizer", "vocab_file": str(vocab), "merge_file": str(tmp_path / "m.txt")}
    (issue,) = _mask(tok, 1, vocab=50257)
    assert "'Ġthe'" in issue.message and "mask_token_id = 50257" in issue.hint
    assert _mask(tok, 50257, vocab=50257) == [] and _mask(tok, None, vocab=50257) == []
    assert _mask(tok, 50256, vocab=50257) == []  # the EOD id: mask-token-distinct's error, not this warning
    # ids the model has beyond the tokenizer are reserved: the fix takes the first
    (issue,) = _mask(tok, 7, vocab=50304)
    assert "mask_token_id = 50257" in issue.hint
    # no row beyond the tokenizer (no padding): the fix grows the embedding by one row
    (issue,) = _mask(tok, 7, vocab=50257, divisible_by=1)
    assert "model.vocab_size = 50258 and objective.mask_token_id = 50257" in issue.hint
    assert _mask(tok, 50257, vocab=50258, divisible_by=1) == []


def test_mask_rule_reads_no_fifo_or_device(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    os.mkfifo(folder / "tokenizer.json")
    tok = {"type": "HuggingFaceTokenizer", "model": str(folder), "eod_id": 29}
    assert _mask(tok, 5) == []  # cannot tell: quiet, and it returns (a FIFO is never opened)
    vocab = tmp_path / "vocab.json"
    vocab.symlink_to("/dev/zero")
    assert _mask({"type": "GPT2BPETokenizer", "vocab_file": str(vocab), "merge_file": "m"}, 1, vocab=50257)


# --- beyond int64: the loader refuses it -----------------------------------------------------


TOML = """name = "t"
[model]
num_layers = 4
hidden_size = 256
ffn_hidden_size = 1024
num_attention_heads = 8
vocab_size = 1000
max_position_embeddings = 1024
[train]
global_batch_size = 64
seq_length = 512
train_iters = 100
[data]
mock = true
tokenizer = { type = "NullTokenizer", vocab_size = 999 }
[cluster]
gpu = "h100"
gpus_per_node = 8
"""


@pytest.mark.parametrize(("old", "new", "key"), [
    ("train_iters = 100", f"train_iters = {2**64}", "train.train_iters"),
    ("train_iters = 100", f"train_tokens = {10**30}", "train.train_tokens"),
    ("gpus_per_node = 8", f"gpus_per_node = 8\n[checkpoint]\nsave_interval = {2**63}", "checkpoint.save_interval"),
    ("vocab_size = 1000", f"vocab_size = {10**400}", "model.vocab_size"),
    ("gpus_per_node = 8", f"gpus_per_node = 8\n[logging]\nprofile_ranks = [0, {-2**63 - 1}]", "logging.profile_ranks"),
])
def test_integers_beyond_int64_are_refused_by_the_loader(tmp_path: Path, old: str, new: str, key: str) -> None:
    text = TOML.replace(old, new)
    path = tmp_path / "int64.toml"
    path.write_text(text, encoding="utf-8")
    found = []
    for fast in (True, False):
        with pytest.raises(SpecError) as info:
            load(path, fast=fast)
        found.append(info.value.issues)
    assert found[0] == found[1], "the fast path and the pydantic path disagree"
    (issue,) = found[0]
    line = next(n for n, text_line in enumerate(text.splitlines(), 1)
                if text_line.startswith(key.split(".")[-1] + " ="))
    assert (issue.key, issue.rule, issue.file, issue.line) == (key, "int64", str(path), line)
    assert "int64" in issue.message and "9223372036854775807" in issue.message and issue.hint


def test_a_number_too_long_to_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "long.toml"
    path.write_text(TOML.replace("train_iters = 100", f"train_iters = {'9' * 5000}"), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load(path)
    (issue,) = info.value.issues
    assert (issue.key, issue.line) == ("train.train_iters", 12) and "digits" in issue.message and issue.hint
    ok = tmp_path / "ok.toml"
    ok.write_text(TOML, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load(ok, [f"train.train_iters={'9' * 5000}"])
    (issue,) = info.value.issues
    assert issue.key == "train.train_iters" and "digits" in issue.message and len(repr(issue.value)) < 100


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang("no answer within 20 s")


SETS = [[f"train.train_iters={2**64}"], [f"train.train_tokens={10**30}"],
        ["train.train_tokens=1e30"], [f"checkpoint.save_interval={2**63}"],
        [f"train.train_iters={2**63 - 1}"], ["train.lr=1e18"], ["train.lr=1e300"], ["data.num_workers=1e6"],
        ["data.num_workers=1000000"], [f"cluster.nodes={2**40}"],
        [f"cluster.nodes={2**40}", f"train.global_batch_size={2**45}"], [f"cluster.nodes={2**17}"],
        [f"train.seed={2**64}"], ["model.vocab_size=1" + "0" * 5000], [f"train.seq_length={2**62}"],
        [f"train.train_iters={10**400}"], [f"model.vocab_size={10**400}"], [f"model.num_experts={10**400}"],
        # within int32 and int64, but a search over them divided by every integer up to the size
        [f"cluster.nodes={2**25}"], [f"train.global_batch_size={2**40}"], [f"train.global_batch_size={2**63 - 25}"]]


@pytest.mark.parametrize("command", [["validate"], ["plan"], ["plan", "--search"]])
def test_absurd_magnitudes_exit_cleanly_and_quickly(tmp_path: Path, command: list[str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Each absurd value given to each command: exit 0 or 2 (an exception fails the test),
    within 20 s (the planner neither crashes nor hangs)."""
    from dlmspec.cli import main

    spec = tmp_path / "s.toml"
    spec.write_text(TOML, encoding="utf-8")
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for extra in SETS:
            signal.alarm(20)
            code = main([*command, str(spec), *[a for s in extra for a in ("--set", s)]])
            signal.alarm(0)
            assert code in (0, 2), (extra, capsys.readouterr().err[-2000:])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_the_fast_path_finds_the_same(tmp_path: Path) -> None:
    """Each failing example, loaded from TOML with and without pydantic (dlmspec.spec.fast):
    the same issues."""
    import tomli_w

    for i, (rule, changes, _, _, _) in enumerate(CASES):
        path = tmp_path / f"case{i}.toml"
        path.write_text(tomli_w.dumps(make(changes)), encoding="utf-8")
        fast, slow = (find(FILES, load(path, fast=flag)) for flag in (True, False))
        assert fast == slow and rule in {f.rule for f in fast}, rule
