"""Each tokenizer type in a spec: it validates, plans and compiles (train.py carries the EOD id its
files give), and validate's tokenizer rules read its files: vocabulary size against
model.vocab_size, the end-of-document id, the pad id and [MASK] (BERT's vocab.txt, a SentencePiece
.model; tests/kits/tokenizer_kit.py builds them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tokenizer_kit as kit
from dlmspec.check import find
from dlmspec.cli.commands import app
from dlmspec.resolve import eod_choice, resolve
from dlmspec.spec.models import Spec

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    texts = kit.corpus_texts(20)
    root = tmp_path_factory.mktemp("tok")
    lower = kit.wordpiece_vocab(root / "wp", texts, lowercase=True, size=800)
    data = root / "data"
    data.mkdir()
    for suffix in (".bin", ".idx"):
        (data / f"x_text_document{suffix}").write_bytes(b"")
    return {
        "vocab": lower,
        "sp": kit.sentencepiece_model(root / "sp", texts, size=500),
        "tiktoken": kit.tiktoken_vocab(root / "tt", texts, size=400),
        "hf": kit.hf_folder(root / "hf", lower),
        "prefix": data / "x_text_document",
    }


def _bert_lines(files) -> int:
    return len(files["vocab"].read_text(encoding="utf-8").splitlines())


def _types(files) -> dict[str, tuple[dict, int, int]]:
    """type -> (data.tokenizer keys, tokenizer size, EOD id)."""
    n = _bert_lines(files)
    return {
        "BertWordPieceLowerCase": ({"vocab_file": str(files["vocab"])}, n + 2, n + 1),
        "BertWordPieceCase": ({"vocab_file": str(files["vocab"])}, n + 2, n + 1),
        "GPTSentencePieceTokenizer": ({"model": str(files["sp"])}, 500, 2),
        "Llama2Tokenizer": ({"model": str(files["sp"])}, 500, 2),
        "SentencePieceTokenizer": ({"model": str(files["sp"])}, 500, 2),
        "TikTokenizer": ({"model": str(files["tiktoken"]), "vocab_size": 1400}, 1400, 2),
        "MultimodalTokenizer": ({"model": str(files["hf"])}, None, json.loads(
            (files["hf"] / "tokenizer.json").read_text())["model"]["vocab"]["[SEP]"]),
        "NullMultimodalTokenizer": ({"vocab_size": 999}, 1000, 999),
    }


def _spec(files, kind: str, **extra) -> dict:
    keys, size, _ = _types(files)[kind]
    data = {
        "name": "t",
        "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
                  "vocab_size": size or 1000, "max_position_embeddings": 128},
        "train": {"global_batch_size": 8, "seq_length": 64, "train_iters": 10, "eval_interval": 5},
        "data": {"train": [str(files["prefix"])], "tokenizer": {"type": kind, **keys}},
        "cluster": {"gpu": "h100", "gpus_per_node": 1, "nodes": 1},
    }
    for dotted, value in extra.items():
        *parents, last = dotted.split("__")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return data


def _toml(data: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return str(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    lines: list[str] = []

    def table(prefix: str, node: dict):
        plain = {k: v for k, v in node.items() if not isinstance(v, dict)}
        if prefix:
            lines.append(f"[{prefix}]")
        lines.extend(f"{k} = {value(v)}" for k, v in plain.items())
        for k, v in node.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", data)
    return "\n".join(lines) + "\n"


KINDS = ["BertWordPieceLowerCase", "BertWordPieceCase", "GPTSentencePieceTokenizer", "Llama2Tokenizer",
         "SentencePieceTokenizer", "TikTokenizer", "MultimodalTokenizer", "NullMultimodalTokenizer"]


@pytest.mark.parametrize("kind", KINDS)
def test_spec_with_the_type_validates_plans_and_compiles(kind, files, tmp_path):
    _, size, eod = _types(files)[kind]
    path = tmp_path / "spec.toml"
    path.write_text(_toml(_spec(files, kind)), encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["validate", str(path), "--json"])
    assert result.exit_code == 0, result.output
    issues = json.loads(result.output)["issues"]
    assert [i for i in issues if i["severity"] == "error"] == [], issues
    assert not [i for i in issues if i["rule"].startswith(("tokenizer", "eod", "mask"))], issues
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["compile", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    train = (tmp_path / "out" / "train.py").read_text(encoding="utf-8")
    assert f"eod_id={eod}," in train
    assert f"# tokenizer: {kind}" in train
    spec = Spec.model_validate(_spec(files, kind))
    assert eod_choice(spec).known and resolve(spec).tokenizer_size() == size


def _rules(files, kind: str, **extra) -> dict[str, object]:
    spec = Spec.model_validate(_spec(files, kind, **extra))
    return {i.rule: i for i in find(("spec", "paths"), spec)}


def test_vocab_rule_reads_the_bert_vocab_and_the_sentencepiece_model(files):
    n = _bert_lines(files)
    issue = _rules(files, "BertWordPieceCase", model__vocab_size=n)["tokenizer-vocab"]
    assert issue.key == "model.vocab_size" and f"{n + 2}" in issue.message + issue.hint
    issue = _rules(files, "Llama2Tokenizer", model__vocab_size=400)["tokenizer-vocab"]
    assert "500" in issue.message + issue.hint
    assert "tokenizer-vocab" in _rules(files, "NullMultimodalTokenizer", model__vocab_size=999)


def test_eod_rule_knows_each_types_own_eod(files):
    n = _bert_lines(files)
    issue = _rules(files, "BertWordPieceLowerCase", data__tokenizer__eod_id=0)["eod-id-tokenizer"]
    assert f"which is {n + 1}" in issue.message
    issue = _rules(files, "GPTSentencePieceTokenizer", data__tokenizer__eod_id=1)["eod-id-tokenizer"]
    assert "which is 2" in issue.message
    assert "eod-id-tokenizer" not in _rules(files, "Llama2Tokenizer", data__tokenizer__eod_id=2)


def test_files_rule_names_the_bert_vocab_file(files):
    spec = _spec(files, "BertWordPieceCase")
    del spec["data"]["tokenizer"]["vocab_file"]
    issues = {i.rule: i for i in find(("spec",), Spec.model_validate(spec))}
    assert issues["tokenizer-files"].key == "data.tokenizer.vocab_file"


def test_mask_rules_read_bert_and_sentencepiece_pad_and_mask(files):
    vocab = {t: i for i, t in enumerate(files["vocab"].read_text(encoding="utf-8").splitlines())}
    mdm = {"objective__kind": "mdm"}
    # [MASK] on the pad id: refused, for BERT's [PAD] and for the SentencePiece model's pad (3)
    issue = _rules(files, "BertWordPieceCase", objective__mask_token_id=vocab["[PAD]"], **mdm)["mask-token-not-pad"]
    assert "[PAD]" in issue.message
    assert "mask-token-not-pad" in _rules(files, "GPTSentencePieceTokenizer", objective__mask_token_id=3, **mdm)
    # BERT's own [MASK] is a special token: no warning; an ordinary word id warns and names [MASK]
    assert "mask-token-ordinary" not in _rules(files, "BertWordPieceCase", objective__mask_token_id=vocab["[MASK]"],
                                               **mdm)
    issue = _rules(files, "BertWordPieceCase", objective__mask_token_id=vocab["the"], **mdm)["mask-token-ordinary"]
    assert f"objective.mask_token_id = {vocab['[MASK]']}" in issue.hint


def test_null_multimodal_ids_are_ordinary_tokens_for_mask(files):
    issue = _rules(files, "NullMultimodalTokenizer", objective__kind="mdm", objective__mask_token_id=5,
                   model__vocab_size=1001)["mask-token-distinct"]
    assert "NullMultimodalTokenizer" in issue.message and "use an id above 999" in issue.hint


def test_tokenizer_files_larger_than_the_read_limit_are_not_read(files, monkeypatch):
    import dlmspec.tokenizers as tokenizers

    assert tokenizers.tokenizer_facts("BertWordPieceCase", vocab_file=str(files["vocab"])) is not None
    monkeypatch.setattr(tokenizers, "MAX_JSON_BYTES", 16)
    assert tokenizers.tokenizer_facts("BertWordPieceCase", vocab_file=str(files["vocab"])) is None
    assert tokenizers.tokenizer_facts("Llama2Tokenizer", tokenizer_model=str(files["sp"])) is None
