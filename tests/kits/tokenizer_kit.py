"""Small tokenizers trained offline on the shared corpus, for the tokenizer-type tests
(tests/unit/data/test_tokenizer_types.py, tests/integration/data/test_inspect.py,
tests/check/test_tokenizer_types.py): a BERT WordPiece ``vocab.txt`` (``tokenizers``), a
SentencePiece Unigram ``.model`` with BOS/EOS/pad (``sentencepiece``), a byte-level BPE turned into
megatron-core's tiktoken ``.json`` and a local Hugging Face tokenizer folder (a BERT tokenizer
with an ``[EOS]`` eos token) for MultimodalTokenizer. Each builds in about a second; build them
once per test module."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from shared_kit import SHARED_DATA

CORPUS = SHARED_DATA / "corpus" / "pydocs-train.jsonl"

#: Documents of the corpus the kit trains on (and the tests encode).
N_DOCS = 40


def corpus_texts(n: int = N_DOCS) -> list[str]:
    """The first ``n`` documents' text of the shared corpus."""
    with CORPUS.open(encoding="utf-8") as handle:
        return [json.loads(next(handle))["text"] for _ in range(n)]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    """``{"text": ...}`` per line."""
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def wordpiece_vocab(folder: Path, texts: list[str], lowercase: bool, size: int = 2000) -> Path:
    """A BERT ``vocab.txt`` (``[PAD] [UNK] [CLS] [SEP] [MASK]`` first) trained by ``tokenizers``."""
    from tokenizers import BertWordPieceTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    trainer = BertWordPieceTokenizer(lowercase=lowercase, strip_accents=lowercase)
    trainer.train_from_iterator(texts, vocab_size=size, min_frequency=2,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    trainer.save_model(str(folder))
    return folder / "vocab.txt"


def sentencepiece_model(folder: Path, texts: list[str], size: int = 1000) -> Path:
    """A Unigram SentencePiece model (Llama-2's layout: unk 0, bos 1, eos 2, plus pad 3)."""
    import io

    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(line for t in texts for line in t.splitlines() if line.strip()),
        model_writer=buffer, vocab_size=size, model_type="unigram", unk_id=0, bos_id=1, eos_id=2,
        pad_id=3, character_coverage=1.0, minloglevel=2, num_threads=1,
    )
    path = folder / "tok.model"
    path.write_bytes(buffer.getvalue())
    return path


def tiktoken_vocab(folder: Path, texts: list[str], size: int = 600) -> Path:
    """megatron-core's tiktoken vocabulary (a JSON list of ``rank``/``token_bytes``/``token_str``):
    the 256 bytes at ranks 0..255, then a byte-level BPE's merged tokens in merge order."""
    from tokenizers import ByteLevelBPETokenizer

    folder.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=size, min_frequency=2, special_tokens=[])
    char_to_byte = {c: b for b, c in _bytes_to_unicode().items()}
    merged = sorted((i, tok) for tok, i in bpe.get_vocab().items() if len(tok) > 1)
    entries = [bytes([b]) for b in range(256)] + [bytes(char_to_byte[c] for c in tok) for _, tok in merged]
    rows = [{"rank": i, "token_bytes": base64.b64encode(b).decode(), "token_str": b.decode("utf-8", "replace")}
            for i, b in enumerate(entries)]
    path = folder / "tiktoken.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    return path


def hf_folder(folder: Path, vocab_txt: Path) -> Path:
    """A local Hugging Face tokenizer folder (BertTokenizerFast of ``vocab_txt``, eos ``[SEP]``)."""
    from transformers import BertTokenizerFast

    tok = BertTokenizerFast(vocab=str(vocab_txt), do_lower_case=True, eos_token="[SEP]")
    tok.save_pretrained(str(folder))
    return folder


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))
