"""The [MASK] rules of dlmspec/check/mask.py that read a tokenizer's files: mask-token-published
(a preset whose [MASK] is a token of its own published tokenizer, MegaDLMs' <|mask_token|> = 50277,
trained with a tokenizer that lacks it). The tokenizer folders are written here: a few entries of
tokenizer.json are enough for what the rule reads (its largest id and its added tokens)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from dlmspec.check import RULES, issues_for
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from dlmspec.spec.models import Spec
from spec_kit import spec_dict

ROOT = Path(__file__).resolve().parents[3]
RULE = "mask-token-published"
MEGADLMS_FOLDER = ".models/MegaDLMs/megatron/training/tokenizer/gptneox_tokenizer"

#: A small megadlms-1.7b spec (preset, [MASK] from the preset: 50277) with a Hugging Face tokenizer.
BASE: dict[str, Any] = spec_dict({
    "model": {"num_layers": 2, "hidden_size": 256, "ffn_hidden_size": 512, "num_attention_heads": 4, "num_query_groups": 4, "preset": "megadlms-1.7b"},
    "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 256, "train_iters": 10},
    "data": {"tokenizer": {"type": "HuggingFaceTokenizer", "model": "tok", "eod_id": 0}, "train": ["data/x_text_document"]},
})


def _tokenizer(folder: Path, size: int, added: dict[int, tuple[str, bool]]) -> Path:
    """A tokenizer.json whose ids are 0 .. size - 1 (the vocabulary's first and last entries and
    ``added``: id -> (text, special)), and the tokenizer_config.json a GPT-NeoX folder has."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"!": 0, "a": 1, "Ġthe": size - 1 - len(added)} if size > len(added) + 2 else {"!": 0}
    tokens = [{"id": i, "content": text, "special": special} for i, (text, special) in sorted(added.items())]
    tokens.insert(0, {"id": 0, "content": "<|endoftext|>", "special": True})
    (folder / "tokenizer.json").write_text(json.dumps({"added_tokens": tokens, "model": {"type": "BPE", "vocab": vocab}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return folder


def _issues(changes: dict[str, Any], tmp_path: Path, monkeypatch) -> list:
    monkeypatch.chdir(tmp_path)
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    spec = Spec.model_validate(data)
    return [i for i in issues_for("validate", spec, resolve(spec)) if i.rule == RULE]


def test_the_rule_is_registered_as_a_paths_warning() -> None:
    assert RULES[RULE].severity == "warning" and RULES[RULE].scope == "paths"


def test_stock_gpt_neox_folder_lacks_the_mask_token(tmp_path: Path, monkeypatch) -> None:
    """The hub's GPT-NeoX-20B tokenizer, 50,277 ids (0 .. 50276): 50277 is a padding row, not a token."""
    _tokenizer(tmp_path / "tok", 50277, {50276: ("  ", False)})
    (issue,) = _issues({}, tmp_path, monkeypatch)
    assert issue.key == "objective.mask_token_id" and issue.value == 50277 and issue.severity == "warning"
    assert "not a token" in issue.message and "<|mask_token|>" in issue.message
    assert "50,277 ids" in issue.message or "50277 ids" in issue.message
    assert issue.fix is not None and issue.fix.set == {"data.tokenizer.model": MEGADLMS_FOLDER}
    assert "JinjieNi/MegaDLMs" in issue.hint and "sparse-checkout" in issue.hint


def test_megadlms_tokenizer_has_it(tmp_path: Path, monkeypatch) -> None:
    """MegaDLMs' variant: <|mask_token|> = 50277, <|pad_token|> = 50278, 10 extra special tokens."""
    added = {50277: ("<|mask_token|>", True), 50278: ("<|pad_token|>", True)}
    added.update({50279 + i: (f"<|extra_special_token_{i}>", True) for i in range(10)})
    _tokenizer(tmp_path / "tok", 50289, added)
    assert _issues({}, tmp_path, monkeypatch) == []


def test_a_special_token_that_is_not_the_mask(tmp_path: Path, monkeypatch) -> None:
    """Id 50277 is a special token of the tokenizer, but another one (not MegaDLMs' [MASK])."""
    _tokenizer(tmp_path / "tok", 50278, {50277: ("<|im_start|>", True)})
    (issue,) = _issues({}, tmp_path, monkeypatch)
    assert "'<|im_start|>'" in issue.message and "<|mask_token|>" in issue.message


def test_the_hub_name_is_known_without_its_files(tmp_path: Path, monkeypatch) -> None:
    """EleutherAI/gpt-neox-20b on the hub (no files here): its 50,277 ids are known."""
    (issue,) = _issues({"data.tokenizer.model": "EleutherAI/gpt-neox-20b"}, tmp_path, monkeypatch)
    assert "EleutherAI/gpt-neox-20b" in issue.message and issue.fix.set == {"data.tokenizer.model": MEGADLMS_FOLDER}


def test_silent_where_it_cannot_tell_or_the_id_is_not_the_published_one(tmp_path: Path, monkeypatch) -> None:
    assert _issues({"data.tokenizer.model": "someone/unknown-tokenizer"}, tmp_path, monkeypatch) == []
    assert _issues({}, tmp_path, monkeypatch) == []  # the folder "tok" is not on this machine
    _tokenizer(tmp_path / "tok", 50277, {})
    # the user's own [MASK] (a padded row they chose), or a model without a published [MASK]
    assert _issues({"objective.mask_token_id": 50280}, tmp_path, monkeypatch) == []
    assert _issues({"model.preset": "qwen3-0.6b", "model.vocab_size": 50304, "objective.mask_token_id": 50277},
                   tmp_path, monkeypatch) == []
    assert _issues({"objective.kind": "ar"}, tmp_path, monkeypatch) == []


def test_the_bundled_spec_points_at_the_megadlms_folder(tmp_path: Path, monkeypatch) -> None:
    """specs/megadlms-1.7b-mdm.toml: silent without the folder, silent with MegaDLMs' files there,
    a warning with the stock tokenizer's files in their place."""
    loaded = load(ROOT / "specs" / "megadlms-1.7b-mdm.toml")
    assert loaded.spec.data.tokenizer.model == MEGADLMS_FOLDER
    monkeypatch.chdir(tmp_path)

    def fired() -> list:
        return [i for i in issues_for("validate", loaded, resolve(loaded.spec)) if i.rule == RULE]

    assert fired() == []
    _tokenizer(tmp_path / MEGADLMS_FOLDER, 50277, {})
    assert len(fired()) == 1
    _tokenizer(tmp_path / MEGADLMS_FOLDER, 50289, {50277: ("<|mask_token|>", True), 50278: ("<|pad_token|>", True)})
    assert fired() == []
