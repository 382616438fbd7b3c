"""The tokenizer and mask rules read the end-of-document id and the tokenizer's size from the resolved
spec (``ctx.r.eod``, ``ctx.r.tokenizer_size()``), which read the tokenizer's files once, instead of
looking them up again for each rule and each candidate id."""

from __future__ import annotations

from pathlib import Path

from dlmspec.check import issues_for
from dlmspec.check import tokenizer as rules
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]


def test_rules_do_not_read_the_gpt2_vocabulary_again(monkeypatch, tmp_path) -> None:
    loaded = load(ROOT / "specs" / "demo-dlm.toml", ["model.vocab_size=50257", "objective.mask_token_id=50256"])
    resolved = resolve(loaded.spec)
    assert resolved.eod is not None and resolved.eod.value == 50256

    def refuse(path):  # every lookup after resolve is a second read
        raise AssertionError(f"gpt2_eod_id({path!r}) called again after resolve")

    monkeypatch.setattr(rules, "gpt2_eod_id", refuse)
    found = issues_for("validate", loaded, resolved)
    # the mask id equal to the EOD is still caught, from the resolved value
    assert any("50256" in (i.message + i.hint) and i.key == "objective.mask_token_id" for i in found), \
        [(i.rule, i.key, i.message) for i in found]


def test_tokenizer_eod_follows_the_resolved_choice() -> None:
    loaded = load(ROOT / "specs" / "demo-dlm.toml", ["data.tokenizer.eod_id=7"])
    resolved = resolve(loaded.spec)

    class Ctx:
        spec, r = loaded.spec, resolved

    assert rules.tokenizer_eod(Ctx) == 7 == resolved.eod.value
