"""The SFT rules (dlmspec/check/sft.py): the dataset record of `dlmspec data prepare --sft`
against the spec (template, special-token ids, EOD, max_length, the longest prompt), the
response-mask dataset, the attention masks packing needs, and what SFT does not apply. Each rule's
failing example (files included) is also run by test_validate_compile_agree (validate and
compile agree) and test_remedies_validate (its fix validates)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlmspec.check import RULES, load_for
from dlmspec.check.sft import longest_prompt
from dlmspec.resolve import default_loss_normalization, layer_path, runtime_values, resolve, sft_pad_eos_tokens
from dlmspec.spec.load import load

import agree_kit as agree
from sft_examples import FILE_EXAMPLES, SFT, sft_files

def _issues(tmp_path: Path, changes: dict[str, Any], files: dict[str, str], monkeypatch) -> list:
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    spec = tmp_path / "spec.py"
    spec.write_text(f"spec = {agree.merged(agree.BASE, changes)!r}\n", encoding="utf-8")
    try:
        return load_for("validate", spec, [])[2]
    except Exception as exc:  # SpecError: its issues
        return exc.issues


@pytest.mark.parametrize("rule", sorted(FILE_EXAMPLES))
def test_file_rules_fire_on_their_example_and_not_on_good_data(rule: str, tmp_path: Path, monkeypatch) -> None:
    changes, files, key = FILE_EXAMPLES[rule]
    found = [i for i in _issues(tmp_path, changes, files, monkeypatch) if i.rule == rule]
    assert [i.key for i in found] == [key] and found[0].severity == RULES[rule].severity
    assert found[0].hint and RULES[rule].source
    good = tmp_path / "good"
    good.mkdir()
    assert not [i for i in _issues(good, changes, sft_files(), monkeypatch) if i.rule.startswith("sft-")]


def test_special_ids_outside_the_padded_vocabulary(tmp_path: Path, monkeypatch) -> None:
    issues = _issues(tmp_path, SFT, sft_files(special_tokens={"<|im_start|>": 1030}), monkeypatch)
    [issue] = [i for i in issues if i.rule == "sft-special-token-ids"]
    assert issue.key == "model.vocab_size" and issue.fix.set == {"model.vocab_size": 1031}


def test_records_are_not_read_for_pretraining(tmp_path: Path, monkeypatch) -> None:
    issues = _issues(tmp_path, {}, sft_files(response=False, chat_template="plain"), monkeypatch)
    assert not [i for i in issues if i.rule.startswith("sft-")]


def test_longest_prompt_is_read_from_the_response_masks(tmp_path: Path) -> None:
    import sys

    from sft_files import write_sft

    prefix = write_sft(str(tmp_path / "c_text_document"), [([5, 6, 7], [8]), ([1] * 9, [2, 3])])
    assert longest_prompt(prefix) == (9, 0)
    assert longest_prompt(prefix, {"max_prompt_tokens": 4}) == (4, 0)
    assert longest_prompt(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("changes, rule, key", [
    ({**SFT, "objective.variable_length_prob": 0.01}, "sft-variable-length", "objective.variable_length_prob"),
    ({**SFT, "stage.sft": {"packed_sequence": True, "pad_eos_tokens": 2}}, "sft-pad-eos-packed",
     "stage.sft.pad_eos_tokens"),
    ({**SFT, "stage.sft": {"packed_sequence": True}, "model.transformer_impl": "transformer_engine"},
     "sft-attention-mask", "model.transformer_impl"),
    ({**SFT, "stage.sft": {"pad_eos_tokens": 0}, "model.transformer_impl": "transformer_engine"},
     "sft-attention-mask", "model.transformer_impl"),
    ({**SFT, "stage.sft": {"packed_sequence": True}, "parallel.context_parallel_size": 2},
     "sft-attention-mask", "parallel.context_parallel_size"),
    ({**SFT, "data.mock": True}, "sft-mock-data", "data.mock"),
    ({**SFT, "data.reset_attention_mask": True}, "sft-pretraining-data", "data.reset_attention_mask"),
    ({**SFT, "data.eod_mask_loss": True}, "sft-pretraining-data", "data.eod_mask_loss"),
    ({**SFT, "data.train": [{"prefix": "data/a_text_document", "weight": 1.0},
                            {"prefix": "data/b_text_document", "weight": 3.0}]}, "sft-pretraining-data", "data.train"),
])
def test_spec_rules(changes, rule, key, tmp_path: Path, monkeypatch) -> None:
    found = [i for i in _issues(tmp_path, changes, {}, monkeypatch) if i.rule == rule]
    assert key in [i.key for i in found]
    assert all(i.fix is not None for i in found)


def test_sft_is_no_longer_refused_and_ar_sft_needs_no_mask(tmp_path: Path, monkeypatch) -> None:
    assert "runtime-sft" not in RULES
    ar = {**SFT, "objective.kind": "ar", "model.transformer_impl": "transformer_engine"}
    issues = _issues(tmp_path, ar, {}, monkeypatch)
    assert not [i for i in issues if i.severity == "error"], [(i.rule, i.key) for i in issues]


def _resolved(tmp_path: Path, changes: dict[str, Any]):
    spec = tmp_path / "s.py"
    spec.write_text(f"spec = {agree.merged(agree.BASE, changes)!r}\n", encoding="utf-8")
    return resolve(load(spec).spec)


def test_sft_defaults(tmp_path: Path) -> None:
    mdm = _resolved(tmp_path, SFT)
    assert default_loss_normalization(mdm.spec) == "sequence" and runtime_values(mdm).loss_normalization == "sequence"
    assert not runtime_values(mdm).calculate_per_token_loss
    assert sft_pad_eos_tokens(mdm.spec) is None
    ar = _resolved(tmp_path, {**SFT, "objective.kind": "ar"})
    assert default_loss_normalization(ar.spec) == "global_token" and sft_pad_eos_tokens(ar.spec) == 0
    assert default_loss_normalization(_resolved(tmp_path, {}).spec) == "global_token"
    packed = _resolved(tmp_path, {**SFT, "stage.sft": {"packed_sequence": True}})
    assert layer_path(packed.spec, packed.attention_mask, 1)[0] == "local"
    assert layer_path(mdm.spec, mdm.attention_mask, 1)[0] == "auto"
