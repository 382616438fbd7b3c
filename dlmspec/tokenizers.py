"""One tokenizer factory for data preparation and for the generated runtime.

:func:`build_tokenizer` takes Megatron-LM's tokenizer type names (``--tokenizer-type``) and
returns an object with the contract of :class:`Tokenizer`:

* ``tokenize(text: str) -> list[int]``: token ids of ``text``, no special tokens added;
* ``eod``: the end-of-document id appended by ``--append-eod`` (``None`` when the tokenizer
  has none);
* ``vocab_size``: ``int``, one more than the largest id ``tokenize`` can return (plus any
  special ids); it picks the on-disk dtype (``DType.optimal_dtype``) and the embedding size.

Every object also carries ``unique_identifiers`` and ``detokenize``, so the same object can be
handed to megatron-core's ``GPTDatasetConfig(tokenizer=...)``.

Where megatron-core has a class for a type it is used (``MegatronTokenizer.from_pretrained``
with the ``huggingface``, ``sentencepiece``, ``tiktoken`` and ``null`` libraries, as
``megatron.core.tokenizers.text.utils.build_tokenizer`` does). ``GPT2BPETokenizer`` is the
exception: megatron-core's ``MegatronHFTokenizer`` fetches the ``gpt2`` config from the
Hugging Face hub even when vocab and merges are local, so it is built offline here with
``tokenizers.ByteLevelBPETokenizer(vocab, merges)``, the same byte-level BPE and pre-split
regex as GPT-2 ("Hello world" -> ``[15496, 995]``, EOD ``<|endoftext|>`` = 50256).

The other types follow Megatron-LM's classes of the same name
(``megatron/training/tokenizer/tokenizer.py``; megatron-core 0.16.1 has no class for them, or
one that needs the Hugging Face hub), built offline here:

* ``BertWordPieceLowerCase`` / ``BertWordPieceCase`` (``_BertWordPieceTokenizer``): BERT's
  WordPiece of ``vocab.txt`` (``tokenizers`` WordPiece with BERT's normalizer and pre-splitter;
  lower-casing and accent stripping in the LowerCase type only), no [CLS]/[SEP] added;
  ``[BOS]`` and ``[EOS]`` are appended to the vocabulary when absent, EOD is ``[EOS]``;
* ``GPTSentencePieceTokenizer``: the SentencePiece model's ids, nothing added, EOD = its eos;
* ``Llama2Tokenizer``: the same ids with the model's BOS prepended to every sentence (Megatron-LM's
  ``tokenize(s, bos=True)``), EOD = its eos;
* ``MultimodalTokenizer``: text only: a local Hugging Face tokenizer's ``encode(text)``
  (its own BOS/EOS added as it adds them), ``<image>`` registered and refused in text;
* ``NullMultimodalTokenizer``: as ``NullTokenizer`` for text.

Per-type conventions and what is refused: docs/tokenizers.md.

Nothing here imports torch or megatron at module import time.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

#: Megatron-LM ``--tokenizer-type`` names this factory builds (the one table: :mod:`dlmspec.names`).
from dlmspec.names import TOKENIZER_TYPES

#: Short lowercase aliases accepted next to the Megatron names.
TOKENIZER_ALIASES: dict[str, str] = {
    "gpt2bpe": "GPT2BPETokenizer",
    "huggingface": "HuggingFaceTokenizer",
    "sentencepiece": "SentencePieceTokenizer",
    "tiktoken": "TikTokenizer",
    "null": "NullTokenizer",
}

GPT2_EOD_TOKEN = "<|endoftext|>"


class TokenizerError(ValueError):
    """A tokenizer cannot be built from the given arguments (message says why and how)."""


@runtime_checkable
class Tokenizer(Protocol):
    """What :func:`build_tokenizer` returns."""

    def tokenize(self, text: str) -> list[int]: ...

    @property
    def eod(self) -> int | None: ...

    @property
    def vocab_size(self) -> int: ...


def valid_tokenizer_types() -> str:
    """Human-readable list of accepted names, for error messages and ``--help``."""
    aliases = ", ".join(TOKENIZER_ALIASES)
    return f"{', '.join(TOKENIZER_TYPES)} (aliases: {aliases})"


def canonical_tokenizer_type(name: str) -> str:
    """Map a Megatron name or an alias (any case) to the Megatron name.

    Raises:
        TokenizerError: ``name`` is not a known type; the message lists the valid ones.
    """
    lowered = (name or "").strip().lower()
    for canonical in TOKENIZER_TYPES:
        if lowered == canonical.lower():
            return canonical
    if lowered in TOKENIZER_ALIASES:
        return TOKENIZER_ALIASES[lowered]
    raise TokenizerError(f"unknown tokenizer type {name!r}; valid types: {valid_tokenizer_types()}")


@dataclass(frozen=True)
class TokenizerArgs:
    """Picklable arguments of :func:`build_tokenizer` (sent to worker processes)."""

    tokenizer_type: str
    tokenizer_model: str | None = None
    vocab_file: str | None = None
    merge_file: str | None = None
    vocab_size: int | None = None

    def files(self) -> dict[str, str | None]:
        """The files this tokenizer was built from, by Megatron's argument name (for the
        dataset record)."""
        return {"tokenizer_model": self.tokenizer_model, "vocab_file": self.vocab_file,
                "merge_file": self.merge_file}

    def build(self) -> Tokenizer:
        return build_tokenizer(**asdict(self))


class GPT2BPETokenizer:
    """GPT-2 byte-level BPE from ``vocab.json`` + ``merges.txt`` (``tokenizers`` library).

    ``<|endoftext|>`` is not registered as a special token, so the string in a document is
    split by BPE like any other text, as in Megatron-LM's GPT-2 tokenizer; only
    ``--append-eod`` inserts the id 50256.
    """

    def __init__(self, vocab_file: str, merge_file: str) -> None:
        from tokenizers import ByteLevelBPETokenizer

        self.vocab_file = os.path.abspath(vocab_file)
        self.merge_file = os.path.abspath(merge_file)
        try:
            self._tokenizer = ByteLevelBPETokenizer(self.vocab_file, self.merge_file)
        except Exception as exc:  # the Rust loader raises plain Exception on bad files
            raise TokenizerError(
                f"cannot load GPT-2 BPE from vocab {vocab_file!r} and merges {merge_file!r}: {exc}"
            ) from None
        eod = self._tokenizer.token_to_id(GPT2_EOD_TOKEN)
        if eod is None:
            raise TokenizerError(f"vocab file {vocab_file!r} has no {GPT2_EOD_TOKEN} token")
        self._eod = int(eod)
        self._vocab_size = int(self._tokenizer.get_vocab_size())

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.encode(text).ids

    def detokenize(self, ids: list[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    @property
    def eod(self) -> int:
        return self._eod

    @property
    def eos(self) -> int:
        return self._eod

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def unique_identifiers(self) -> OrderedDict:
        """What megatron-core hashes into its dataset cache names."""
        return OrderedDict(
            [
                ("class", f"{type(self).__module__}.{type(self).__qualname__}"),
                ("vocab_file", self.vocab_file),
                ("merge_file", self.merge_file),
            ]
        )


#: BERT's special tokens Megatron-LM's ``_BertWordPieceTokenizer`` reads from ``vocab.txt``.
BERT_SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")
#: The tokens Megatron-LM's ``_BertWordPieceTokenizer`` appends (when absent), in order.
BERT_ADDED_TOKENS = ("[BOS]", "[EOS]")


def read_bert_vocab(path: str) -> dict[str, int]:
    """``token -> id`` of a BERT ``vocab.txt`` (one token a line, id = line number, as
    ``bert_tokenization.load_vocab``), then ``[BOS]`` and ``[EOS]`` appended when absent, as
    Megatron-LM's ``_BertWordPieceTokenizer.add_token`` does.

    Raises:
        OSError, UnicodeDecodeError: the file cannot be read.
    """
    vocab: dict[str, int] = {}
    with open(path, encoding="utf-8") as handle:
        for index, line in enumerate(handle):
            vocab[line.strip()] = index
    for token in BERT_ADDED_TOKENS:
        if token not in vocab:
            vocab[token] = len(vocab)
    return vocab


class BertWordPieceTokenizer:
    """Megatron-LM's ``BertWordPieceLowerCase`` / ``BertWordPieceCase``: BERT's WordPiece of a
    ``vocab.txt`` (``tokenizers`` WordPiece, BERT normalizer and pre-splitter: the same text
    cleaning, CJK splitting and punctuation splitting as ``bert_tokenization.FullTokenizer``;
    ``lower_case`` lower-cases and strips accents). ``tokenize`` adds no [CLS]/[SEP]; EOD is
    ``[EOS]`` (appended to the vocabulary when absent, after ``[BOS]``), so ``vocab_size`` is
    the file's lines + 2 for a standard BERT vocabulary. Special-token strings in the text are
    split like any text, as in Megatron-LM."""

    def __init__(self, vocab_file: str, lower_case: bool) -> None:
        from tokenizers import Tokenizer as RustTokenizer
        from tokenizers.models import WordPiece
        from tokenizers.normalizers import BertNormalizer
        from tokenizers.pre_tokenizers import BertPreTokenizer

        self.vocab_file = os.path.abspath(vocab_file)
        self.lower_case = bool(lower_case)
        try:
            vocab = read_bert_vocab(self.vocab_file)
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"cannot read BERT vocab file {vocab_file!r} (--vocab-file): {exc}") from None
        missing = [t for t in BERT_SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise TokenizerError(
                f"BERT vocab file {vocab_file!r} (--vocab-file) has no {', '.join(missing)}: Megatron-LM's "
                "BERT tokenizer reads [CLS], [SEP], [PAD], [MASK] and [UNK] from it; use a BERT vocab.txt"
            )
        self._vocab = vocab
        self._inv = {i: t for t, i in vocab.items()}
        model = WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100)
        self._tokenizer = RustTokenizer(model)
        self._tokenizer.normalizer = BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=self.lower_case, lowercase=self.lower_case
        )
        self._tokenizer.pre_tokenizer = BertPreTokenizer()

    def tokenize(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids: list[int]) -> str:
        """Tokens joined, ``##`` continuations glued (Megatron-LM's ``convert_tokens_to_string``)."""
        return " ".join(self._inv.get(int(i), "[UNK]") for i in ids).replace(" ##", "").strip()

    @property
    def vocab_size(self) -> int:
        return max(self._vocab.values()) + 1

    @property
    def eod(self) -> int:
        return self._vocab["[EOS]"]

    @property
    def eos(self) -> int:
        return self._vocab["[EOS]"]

    @property
    def bos(self) -> int:
        return self._vocab["[BOS]"]

    @property
    def pad(self) -> int:
        return self._vocab["[PAD]"]

    @property
    def mask(self) -> int:
        return self._vocab["[MASK]"]

    @property
    def cls(self) -> int:
        return self._vocab["[CLS]"]

    @property
    def sep(self) -> int:
        return self._vocab["[SEP]"]

    @property
    def unique_identifiers(self) -> OrderedDict:
        return OrderedDict([("class", f"{type(self).__module__}.{type(self).__qualname__}"),
                            ("vocab_file", self.vocab_file), ("lower_case", self.lower_case)])


class SentencePieceIds:
    """Megatron-LM's ``GPTSentencePieceTokenizer`` (``add_bos=False``) and ``Llama2Tokenizer``
    (``add_bos=True``: the model's BOS before every tokenized text, Megatron-LM's
    ``tokenize(s, bos=True, eos=False)``): the ``sentencepiece`` model's own ids, nothing appended
    to the vocabulary (``vocab_size`` = its pieces), EOD = its eos id (``None`` when the model has
    none), pad/bos = the model's (-1 when it has none, as sentencepiece says)."""

    def __init__(self, model_file: str, add_bos: bool, tokenizer_type: str) -> None:
        import sentencepiece

        self.model_file = os.path.abspath(model_file)
        self.add_bos = bool(add_bos)
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_file=self.model_file)
        except Exception as exc:  # sentencepiece raises OSError/RuntimeError on a bad file
            raise TokenizerError(
                f"cannot load SentencePiece model {model_file!r} (--tokenizer-model): {exc}"
            ) from None
        if self.add_bos and self._sp.bos_id() < 0:
            raise TokenizerError(
                f"{tokenizer_type} prepends the model's BOS to every document, and {model_file!r} has "
                "none (bos_id = -1); use GPTSentencePieceTokenizer, which adds nothing"
            )

    def tokenize(self, text: str) -> list[int]:
        ids = self._sp.encode_as_ids(text)
        return [self._sp.bos_id(), *ids] if self.add_bos else ids

    def detokenize(self, ids: list[int]) -> str:
        return self._sp.decode_ids([int(i) for i in ids])

    @property
    def vocab_size(self) -> int:
        return int(self._sp.get_piece_size())

    @property
    def eod(self) -> int | None:
        eos = self._sp.eos_id()
        return eos if eos >= 0 else None

    @property
    def eos(self) -> int | None:
        return self.eod

    @property
    def bos(self) -> int:
        return self._sp.bos_id()

    @property
    def pad(self) -> int:
        return self._sp.pad_id()

    @property
    def unique_identifiers(self) -> OrderedDict:
        return OrderedDict([("class", f"{type(self).__module__}.{type(self).__qualname__}"),
                            ("tokenizer_model", self.model_file), ("add_bos", self.add_bos)])


#: The image placeholder Megatron-LM's MultimodalTokenizer registers (``--special-tokens``'s
#: default; megatron.core.models.multimodal.llava_model.IMAGE_TOKEN).
IMAGE_TOKEN = "<image>"


class MultimodalTextTokenizer:
    """Megatron-LM's ``MultimodalTokenizer`` for text-only data: a Hugging Face tokenizer
    (``AutoTokenizer.from_pretrained(--tokenizer-model)``) with ``<image>`` added as a special
    token; ``tokenize`` is its ``encode(text)``, so the tokenizer's own BOS/EOS are added as it
    adds them (Llama: BOS; BERT: [CLS] ... [SEP]). ``vocab_size`` is the tokenizer's length before
    ``<image>`` is added, as Megatron-LM counts it; EOD is its eos token. A text holding
    ``<image>`` is refused: images need Megatron's multimodal data pipeline, which dlmspec does not
    run (and the id of ``<image>`` is beyond that ``vocab_size``)."""

    def __init__(self, tokenizer_model: str) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from transformers import AutoTokenizer

        self.tokenizer_model = tokenizer_model
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(tokenizer_model, trust_remote_code=False)
        except Exception as exc:
            if "trust_remote_code" in str(exc):
                raise TokenizerError(remote_code_refusal("MultimodalTokenizer", tokenizer_model)) from None
            raise TokenizerError(
                f"cannot load the Hugging Face tokenizer {tokenizer_model!r} (--tokenizer-model): "
                f"{str(exc) or type(exc).__name__}"
            ) from None
        self._vocab_size = len(self._tokenizer)
        self._tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)

    def tokenize(self, text: str) -> list[int]:
        if IMAGE_TOKEN in text:
            raise TokenizerError(
                f"the text holds {IMAGE_TOKEN}: MultimodalTokenizer is supported for text-only data "
                "(images need Megatron's multimodal data pipeline); remove the image placeholder"
            )
        return list(self._tokenizer.encode(text))

    def detokenize(self, ids: list[int]) -> str:
        return self._tokenizer.decode(list(ids))

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eod(self) -> int | None:
        return self._tokenizer.eos_token_id

    @property
    def eos(self) -> int | None:
        return self._tokenizer.eos_token_id

    @property
    def bos(self) -> int | None:
        return self._tokenizer.bos_token_id

    @property
    def pad(self) -> int | None:
        return self._tokenizer.pad_token_id

    @property
    def unique_identifiers(self) -> OrderedDict:
        return OrderedDict([("class", f"{type(self).__module__}.{type(self).__qualname__}"),
                            ("tokenizer_model", str(self.tokenizer_model))])


def _require_file(path: str | None, what: str, flag: str, tokenizer_type: str) -> str:
    if not path:
        raise TokenizerError(f"{tokenizer_type} needs {flag} (the {what})")
    if not os.path.isfile(path):
        raise TokenizerError(f"{what} not found: {path} (given by {flag})")
    return str(path)


def _optional_file(path: str | None, what: str, flag: str) -> str | None:
    if path and not os.path.isfile(path):
        raise TokenizerError(f"{what} not found: {path} (given by {flag})")
    return str(path) if path else None


def _require_module(module: str, tokenizer_type: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise TokenizerError(
            f"{tokenizer_type} needs the {module!r} package, which is not installed "
            f"(pip install {module})"
        ) from None


def _tokenizer_class(light: bool) -> Any:
    """megatron-core's ``MegatronTokenizer`` and the text tokenizer models its ``from_pretrained``
    imports, with megatron's import-time warnings silenced; ``light`` (under
    :func:`dlmspec.data.megatron_light.without_megatron_core_init`): ``None`` when that import fails."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.tokenizers import MegatronTokenizer
            import megatron.core.tokenizers.text.models  # noqa: F401  (from_pretrained imports it)
    except Exception:
        if light:
            return None
        raise
    return MegatronTokenizer


def _megatron_tokenizer(tokenizer_type: str, library: str, path: str | None, **kwargs: Any) -> Any:
    """``MegatronTokenizer.from_pretrained``, built without megatron-core's ``__init__`` where that
    is not imported yet (:func:`dlmspec.data.megatron_light.without_megatron_core_init`, ~4 s of CPU
    less for ``data prepare``), with megatron's import-time warnings silenced."""
    from dlmspec.data.megatron_light import without_megatron_core_init

    with without_megatron_core_init() as light:
        if light:
            MegatronTokenizer = _tokenizer_class(light=True)
            if MegatronTokenizer is not None:
                return _from_pretrained(MegatronTokenizer, tokenizer_type, library, path, **kwargs)
    return _from_pretrained(_tokenizer_class(light=False), tokenizer_type, library, path, **kwargs)


def _from_pretrained(MegatronTokenizer: Any, tokenizer_type: str, library: str, path: str | None,
                     **kwargs: Any) -> Any:
    try:
        if path is None:
            return MegatronTokenizer.from_pretrained(metadata_path={"library": library}, **kwargs)
        return MegatronTokenizer.from_pretrained(
            tokenizer_path=path, metadata_path={"library": library}, **kwargs
        )
    except TokenizerError:
        raise
    except Exception as exc:
        detail = str(exc) or type(exc).__name__
        if "trust_remote_code" in detail:
            raise TokenizerError(remote_code_refusal(tokenizer_type, path)) from None
        raise TokenizerError(f"cannot build {tokenizer_type} from {path!r}: {detail}") from None


def remote_code_refusal(tokenizer_type: str, path: Any) -> str:
    """The message for a tokenizer folder that names its own Python code (``auto_map`` in its
    ``tokenizer_config.json`` or ``config.json``), which dlmspec never runs
    (``trust_remote_code=False``: transformers neither asks nor runs it)."""
    return (f"--tokenizer-model {path}: the tokenizer folder names its own Python code (auto_map in "
            f"tokenizer_config.json or config.json), which dlmspec never runs, so {tokenizer_type} cannot load "
            "it; use a tokenizer whose class transformers has (e.g. set \"tokenizer_class\" to "
            "\"PreTrainedTokenizerFast\" and remove auto_map, if its tokenizer.json is all it needs)")


def build_tokenizer(
    tokenizer_type: str,
    *,
    tokenizer_model: str | None = None,
    vocab_file: str | None = None,
    merge_file: str | None = None,
    vocab_size: int | None = None,
) -> Tokenizer:
    """Build a tokenizer from Megatron-LM's ``--tokenizer-*`` arguments.

    Args:
        tokenizer_type: a name of :data:`TOKENIZER_TYPES` or an alias of
            :data:`TOKENIZER_ALIASES` (case-insensitive).
        tokenizer_model: ``HuggingFaceTokenizer``, ``MultimodalTokenizer``: a local directory
            (or hub name); ``SentencePieceTokenizer``, ``GPTSentencePieceTokenizer``,
            ``Llama2Tokenizer``: the ``.model`` file; ``TikTokenizer``: the vocab ``.json`` file
            in megatron-core's format.
        vocab_file: ``GPT2BPETokenizer``: ``vocab.json`` (required); ``BertWordPiece*``:
            ``vocab.txt`` (required); ``HuggingFaceTokenizer``: optional override.
        merge_file: ``GPT2BPETokenizer``: ``merges.txt`` (required); ``HuggingFaceTokenizer``:
            optional override.
        vocab_size: ``NullTokenizer``, ``NullMultimodalTokenizer``: number of ids before EOD (required, EOD = vocab_size,
            ``.vocab_size`` = vocab_size + 1); ``TikTokenizer``: total vocabulary size
            including megatron's 1000 special ids (optional, default 131072).

    Returns:
        An object with ``tokenize(text) -> list[int]`` (no BOS/EOS added), ``eod``
        (``int`` or ``None``), ``vocab_size`` (``int``), ``detokenize(ids) -> str`` and
        ``unique_identifiers`` (for megatron-core's dataset configs).

    Raises:
        TokenizerError: unknown type, missing or unreadable files, missing package, a missing
            required argument; the message names the flag to fix.
    """
    kind = canonical_tokenizer_type(tokenizer_type)

    if kind == "GPT2BPETokenizer":
        vocab = _require_file(vocab_file, "vocab file", "--vocab-file", kind)
        merges = _require_file(merge_file, "merge file", "--merge-file", kind)
        return GPT2BPETokenizer(vocab, merges)

    if kind in ("NullTokenizer", "NullMultimodalTokenizer"):  # the same for text
        if vocab_size is None or int(vocab_size) <= 0:
            raise TokenizerError(f"{kind} needs --vocab-size (a positive integer)")
        return _megatron_tokenizer(kind, "null", None, vocab_size=int(vocab_size))

    if kind in ("BertWordPieceLowerCase", "BertWordPieceCase"):
        vocab = _require_file(vocab_file, "BERT vocab file (vocab.txt)", "--vocab-file", kind)
        return BertWordPieceTokenizer(vocab, lower_case=kind == "BertWordPieceLowerCase")

    if kind in ("GPTSentencePieceTokenizer", "Llama2Tokenizer"):
        model = _require_file(tokenizer_model, "SentencePiece model", "--tokenizer-model", kind)
        _require_module("sentencepiece", kind)
        return SentencePieceIds(model, add_bos=kind == "Llama2Tokenizer", tokenizer_type=kind)

    if kind == "MultimodalTokenizer":
        if not tokenizer_model:
            raise TokenizerError(
                "MultimodalTokenizer needs --tokenizer-model (a local Hugging Face tokenizer directory)"
            )
        _require_module("transformers", kind)
        return MultimodalTextTokenizer(os.path.expanduser(str(tokenizer_model)))

    if kind == "HuggingFaceTokenizer":
        if not tokenizer_model:
            raise TokenizerError(
                "HuggingFaceTokenizer needs --tokenizer-model (a local tokenizer directory "
                "or a Hugging Face hub name)"
            )
        model_str = str(tokenizer_model)
        looks_local = os.path.isabs(model_str) or model_str.startswith(("./", "../", "~"))
        if looks_local and not os.path.exists(os.path.expanduser(model_str)):
            raise TokenizerError(
                f"Hugging Face tokenizer directory not found: {model_str} "
                "(given by --tokenizer-model)"
            )
        _require_module("transformers", kind)
        return _megatron_tokenizer(
            kind,
            "huggingface",
            os.path.expanduser(model_str) if looks_local else model_str,
            vocab_file=_optional_file(vocab_file, "vocab file", "--vocab-file"),
            merges_file=_optional_file(merge_file, "merge file", "--merge-file"),
            use_fast=True,
            include_special_tokens=False,
            trust_remote_code=False,  # never run (or ask to run) a tokenizer folder's own code
        )

    if kind == "SentencePieceTokenizer":
        model = _require_file(
            tokenizer_model, "SentencePiece model", "--tokenizer-model", kind
        )
        _require_module("sentencepiece", kind)
        return _megatron_tokenizer(kind, "sentencepiece", model, legacy=False)

    # TikTokenizer
    model = _require_file(tokenizer_model, "tiktoken vocab file", "--tokenizer-model", kind)
    _require_module("tiktoken", kind)
    kwargs: dict[str, Any] = {}
    if vocab_size is not None:
        kwargs["vocab_size"] = int(vocab_size)
    return _megatron_tokenizer(kind, "tiktoken", model, **kwargs)


#: Largest tokenizer file :func:`read_json` reads, bytes (the tokenizer.json of published models
#: is 2-35 MB).
MAX_JSON_BYTES = 256 << 20


#: Parsed tokenizer files of this process, by (path, device, inode, size, mtime): validate's rules
#: ask for the same vocab.json several times (EOD, [MASK] candidates, padding), and a GPT-2
#: vocab.json takes ~50 ms to check and parse. A file that changes on disk is read again.
_JSON_CACHE: dict[tuple[str, int, int, int, int], Any] = {}
_JSON_CACHE_SIZE = 8


def read_json(path: str) -> Any:
    """The JSON in ``path`` (a tokenizer's ``tokenizer.json``, ``tokenizer_config.json``,
    ``vocab.json`` ...), read by :func:`dlmspec.files.read_json` (a regular file of at most
    :data:`MAX_JSON_BYTES`, never a pipe or device); ``None`` when it cannot be read or parsed.
    The same unchanged file is parsed once per process (:data:`_JSON_CACHE`): callers must not
    modify what it returns."""
    import os

    from dlmspec.files import FileRefused, read_json as read_untrusted_json

    try:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except (OSError, ValueError, TypeError):
        key = None
    if key is not None and key in _JSON_CACHE:
        return _JSON_CACHE[key]
    try:
        data = read_untrusted_json(path, limit=MAX_JSON_BYTES, what="tokenizer file")
    except FileRefused:
        data = None
    if key is not None:
        if len(_JSON_CACHE) >= _JSON_CACHE_SIZE:
            _JSON_CACHE.pop(next(iter(_JSON_CACHE)))
        _JSON_CACHE[key] = data
    return data


# ------------------------------------------------------------------------------------------
# What the compiler (validate, compile) reads from a tokenizer's files, without building it.


@dataclass(frozen=True)
class TokenizerFacts:
    """Ids of a tokenizer as its files (or Megatron's fixed layout) say, for the rules and for
    train.py: ``size`` (one more than its largest id), ``eod``, ``pad``, ``mask`` (``None`` where
    the type has none), ``source`` (the file read, or the layout, for messages and comments)."""

    size: int | None
    eod: int | None
    pad: int | None
    mask: int | None
    source: str


#: megatron-core TikTokenizer's default layout: these specials first (``</s>`` is its EOD), then
#: ``<SPECIAL_i>`` fillers up to 1000 ids, then the vocabulary (131072 ids in all).
TIKTOKEN_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
TIKTOKEN_NUM_SPECIAL = 1000
TIKTOKEN_DEFAULT_VOCAB = 131072


def hf_special_token(folder: str, key: str) -> tuple[str, int] | None:
    """``(token, id)`` of a special token of a local Hugging Face tokenizer folder: the token its
    ``tokenizer_config.json`` names under ``key`` (``"eos_token"``, ``"mask_token"``, ...; a string
    or ``{"content": ...}``), its id from ``tokenizer.json`` (``added_tokens``, then
    ``model.vocab``). None when either file is missing or unreadable (:func:`read_json`) or has no
    such entry."""
    config = read_json(os.path.join(folder, "tokenizer_config.json"))
    data = read_json(os.path.join(folder, "tokenizer.json"))
    if not isinstance(config, dict) or not isinstance(data, dict):
        return None
    token = config.get(key)
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str):
        return None
    for entry in data.get("added_tokens") or []:
        if isinstance(entry, dict) and entry.get("content") == token and isinstance(entry.get("id"), int):
            return token, entry["id"]
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and isinstance(vocab.get(token), int):
        return token, vocab[token]
    return None


def _readable(path: str | None) -> bool:
    """``path`` is a regular file of at most :data:`MAX_JSON_BYTES` (validate reads no larger
    tokenizer file, and never a pipe or device)."""
    import stat

    if not path:
        return False
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size <= MAX_JSON_BYTES


def tokenizer_facts(
    tokenizer_type: str, *, tokenizer_model: str | None = None, vocab_file: str | None = None,
    vocab_size: int | None = None,
) -> TokenizerFacts | None:
    """What a spec's tokenizer is, when this machine can tell without building it (no torch or
    megatron): a BERT ``vocab.txt`` (its lines, then ``[BOS]``/``[EOS]`` appended: EOD ``[EOS]``,
    pad ``[PAD]``, mask ``[MASK]``); a SentencePiece ``.model`` (read with ``sentencepiece`` when
    installed: pieces, eos, pad); TikTokenizer's and the Null types' fixed layouts. ``None`` for
    other types, and for files that are missing, unreadable or larger than :data:`MAX_JSON_BYTES`
    (the path rules report the missing ones)."""
    kind = canonical_tokenizer_type(tokenizer_type)
    if kind in ("BertWordPieceLowerCase", "BertWordPieceCase"):
        if not _readable(vocab_file):
            return None
        try:
            vocab = read_bert_vocab(vocab_file)
        except (OSError, UnicodeDecodeError):
            return None
        return TokenizerFacts(max(vocab.values()) + 1, vocab["[EOS]"], vocab.get("[PAD]"), vocab.get("[MASK]"),
                              str(vocab_file))
    if kind in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"):
        if not _readable(tokenizer_model):
            return None
        try:
            import sentencepiece

            sp = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer_model))
        except Exception:  # not installed, or not a model: unknown here
            return None
        eos, pad = sp.eos_id(), sp.pad_id()
        return TokenizerFacts(int(sp.get_piece_size()), eos if eos >= 0 else None, pad if pad >= 0 else None,
                              None, str(tokenizer_model))
    if kind == "TikTokenizer":
        size = int(vocab_size) if vocab_size else TIKTOKEN_DEFAULT_VOCAB
        return TokenizerFacts(size, TIKTOKEN_SPECIAL_TOKENS.index("</s>"), None, None,
                              "megatron-core TikTokenizer's special tokens (</s> = 2)")
    if kind in ("NullTokenizer", "NullMultimodalTokenizer") and vocab_size:
        return TokenizerFacts(int(vocab_size) + 1, int(vocab_size), None, None,
                              f"{kind}: EOD = its vocab_size")
    return None
