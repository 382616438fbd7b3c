"""Every tokenizer type of ``dlmspec.tokenizers`` encodes as its reference does, on tokenizers
trained offline on the shared corpus (tests/kits/tokenizer_kit.py): transformers' BertTokenizer for
the WordPiece types, sentencepiece for the SentencePiece ones, tiktoken for TikTokenizer,
transformers' AutoTokenizer for MultimodalTokenizer; and megatron-core's class of the same name
where it builds offline. Then ``data prepare`` with each type, and megatron's GPT dataset loading
the result through the runtime (``dlmspec.backends.megatron.data.build_datasets``) with the
vocabulary size and EOD id the compiler derives from the spec."""

from __future__ import annotations

import base64
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import tokenizer_kit as kit
from dlmspec.data.prepare import prepare
from dlmspec.tokenizers import TOKENIZER_TYPES, TokenizerError, build_tokenizer

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return kit.corpus_texts()


@pytest.fixture(scope="module")
def files(tmp_path_factory, texts) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    lower = kit.wordpiece_vocab(root / "wp-lower", texts, lowercase=True)
    return {
        "lower": lower,
        "cased": kit.wordpiece_vocab(root / "wp-cased", texts, lowercase=False),
        "sp": kit.sentencepiece_model(root / "sp", texts),
        "tiktoken": kit.tiktoken_vocab(root / "tt", texts),
        "hf": kit.hf_folder(root / "hf", lower),
        "jsonl": kit.write_jsonl(root / "docs.jsonl", texts[:12]),
    }


def _vocab_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_new_types_are_known():
    for name in ("BertWordPieceLowerCase", "BertWordPieceCase", "GPTSentencePieceTokenizer",
                 "Llama2Tokenizer", "MultimodalTokenizer", "NullMultimodalTokenizer"):
        assert name in TOKENIZER_TYPES


@pytest.mark.parametrize("kind, key, lower", [("BertWordPieceLowerCase", "lower", True),
                                              ("BertWordPieceCase", "cased", False)])
def test_bert_wordpiece_matches_transformers(kind, key, lower, files, texts):
    from transformers import BertTokenizer

    vocab = files[key]
    tok = build_tokenizer(kind, vocab_file=str(vocab))
    reference = BertTokenizer(vocab=str(vocab), do_lower_case=lower)  # transformers 5: vocab=
    for text in texts:
        assert tok.tokenize(text) == reference.encode(text, add_special_tokens=False)
    # Megatron-LM's _BertWordPieceTokenizer appends [BOS] and [EOS] to the vocabulary; EOD is [EOS].
    n = _vocab_lines(vocab)
    assert (tok.bos, tok.eod, tok.eos, tok.vocab_size) == (n, n + 1, n + 1, n + 2)
    ids = {t: i for i, t in enumerate(vocab.read_text(encoding="utf-8").splitlines())}
    assert (tok.pad, tok.mask) == (ids["[PAD]"], ids["[MASK]"])
    upper = tok.tokenize("Python")
    assert (upper == tok.tokenize("python")) is lower  # lower-casing only in the LowerCase type


def test_bert_wordpiece_needs_its_vocab_and_special_tokens(tmp_path):
    with pytest.raises(TokenizerError, match="--vocab-file"):
        build_tokenizer("BertWordPieceLowerCase")
    bad = tmp_path / "vocab.txt"
    bad.write_text("[PAD]\n[UNK]\nhello\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"\[CLS\]"):
        build_tokenizer("BertWordPieceCase", vocab_file=str(bad))


def _megatron_core(kind: str, model: str):
    """megatron-core 0.16.1's own tokenizer of that name (megatron.core.tokenizers build_tokenizer)."""
    from types import SimpleNamespace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer as mcore_build

    args = SimpleNamespace(tokenizer_type=kind, tokenizer_model=model, tokenizer_sentencepiece_legacy=False,
                           tokenizer_special_tokens=None, tokenizer_metadata=None)
    return mcore_build(args)


def test_sentencepiece_types_match_sentencepiece_and_megatron_core(files, texts):
    import sentencepiece as spm

    model = str(files["sp"])
    sp = spm.SentencePieceProcessor(model_file=model)
    plain = build_tokenizer("SentencePieceTokenizer", tokenizer_model=model)
    gpt = build_tokenizer("GPTSentencePieceTokenizer", tokenizer_model=model)
    llama = build_tokenizer("Llama2Tokenizer", tokenizer_model=model)
    mcore = {k: _megatron_core(k, model)
             for k in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")}
    for text in texts:
        ids = sp.encode_as_ids(text)
        assert plain.tokenize(text) == ids == mcore["SentencePieceTokenizer"].tokenize(text)
        assert gpt.tokenize(text) == ids == mcore["GPTSentencePieceTokenizer"].tokenize(text)
        assert llama.tokenize(text) == [sp.bos_id()] + ids  # Megatron-LM's _Llama2Tokenizer: bos=True
        # megatron-core 0.16.1 maps Llama2Tokenizer to its plain SentencePiece class: no BOS
        assert mcore["Llama2Tokenizer"].tokenize(text) == ids
    for tok in (plain, gpt, llama):
        assert (tok.eod, tok.vocab_size) == (sp.eos_id(), sp.get_piece_size())
    assert (gpt.bos, gpt.pad, llama.bos, llama.pad) == (1, 3, 1, 3)
    assert gpt.detokenize(gpt.tokenize("Hello world")) == "Hello world"


def test_tiktoken_matches_tiktoken(files, texts):
    import tiktoken

    path = files["tiktoken"]
    rows = json.loads(path.read_text(encoding="utf-8"))
    tok = build_tokenizer("TikTokenizer", tokenizer_model=str(path), vocab_size=1000 + len(rows))
    from megatron.core.tokenizers.text.libraries.tiktoken_tokenizer import _PATTERN_TIKTOKEN_V2

    reference = tiktoken.Encoding(
        name="ref", pat_str=_PATTERN_TIKTOKEN_V2,
        mergeable_ranks={base64.b64decode(r["token_bytes"]): r["rank"] + 1000 for r in rows},
        special_tokens={},
    )
    for text in texts:
        ids = tok.tokenize(text)
        assert ids == reference.encode_ordinary(text)
    assert tok.detokenize(tok.tokenize("Hello world")) == "Hello world"
    assert (tok.eod, tok.vocab_size) == (2, 1000 + len(rows))  # megatron's "</s>" among 1000 specials


def test_multimodal_text_matches_autotokenizer_and_refuses_images(files, texts):
    from transformers import AutoTokenizer

    folder = str(files["hf"])
    tok = build_tokenizer("MultimodalTokenizer", tokenizer_model=folder)
    reference = AutoTokenizer.from_pretrained(folder)
    for text in texts[:10]:
        assert tok.tokenize(text) == reference.encode(text)  # Megatron: encode(), special tokens added
    assert tok.eod == reference.eos_token_id and tok.vocab_size == len(reference)
    with pytest.raises(TokenizerError, match="<image>"):
        tok.tokenize("look: <image> here")
    with pytest.raises(TokenizerError, match="--tokenizer-model"):
        build_tokenizer("MultimodalTokenizer")


def test_null_multimodal_is_the_null_tokenizer_for_text():
    tok = build_tokenizer("NullMultimodalTokenizer", vocab_size=500)
    assert tok.tokenize("1 2 499") == [1, 2, 499]
    assert (tok.eod, tok.vocab_size) == (500, 501)
    with pytest.raises(TokenizerError, match="--vocab-size"):
        build_tokenizer("NullMultimodalTokenizer")


# ------------------------------------------------------------- data prepare + the runtime's loading


def _cases(files) -> dict[str, dict]:
    return {
        "BertWordPieceLowerCase": {"vocab_file": str(files["lower"])},
        "BertWordPieceCase": {"vocab_file": str(files["cased"])},
        "GPTSentencePieceTokenizer": {"tokenizer_model": str(files["sp"])},
        "Llama2Tokenizer": {"tokenizer_model": str(files["sp"])},
        "SentencePieceTokenizer": {"tokenizer_model": str(files["sp"])},
        "TikTokenizer": {"tokenizer_model": str(files["tiktoken"]), "vocab_size": 1600},
        "MultimodalTokenizer": {"tokenizer_model": str(files["hf"])},
    }



@pytest.mark.parametrize("kind", ["BertWordPieceLowerCase", "BertWordPieceCase", "GPTSentencePieceTokenizer",
                                  "Llama2Tokenizer", "SentencePieceTokenizer", "TikTokenizer",
                                  "MultimodalTokenizer"])
def test_prepare_then_runtime_loads_the_dataset(kind, files, texts, tmp_path, gloo_world):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from dlmspec.backends.megatron.data import DataConfig, build_datasets
    from dlmspec.resolve import eod_choice
    from dlmspec.spec.models import Spec

    args = _cases(files)[kind]
    result = prepare(files["jsonl"], tmp_path / "out", tokenizer_type=kind, append_eod=True, **args)
    tok = build_tokenizer(kind, **args)
    prefix = result.datasets[0].prefix
    written = IndexedDataset(prefix, mmap=True)
    for i, text in enumerate(texts[:12]):
        assert written[i].tolist() == tok.tokenize(text) + [tok.eod]

    # The spec's view of the same tokenizer: eod and size as the compiler derives them.
    keys = {"model": args.get("tokenizer_model"), "vocab_file": args.get("vocab_file"),
            "vocab_size": args.get("vocab_size")}
    spec = Spec.model_validate({
        "name": "t",
        "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
                  "vocab_size": tok.vocab_size + 1, "max_position_embeddings": 128},
        "train": {"global_batch_size": 8, "seq_length": 64, "train_iters": 10},
        "data": {"train": [{"prefix": prefix}],
                 "tokenizer": {"type": kind, **{k: v for k, v in keys.items() if v is not None}}},
    })
    eod = eod_choice(spec)
    assert eod.known and eod.value == tok.eod
    data = DataConfig(seq_length=64, vocab_size=spec.model.vocab_size, eod_id=eod.value,
                      blend=[(prefix, 1.0)], split="1,0,0", cache_dir=str(tmp_path / "cache"))
    train, _ = build_datasets(data, seed=1, train_samples=8, valid_samples=0, add_extra_token_to_sequence=False)
    sample = train[0]
    assert sample["tokens"].shape == (64,)
    assert int(sample["tokens"].max()) < tok.vocab_size
    assert np.isin(sample["tokens"].numpy(), np.asarray(written[0].tolist() + written[1].tolist())).any()


def test_prepare_refuses_an_image_placeholder_naming_the_line(files, tmp_path):
    from dlmspec.data.errors import DataPrepareError

    source = kit.write_jsonl(tmp_path / "img.jsonl", ["plain text", "a picture: <image>"])
    with pytest.raises(DataPrepareError, match=r"img.jsonl:2: .*<image>.*text-only"):
        prepare(source, tmp_path / "out", tokenizer_type="MultimodalTokenizer", tokenizer_model=str(files["hf"]))
    assert not list(tmp_path.glob("out*"))
