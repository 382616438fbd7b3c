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

Nothing here imports torch or megatron at module import time.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

#: Megatron-LM ``--tokenizer-type`` names this factory builds.
TOKENIZER_TYPES: tuple[str, ...] = (
    "GPT2BPETokenizer",
    "HuggingFaceTokenizer",
    "SentencePieceTokenizer",
    "TikTokenizer",
    "NullTokenizer",
)

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


def _megatron_tokenizer(tokenizer_type: str, library: str, path: str | None, **kwargs: Any) -> Any:
    """``MegatronTokenizer.from_pretrained`` with megatron's import-time warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.tokenizers import MegatronTokenizer

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
        raise TokenizerError(f"cannot build {tokenizer_type} from {path!r}: {detail}") from None


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
        tokenizer_model: ``HuggingFaceTokenizer``: a local directory (or hub name);
            ``SentencePieceTokenizer``: the ``.model`` file; ``TikTokenizer``: the vocab
            ``.json`` file in megatron-core's format.
        vocab_file: ``GPT2BPETokenizer``: ``vocab.json`` (required); ``HuggingFaceTokenizer``:
            optional override.
        merge_file: ``GPT2BPETokenizer``: ``merges.txt`` (required); ``HuggingFaceTokenizer``:
            optional override.
        vocab_size: ``NullTokenizer``: number of ids before EOD (required, EOD = vocab_size,
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

    if kind == "NullTokenizer":
        if vocab_size is None or int(vocab_size) <= 0:
            raise TokenizerError("NullTokenizer needs --vocab-size (a positive integer)")
        return _megatron_tokenizer(kind, "null", None, vocab_size=int(vocab_size))

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


def read_json(path: str) -> Any:
    """The JSON in ``path`` (a tokenizer's ``tokenizer.json``, ``tokenizer_config.json``,
    ``vocab.json`` ...); ``None`` when it cannot be read or parsed, is not a regular file (a
    pipe or device is never opened: checked with ``os.stat`` first) or is larger than
    :data:`MAX_JSON_BYTES`."""
    import json
    import stat

    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_JSON_BYTES:
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            data = handle.read(MAX_JSON_BYTES + 1)
        if len(data) > MAX_JSON_BYTES:
            return None
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
