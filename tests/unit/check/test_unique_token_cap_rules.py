"""The rules of data.train[].max_unique_tokens and of repetition (dlmspec/check/data.py):
``data-cap-kind`` (a cap only where it can be honoured), ``data-cap-tokens`` (a cap within its
dataset's training tokens that keeps a document) and the ``data-repetition`` note, which fires past
the literature's epochs for the objective (AR 4, diffusion 100) and not at or below them. Each
finding's structured fix, applied, silences the rule."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from blend_shards import docs_of, null_tokenizer, write_shard
from dlmspec.check import RULES, load_for
from dlmspec.errors import SpecError
from spec_kit import write_toml, spec_dict

#: 32 tokens a step (global batch 4 x sequence 8) on 4 GPUs (DP 4, micro batch 1).
RUN = {"data.mock": None, "data.tokenizer": {"type": "NullTokenizer", "vocab_size": 999},
       "train.seq_length": 8, "train.global_batch_size": 4, "train.micro_batch_size": 1, "train.lr_warmup_iters": 0,
       "train.eval_interval": 5, "model.max_position_embeddings": 64, "cluster.gpus_per_node": 4,
       "data.valid": ["data/v_text_document"], "logging.tensorboard_dir": "runs/t/tensorboard"}


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """data/a: 40 tokens in 10 documents of 4; data/v: validation; tmp_path the working directory."""
    monkeypatch.chdir(tmp_path)
    write_shard(str(tmp_path / "data/a_text_document"), docs_of(40), null_tokenizer())
    write_shard(str(tmp_path / "data/v_text_document"), docs_of(16), null_tokenizer())
    return tmp_path


def _issues(folder: Path, data: dict[str, Any], rule: str) -> list:
    path = write_toml(folder / "spec.toml", data)
    try:
        issues = load_for("validate", path)[2]
    except SpecError as exc:
        issues = exc.issues
    return [i for i in issues if i.rule == rule]


def _apply(data: dict[str, Any], fix) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for key in fix.unset:
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node[part]
        node.pop(last, None)
    for key, value in fix.set.items():
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[last] = value
    return data


def _fires_and_fix_silences(folder: Path, data: dict[str, Any], rule: str, key: str) -> Any:
    found = _issues(folder, data, rule)
    assert found and all(i.key == key for i in found), [(i.key, i.message) for i in found]
    (issue,) = found
    assert issue.severity == RULES[rule].severity and issue.hint and issue.fix is not None
    assert not _issues(folder, _apply(data, issue.fix), rule)
    return issue


def test_a_cap_on_validation_data_is_refused(folder: Path) -> None:
    data = spec_dict(RUN, {"data.train": ["data/a_text_document"], "train.train_iters": 2,
                           "data.valid": [{"prefix": "data/v_text_document", "max_unique_tokens": 8}]})
    issue = _fires_and_fix_silences(folder, data, "data-cap-kind", "data.valid")
    assert "training data only" in issue.message


@pytest.mark.parametrize(("changes", "why"), [
    ({"data.train": [{"prefix": "data/a*_text_document", "max_unique_tokens": 8}]}, "glob of shards"),
    ({"data.train": [{"prefix": "data/a_text_document.manifest.json", "max_unique_tokens": 8}]}, "manifest of shards"),
    ({"data.mock": True, "data.valid": None, "data.train": [{"prefix": "data/a_text_document",
                                                             "max_unique_tokens": 8}]}, "mock data"),
    ({"stage.kind": "sft", "data.train": [{"prefix": "data/a_text_document", "max_unique_tokens": 8}]},
     "stage.kind = 'sft'"),
])
def test_a_cap_that_cannot_be_honoured_is_refused(folder: Path, changes: dict[str, Any], why: str) -> None:
    data = spec_dict(RUN, {"train.train_iters": 2}, changes)
    found = _issues(folder, data, "data-cap-kind")
    assert len(found) == 1 and found[0].key == "data.train" and why in found[0].message, found
    assert found[0].fix is not None
    assert not _issues(folder, _apply(data, found[0].fix), "data-cap-kind")


def test_a_cap_above_the_training_tokens_is_refused_with_the_tokens(folder: Path) -> None:
    data = spec_dict(RUN, {"train.train_iters": 2, "data.train": [{"prefix": "data/a_text_document",
                                                                   "max_unique_tokens": 41}]})
    issue = _fires_and_fix_silences(folder, data, "data-cap-tokens", "data.train")
    assert issue.fix.set == {"data.train.0.max_unique_tokens": 40}
    # at the tokens exactly: accepted
    data["data"]["train"][0]["max_unique_tokens"] = 40
    assert not _issues(folder, data, "data-cap-tokens")


def test_a_cap_below_the_first_document_is_refused(folder: Path) -> None:
    data = spec_dict(RUN, {"train.train_iters": 2, "data.train": [{"prefix": "data/a_text_document",
                                                                   "max_unique_tokens": 3}]})
    issue = _fires_and_fix_silences(folder, data, "data-cap-tokens", "data.train")
    assert "keeps no whole document" in issue.message and issue.fix.set == {"data.train.0.max_unique_tokens": 4}


def test_a_cap_above_the_tokens_a_record_gives_is_refused_without_the_index(folder: Path) -> None:
    (folder / "data/a_text_document.idx").unlink()  # the record alone: 40 tokens
    data = spec_dict(RUN, {"train.train_iters": 2, "data.train": [{"prefix": "data/a_text_document",
                                                                   "max_unique_tokens": 41}]})
    issue = _fires_and_fix_silences(folder, data, "data-cap-tokens", "data.train")
    assert "its record gives" in issue.message and issue.fix.set == {"data.train.0.max_unique_tokens": 40}


def test_a_cap_on_a_dataset_that_is_not_here_is_not_judged(folder: Path) -> None:
    data = spec_dict(RUN, {"train.train_iters": 2, "data.train": [{"prefix": "data/elsewhere_text_document",
                                                                   "max_unique_tokens": 10**9}]})
    assert not _issues(folder, data, "data-cap-tokens")


@pytest.mark.parametrize(("kind", "threshold"), [("ar", 4), ("mdm", 100)])
def test_the_repetition_note_fires_above_the_threshold_and_not_below(folder: Path, kind: str,
                                                                     threshold: int) -> None:
    # 40 unique tokens, 32 drawn a step: threshold x 40 / 32 steps reach the threshold exactly
    at = threshold * 40 // 32
    assert at * 32 == threshold * 40
    base = spec_dict(RUN, {"objective.kind": kind, "data.train": ["data/a_text_document"]})
    assert not _issues(folder, spec_dict(base, {"train.train_iters": at}), "data-repetition")
    over = spec_dict(base, {"train.train_iters": at + 1})
    issue = _fires_and_fix_silences(folder, over, "data-repetition", "data.train")
    assert issue.severity == "warning" and f"past the ~{threshold} epochs" in issue.message
    assert issue.fix.set == {"train.train_iters": at}
    source = RULES["data-repetition"].source
    assert "Muennighoff" in source and "Super Data Learners" in source
    assert ("Muennighoff" if kind == "ar" else "Super Data Learners") in issue.message


def test_the_repetition_note_counts_the_cap(folder: Path) -> None:
    # 20 steps of 32 tokens on 40 unique: 16 epochs, quiet for mdm; capped to 4 tokens: 160 epochs
    base = spec_dict(RUN, {"train.train_iters": 20, "data.train": ["data/a_text_document"]})
    assert not _issues(folder, base, "data-repetition")
    capped = spec_dict(base, {"data.train": [{"prefix": "data/a_text_document", "max_unique_tokens": 4}]})
    (issue,) = _issues(folder, capped, "data-repetition")
    assert "160.0 epochs" in issue.message


def test_a_train_tokens_budget_is_remedied_in_tokens(folder: Path) -> None:
    data = spec_dict(RUN, {"objective.kind": "ar", "train.train_iters": None, "train.train_tokens": 320,
                           "data.train": ["data/a_text_document"]})
    issue = _fires_and_fix_silences(folder, data, "data-repetition", "data.train")
    assert issue.fix.set == {"train.train_tokens": 160}
