"""``dlmspec data prepare --sft``: JSONL conversations to the SFT dataset (tokens, response flags and
the dataset record), the on-disk contract the SFT stage reads.

Input rows (one JSON object a line, blank lines skipped) are either
``{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}`` or
``{"prompt": "...", "response": "..."}`` (a user turn and an assistant turn); ``--messages-key``,
``--prompt-key`` and ``--response-key`` rename the keys, and naming one picks the format (else the
first row that is a JSON object decides it). Each row is rendered with a chat template
(:mod:`dlmspec.data.chat`), tokenized segment by segment, and ends with the tokenizer's EOD.

Outputs, for ``--output-prefix OUT``:

* ``OUT_text_document.{bin,idx}``: megatron-core ``IndexedDataset``, one document (one sequence)
  per conversation, dtype ``DType.optimal_dtype`` of the largest id + 1 (as pre-training prepare
  picks it from the vocabulary size);
* ``OUT_text_document_response.{bin,idx}``: ``uint8``, the same lengths, 1 for a supervised token
  (assistant content, its end-of-turn token, the final EOD), 0 elsewhere;
* ``OUT_text_document.dlmspec.json``: the record (:mod:`dlmspec.data.record`) with its ``"sft"``
  section (template and its SHA-256, special-token ids, counts).

Chat special tokens that the vocabulary lacks (``<|im_start|>`` in GPT-2) get ids from
``--first-new-token-id`` (default ``vocab_size + 1``: ``vocab_size`` stays free for [MASK], the
objective's default mask id) upwards; an id equal to ``--mask-token-id`` or ``--pad-token-id`` is
refused. Bad rows (:data:`BAD_KINDS`) are skipped and counted by kind with their line numbers
(``--on-bad skip``) or stop the run naming the line (``--on-bad fail``). A row longer than
``--seq-length`` tokens (EOD included) is skipped (``--overlong skip``, counted as ``over_long``) or
cut to it (``--overlong truncate``: counted and listed; a cut row has no EOD and its last response
is incomplete; a row whose prompt alone fills the length is skipped as ``over_long``).

The run is one process (rendering is cheap beside tokenizing; the corpus of an SFT set is small);
temporary files, ``--force`` and the never-overwrite-an-input checks are those of
:mod:`dlmspec.data.outputs`. User-input problems raise :class:`~dlmspec.data.errors.DataPrepareError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlmspec.data import chat
from dlmspec.credentials import redact_text
from dlmspec.data.errors import DataPrepareError
from dlmspec.data.outputs import (
    DatasetOutput,
    check_outputs,
    commit_datasets,
    dataset_prefix,
    discard_partial,
    install_termination_handlers,
    protected_inputs,
    remove_stale_tmp,
    restore_handlers,
    tmp_tag,
)
from dlmspec.data.read import CHUNK_BYTES, CHUNK_DOCS, MAX_LINE_BYTES, check_input, read_chunks
from dlmspec.data.record import record_path, tokenizer_section, write_record
from dlmspec.tokenizers import TokenizerArgs, TokenizerError, canonical_tokenizer_type

#: The contract's key: the outputs are ``OUT_text_document`` and ``OUT_text_document_response``.
JSON_KEY = "text"
#: Suffix of the response-flag dataset after the token dataset's prefix.
RESPONSE_SUFFIX = "_response"
#: Kinds of bad rows, in the order the summary lists them.
BAD_KINDS: tuple[str, ...] = (
    "not_json",        # not JSON, or not a JSON object
    "wrong_type",      # messages not a list of objects, a role/content/prompt/response not a string
    "missing_key",     # no messages (or prompt/response) key; a message without content
    "missing_role",    # a message without a role
    "unknown_role",    # a role other than system, user, assistant
    "empty_response",  # an assistant turn (response) that is empty or only whitespace
    "no_response",     # no assistant turn, or turns after the last assistant turn
    "over_long",       # more than --seq-length tokens (--overlong skip), or the prompt alone is
    "template_error",  # the tokenizer's own template refused the conversation (or ran too long)
    "bad_text",        # a string that is not Unicode text (a lone surrogate, "\ud800" in JSON)
    "line_too_long",   # a line longer than --max-line-bytes (measured, never held whole)
)
#: Line numbers kept per kind for the summary and the record.
KEEP_LINES = 20
#: The largest token id megatron-core's indexed datasets store (``DType.optimal_dtype``: int32).
MAX_TOKEN_ID = 2**31 - 1
#: ``--overlong`` and ``--on-bad`` choices.
OVERLONG_CHOICES = ("skip", "truncate")
ON_BAD_CHOICES = ("skip", "fail")


@dataclass(frozen=True)
class SftOptions:
    """The ``--sft`` flags (None: not given)."""

    chat_template: Optional[str] = None
    messages_key: Optional[str] = None
    prompt_key: Optional[str] = None
    response_key: Optional[str] = None
    seq_length: Optional[int] = None
    overlong: Optional[str] = None
    on_bad: Optional[str] = None
    first_new_token_id: Optional[int] = None
    mask_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None

    #: CLI flag of each field, for messages.
    FLAGS = {
        "chat_template": "--chat-template", "messages_key": "--messages-key",
        "prompt_key": "--prompt-key", "response_key": "--response-key",
        "seq_length": "--seq-length", "overlong": "--overlong", "on_bad": "--on-bad",
        "first_new_token_id": "--first-new-token-id", "mask_token_id": "--mask-token-id",
        "pad_token_id": "--pad-token-id",
    }

    def given(self) -> list[str]:
        """The flags given (not None), by their CLI spelling."""
        return [flag for name, flag in self.FLAGS.items() if getattr(self, name) is not None]


@dataclass
class SftResult:
    """What :func:`prepare_sft` wrote; ``to_dict()`` is the ``--json`` summary."""

    input: str
    output_prefix: str
    tokenizer_type: str
    vocab_size: int
    eod: int
    dtype: str
    chat_template: str
    chat_template_sha256: str
    format: str
    documents: int
    tokens: int
    response_tokens: int
    prompt_tokens: int
    rows: dict[str, int]
    bad_rows: dict[str, int]
    bad_row_lines: dict[str, list[int]]
    truncated_lines: list[int]
    special_tokens: dict[str, int]
    special_tokens_in_vocab: dict[str, int]
    max_length: Optional[int]
    overlong: str
    on_bad: str
    datasets: list[DatasetOutput]
    record: str
    elapsed_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tokens_per_s"] = round(self.tokens_per_s, 1)
        data["elapsed_s"] = round(self.elapsed_s, 3)
        return data


class BadRow(Exception):
    """A row that cannot be used: ``kind`` (one of :data:`BAD_KINDS`) and why, in words."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why


# --------------------------------------------------------------------------- rows


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


#: A UTF-16 surrogate code point: JSON's ``"\ud800"`` escapes parse to one, and no UTF-8 text holds it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _check_text(value: str, where: str) -> None:
    """Raise :class:`BadRow` (``bad_text``) when ``value`` holds a lone surrogate (not Unicode
    text: no tokenizer can encode it)."""
    found = _SURROGATE.search(value)
    if found is not None:
        raise BadRow("bad_text", f"{where} holds the lone surrogate \\u{ord(found.group()):04x} at character "
                     f"{found.start()} (not Unicode text; write the character itself, or a pair of surrogates)")


def row_messages(record: Any, fmt: str, keys: dict[str, str]) -> list[dict[str, str]]:
    """The conversation of one parsed row, as ``[{"role", "content"}, ...]``.

    Args:
        record: the parsed JSON line.
        fmt: ``"messages"`` or ``"prompt_response"``.
        keys: ``{"messages": ..., "prompt": ..., "response": ...}``, the row's key names.

    Raises:
        BadRow: the row is not a usable conversation (kind and why).
    """
    if not isinstance(record, dict):
        raise BadRow("not_json", f"expected a JSON object, got a JSON {_json_type(record)}")
    present = ", ".join(repr(k) for k in list(record)[:8]) or "none"
    if fmt == "prompt_response":
        prompt_key, response_key = keys["prompt"], keys["response"]
        for key in (prompt_key, response_key):
            if key not in record:
                raise BadRow("missing_key", f"no key {key!r} (the row has keys: {present})")
            if not isinstance(record[key], str):
                raise BadRow("wrong_type", f"key {key!r} must be a string, got a JSON {_json_type(record[key])}")
        for key in (prompt_key, response_key):
            _check_text(record[key], repr(key))
        if not record[response_key].strip():
            raise BadRow("empty_response", f"key {response_key!r} is empty")
        return [{"role": "user", "content": record[prompt_key]},
                {"role": "assistant", "content": record[response_key]}]
    key = keys["messages"]
    if key not in record:
        other = " (a file has one format: the first row's)" if keys["prompt"] in record else ""
        raise BadRow("missing_key", f"no key {key!r} (the row has keys: {present}){other}")
    messages = record[key]
    if not isinstance(messages, list):
        raise BadRow("wrong_type", f"key {key!r} must be a list of messages, got a JSON {_json_type(messages)}")
    out: list[dict[str, str]] = []
    for index, message in enumerate(messages):
        where = f"{key}[{index}]"
        if not isinstance(message, dict):
            raise BadRow("wrong_type", f"{where} must be an object with role and content, got a JSON {_json_type(message)}")
        role = message.get("role")
        if role is None or role == "":
            raise BadRow("missing_role", f"{where} has no 'role' (one of {', '.join(chat.ROLES)})")
        if not isinstance(role, str):
            raise BadRow("wrong_type", f"{where}.role must be a string, got a JSON {_json_type(role)}")
        if role not in chat.ROLES:
            raise BadRow("unknown_role", f"{where}.role {role!r} is not one of {', '.join(chat.ROLES)}")
        if "content" not in message:
            raise BadRow("missing_key", f"{where} has no 'content'")
        content = message["content"]
        if not isinstance(content, str):
            raise BadRow("wrong_type", f"{where}.content must be a string, got a JSON {_json_type(content)}")
        _check_text(content, f"{where}.content")
        if role == chat.RESPONSE_ROLE and not content.strip():
            raise BadRow("empty_response", f"{where} is an assistant turn with empty content")
        out.append({"role": role, "content": content})
    replies = [i for i, m in enumerate(out) if m["role"] == chat.RESPONSE_ROLE]
    if not replies:
        raise BadRow("no_response", "the conversation has no assistant turn (nothing to learn)")
    if replies[-1] != len(out) - 1:
        raise BadRow("no_response", f"{key}[{len(out) - 1}] ({out[-1]['role']}) comes after the last "
                     "assistant turn (it would be trained on nothing)")
    return out


# --------------------------------------------------------------------------- tokenizer side


def vocab_token_id(tokenizer: Any, token: str) -> Optional[int]:
    """The id of ``token`` as one entry of ``tokenizer``'s vocabulary, or None when it has none.

    Works for dlmspec's GPT-2 BPE (the ``tokenizers`` object under it) and megatron-core's
    Hugging Face tokenizer (the ``transformers`` tokenizer under it); other types answer None (a
    template token then gets a new id).
    """
    inner = getattr(tokenizer, "_tokenizer", None)
    hf = getattr(inner, "tokenizer", None)
    if hf is not None and hasattr(hf, "get_vocab"):
        found = hf.get_vocab().get(token)
        return None if found is None else int(found)
    if inner is not None and hasattr(inner, "token_to_id"):
        found = inner.token_to_id(token)
        return None if found is None else int(found)
    return None


def text_tokenize(tokenizer: Any) -> Any:
    """``tokenize(text) -> ids`` for the text of a conversation, special-token strings inside it
    tokenized as text: megatron-core's Hugging Face tokenizer maps ``<|endoftext|>`` in a text to
    its id, so the ``transformers`` tokenizer under it is called with ``split_special_tokens=True``
    (a user's ``<|im_end|>`` cannot end a turn); other types already tokenize text as text."""
    hf = getattr(getattr(tokenizer, "_tokenizer", None), "tokenizer", None)
    if hf is not None and hasattr(hf, "encode"):
        return lambda text: hf.encode(text, add_special_tokens=False, split_special_tokens=True)
    return tokenizer.tokenize


def _require_hf(tokenizer_type: str, tokenizer_model: Optional[str]) -> None:
    """Refuse ``--chat-template tokenizer`` for a tokenizer type without a ``chat_template``."""
    if tokenizer_type != "HuggingFaceTokenizer" or not tokenizer_model:
        raise DataPrepareError(
            f"--chat-template tokenizer: uses the Hugging Face tokenizer's own chat_template, and "
            f"--tokenizer-type {tokenizer_type} has none; pass --tokenizer-type HuggingFaceTokenizer "
            "--tokenizer-model DIR (a tokenizer with a chat_template), or a built-in template: "
            "--chat-template chatml"
        )


def _hf_tokenizer(tokenizer_type: str, tokenizer_model: Optional[str]) -> Any:
    """The ``transformers`` tokenizer for ``--chat-template tokenizer`` (its ``chat_template``)."""
    _require_hf(tokenizer_type, tokenizer_model)
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.path.expanduser(tokenizer_model), trust_remote_code=False)
    except ImportError:
        raise DataPrepareError(
            "--chat-template tokenizer needs the transformers package (pip install transformers)"
        ) from None
    except Exception as exc:  # noqa: BLE001  (transformers raises many kinds on a bad folder)
        if "trust_remote_code" in str(exc):
            from dlmspec.tokenizers import remote_code_refusal

            raise DataPrepareError(remote_code_refusal(tokenizer_type, tokenizer_model)) from None
        raise DataPrepareError(
            f"--tokenizer-model {tokenizer_model}: cannot load it with transformers' AutoTokenizer "
            f"({str(exc)[:300]}); pass a local tokenizer folder"
        ) from None


def assign_special_ids(
    specials: tuple[str, ...],
    tokenizer: Any,
    vocab_size: int,
    first_new: Optional[int],
    mask_id: Optional[int],
    pad_id: Optional[int],
    eod_id: int,
) -> tuple[dict[str, int], dict[str, int]]:
    """Ids of a template's special tokens: ``(new, in_vocab)``.

    A token the vocabulary has keeps its id (``in_vocab``); the others get ids from ``first_new``
    (default ``vocab_size + 1``) upwards, in the template's order (``new``).

    Raises:
        DataPrepareError: ``first_new`` below ``vocab_size`` (it would reuse a token's id); a new
            id, or a template token's id, equal to ``--mask-token-id`` or ``--pad-token-id``
            (pad may equal EOD, which pads SFT samples by design).
    """
    in_vocab: dict[str, int] = {}
    missing: list[str] = []
    for token in specials:
        found = vocab_token_id(tokenizer, token)
        if found is None:
            missing.append(token)
        else:
            in_vocab[token] = found
    start = vocab_size + 1 if first_new is None else int(first_new)
    if missing and start < vocab_size:
        raise DataPrepareError(
            f"--first-new-token-id {start}: below the vocabulary size {vocab_size}, so the new chat "
            f"tokens ({', '.join(missing)}) would take ids of existing tokens; pass "
            f"--first-new-token-id {vocab_size + 1} (the default: {vocab_size} stays free for [MASK])"
        )
    new = {token: start + i for i, token in enumerate(missing)}
    end = start + len(missing)  # the first id after the new ones
    if end > MAX_TOKEN_ID + 1:
        raise DataPrepareError(
            f"--first-new-token-id {start}: the new chat tokens' ids would pass {MAX_TOKEN_ID:,}, the largest "
            f"id an indexed dataset holds (int32); pass --first-new-token-id {vocab_size + 1} (the default)"
        )
    for flag, value in (("--mask-token-id", mask_id), ("--pad-token-id", pad_id)):
        if value is None:
            continue
        hit = next((t for t, i in new.items() if i == value), None)
        if hit is not None:
            raise DataPrepareError(
                f"{flag} {value}: the chat token {hit} would get id {value} too (new chat tokens "
                f"take ids {start}..{end - 1} from --first-new-token-id); pass --first-new-token-id "
                f"{max(value + 1, vocab_size)} to put them after it, or another {flag}"
            )
        hit = next((t for t, i in in_vocab.items() if i == value), None)
        if hit is not None and not (flag == "--pad-token-id" and value == eod_id):
            raise DataPrepareError(
                f"{flag} {value}: is the id of the template's token {hit} in the vocabulary; the "
                f"model could not tell them apart; pass another {flag}, e.g. {flag} {end}"
            )
        if flag == "--mask-token-id" and value == eod_id:
            raise DataPrepareError(
                f"--mask-token-id {value}: is the EOD id, which ends every SFT sample and is "
                f"supervised; pass another, e.g. --mask-token-id {vocab_size if start > vocab_size else end}"
            )
    return new, in_vocab


# --------------------------------------------------------------------------- prepare


def _check_options(options: SftOptions) -> tuple[str, str, str, dict[str, str], Optional[str]]:
    """Checked ``(template, overlong, on_bad, keys, format)``; raises DataPrepareError."""
    template = options.chat_template or "chatml"
    if template not in chat.TEMPLATES:
        raise DataPrepareError(
            f"--chat-template {template}: not a template; pick one of {', '.join(chat.TEMPLATES)} "
            "(e.g. --chat-template chatml)"
        )
    overlong = options.overlong or "skip"
    if overlong not in OVERLONG_CHOICES:
        raise DataPrepareError(f"--overlong {overlong}: pick skip or truncate (e.g. --overlong skip)")
    on_bad = options.on_bad or "skip"
    if on_bad not in ON_BAD_CHOICES:
        raise DataPrepareError(f"--on-bad {on_bad}: pick skip or fail (e.g. --on-bad skip)")
    if options.seq_length is not None and options.seq_length < 2:
        raise DataPrepareError(
            f"--seq-length {options.seq_length}: a sample needs at least 2 tokens (a response and "
            "EOD); pass the training seq_length, e.g. --seq-length 512"
        )
    if options.overlong is not None and options.seq_length is None:
        raise DataPrepareError(
            f"--overlong {overlong}: applies to rows longer than --seq-length, which is not given; "
            "pass --seq-length N (the training seq_length, e.g. --seq-length 512)"
        )
    for flag, value in (("--first-new-token-id", options.first_new_token_id),
                        ("--mask-token-id", options.mask_token_id), ("--pad-token-id", options.pad_token_id)):
        if value is not None and value < 0:
            raise DataPrepareError(f"{flag} {value}: token ids are 0 or more")
    keys = {"messages": options.messages_key or "messages", "prompt": options.prompt_key or "prompt",
            "response": options.response_key or "response"}
    for flag, value in (("--messages-key", options.messages_key), ("--prompt-key", options.prompt_key),
                        ("--response-key", options.response_key)):
        if value is not None and not value.strip():
            raise DataPrepareError(f"{flag}: empty; name the row's key, e.g. {flag} {flag[2:-4]}")
    pair = options.prompt_key is not None or options.response_key is not None
    if options.messages_key is not None and pair:
        raise DataPrepareError(
            f"--messages-key {options.messages_key} and --prompt-key/--response-key: each picks a row "
            "format; pass the one your rows have"
        )
    fmt = "messages" if options.messages_key is not None else "prompt_response" if pair else None
    return template, overlong, on_bad, keys, fmt


def prepare_sft(
    input_path: str | os.PathLike,
    output_prefix: str | os.PathLike,
    *,
    tokenizer_type: str,
    tokenizer_model: str | None = None,
    vocab_file: str | None = None,
    merge_file: str | None = None,
    vocab_size: int | None = None,
    options: SftOptions = SftOptions(),
    force: bool = False,
    max_line_bytes: int = MAX_LINE_BYTES,
    show_progress: bool = False,
    console: Console | None = None,
) -> SftResult:
    """Tokenize a JSONL file of conversations into the SFT dataset (module docstring).

    Args:
        input_path: JSONL file, one conversation a line.
        output_prefix: the outputs are ``{output_prefix}_text_document{,_response}.{bin,idx}`` and
            ``{output_prefix}_text_document.dlmspec.json``.
        tokenizer_type, tokenizer_model, vocab_file, merge_file, vocab_size: as for
            :func:`dlmspec.data.prepare.prepare`.
        options: the ``--sft`` flags (:class:`SftOptions`).
        force: replace the files at the output names (never an input file).
        max_line_bytes: longest line read; a longer one is a bad row (``line_too_long``: skipped and
            counted with ``--on-bad skip``, the default; stops the run naming it with ``--on-bad fail``).
        show_progress: a progress bar on ``console`` (default stderr).

    Returns:
        An :class:`SftResult`.

    Raises:
        DataPrepareError: a bad flag value, input file, tokenizer or template; an id collision;
            an output that exists (without ``force``) or is an input; a bad row with
            ``--on-bad fail``; no row written; a write error. Temporary files are removed.
        PrepareInterrupted: SIGTERM or SIGHUP during the run.
    """
    from dlmspec.data.prepare import _note, _progress, load_runtime

    input_name = os.fspath(input_path)
    output_prefix = os.fspath(output_prefix)
    console = console or Console(stderr=True)
    notes: list[str] = []
    try:
        kind = canonical_tokenizer_type(tokenizer_type)
    except TokenizerError as exc:
        raise DataPrepareError(str(exc)) from None
    template, overlong, on_bad, keys, fmt = _check_options(options)
    if template == "tokenizer":
        _require_hf(kind, tokenizer_model)  # before the runtime's imports
    check_input(input_name)
    prefix = dataset_prefix(output_prefix, JSON_KEY)
    outputs = {
        name: DatasetOutput(json_key=name, prefix=p, bin_path=p + ".bin", idx_path=p + ".idx")
        for name, p in (("text", prefix), ("response", prefix + RESPONSE_SUFFIX))
    }
    files = {"tokenizer_model": tokenizer_model, "vocab_file": vocab_file, "merge_file": merge_file}
    protected = protected_inputs(input_name, *(None if files[k] is None else os.fspath(files[k]) for k in files))
    check_outputs(outputs, output_prefix, protected, bool(force))
    record_file = record_path(prefix)
    if any(_same(record_file, path) for _, path in protected):
        raise DataPrepareError(
            f"--output-prefix {output_prefix}: {record_file}, the dataset record, is an input file, and "
            "data prepare never writes over its input; pick another --output-prefix"
        )
    if os.path.lexists(record_file) and not force:
        raise DataPrepareError(
            f"--output-prefix {output_prefix}: {record_file} already exists (the record of an earlier "
            "dataset), and data prepare would replace it. Pass --force, or pick another --output-prefix"
        )
    try:
        spec = TokenizerArgs(
            tokenizer_type=kind,
            tokenizer_model=None if tokenizer_model is None else os.fspath(tokenizer_model),
            vocab_file=None if vocab_file is None else os.fspath(vocab_file),
            merge_file=None if merge_file is None else os.fspath(merge_file),
            vocab_size=vocab_size,
        )
    except TokenizerError as exc:
        raise DataPrepareError(str(exc)) from None
    if template == "tokenizer":
        try:
            renderer: Any = chat.TokenizerTemplate(_hf_tokenizer(kind, spec.tokenizer_model), str(tokenizer_model))
        except chat.ChatTemplateError as exc:
            raise DataPrepareError(str(exc)) from None
        jinja, specials = renderer.jinja, renderer.special_tokens
        render = renderer.render
    else:
        jinja, specials = chat.JINJA[template], chat.SPECIAL_TOKENS[template]
        render = lambda messages: chat.render(template, messages)  # noqa: E731
    np, DType, IndexedDatasetBuilder = load_runtime()
    try:
        tokenizer = spec.build()
    except TokenizerError as exc:
        raise DataPrepareError(str(exc)) from None
    eod = tokenizer.eod
    if eod is None:
        raise DataPrepareError(
            f"--tokenizer-type {kind}: has no end-of-document token, which ends every SFT sample "
            "(and teaches the model to stop); use a tokenizer with one (GPT2BPETokenizer, "
            "HuggingFaceTokenizer with an eos token)"
        )
    eod = int(eod)
    vocab = int(tokenizer.vocab_size)

    new_ids, in_vocab = assign_special_ids(
        specials, tokenizer, vocab, options.first_new_token_id, options.mask_token_id,
        options.pad_token_id, eod,
    )
    special_ids = {**in_vocab, **new_ids}
    top = max([vocab - 1, eod, *special_ids.values()])
    dtype = np.dtype(DType.optimal_dtype(top + 1))
    eod_text = _token_text(tokenizer, eod)
    tokenize = text_tokenize(tokenizer)

    out_dir = os.path.dirname(prefix)
    if out_dir:
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as exc:
            raise DataPrepareError(f"cannot create output directory {out_dir}: {exc.strerror}") from None
    for text in remove_stale_tmp(output_prefix, protected):
        _note(console, notes, text)

    counts = {k: 0 for k in BAD_KINDS}
    lines: dict[str, list[int]] = {k: [] for k in BAD_KINDS}
    truncated: list[int] = []
    n_truncated = 0
    read = written = tokens = response_tokens = 0
    used_specials: set[str] = set()
    tag = tmp_tag()
    tmp = {name: f"{out.prefix}.{tag}" for name, out in outputs.items()}
    builders: dict[str, Any] = {}
    renamed: set[str] = set()
    handlers: dict[int, Any] = {}
    start_time = time.perf_counter()  # after the imports and the tokenizer, as prepare measures

    def bad(lineno: int, kind_: str, why: str) -> None:
        if on_bad == "fail":
            raise DataPrepareError(
                f"{input_name}:{lineno}: bad row ({kind_}): {why}. Fix the row, or pass --on-bad skip "
                "to skip bad rows (they are counted by kind and listed)"
            )
        counts[kind_] += 1
        if len(lines[kind_]) < KEEP_LINES:
            lines[kind_].append(lineno)

    try:
        handlers.update(install_termination_handlers())
        for name in outputs:
            try:
                builders[name] = IndexedDatasetBuilder(
                    tmp[name] + ".bin", dtype=dtype.type if name == "text" else np.uint8
                )
            except OSError as exc:
                raise DataPrepareError(f"cannot write {tmp[name]}.bin: {exc.strerror}") from None
        progress = _progress(console) if show_progress else contextlib.nullcontext()
        with progress:
            task = None
            if show_progress:
                task = progress.add_task("tokenizing", total=os.path.getsize(input_name), documents=0, tokens=0)
            for chunk in read_chunks(input_name, CHUNK_DOCS, CHUNK_BYTES, int(max_line_bytes),
                                     skip_too_long=on_bad == "skip"):
                if chunk.too_long is not None:
                    lineno, length = chunk.too_long
                    read += 1
                    if on_bad == "skip":
                        bad(lineno, "line_too_long", f"{length:,} bytes, more than --max-line-bytes "
                            f"{int(max_line_bytes):,}")
                        continue
                    raise DataPrepareError(
                        f"{input_name}:{lineno}: the line has {length:,} bytes, more than "
                        f"--max-line-bytes {int(max_line_bytes):,}; drop the line or raise the limit: "
                        f"--max-line-bytes {length}"
                    )
                for lineno, raw in chunk.lines:
                    read += 1
                    try:
                        record = json.loads(raw)
                    except (ValueError, RecursionError) as exc:
                        bad(lineno, "not_json", f"invalid JSON ({getattr(exc, 'msg', exc)})")
                        continue
                    if fmt is None and isinstance(record, dict):
                        fmt = "messages" if keys["messages"] in record else "prompt_response"
                    try:
                        messages = row_messages(record, fmt or "messages", keys)
                        try:
                            segments = render(messages)
                        except chat.ChatTemplateError:
                            raise
                        except Exception as exc:  # noqa: BLE001  (jinja's raise_exception and others)
                            raise BadRow("template_error", f"the tokenizer's chat_template refused it: {str(exc)[:200]}") from None
                    except BadRow as exc:
                        bad(lineno, exc.kind, exc.why)
                        continue
                    except chat.ChatTemplateError as exc:
                        raise DataPrepareError(f"{input_name}:{lineno}: {exc}") from None
                    try:
                        ids, flags = chat.tokenize_segments(segments, tokenize, special_ids)
                    except MemoryError:
                        raise DataPrepareError(f"{input_name}:{lineno}: out of memory tokenizing the row") from None
                    except Exception as exc:  # noqa: BLE001  (tokenizer libraries raise anything)
                        raise DataPrepareError(
                            f"{input_name}:{lineno}: {kind} cannot tokenize the rendered conversation: "
                            f"{str(exc)[:300]}; use a text tokenizer (GPT2BPETokenizer, HuggingFaceTokenizer, ...)"
                        ) from None
                    used_specials.update(t for t in special_ids if any(t in s.text for s in segments if s.template))
                    ids.append(eod)
                    flags.append(1)
                    if options.seq_length is not None and len(ids) > options.seq_length:
                        limit = options.seq_length
                        if overlong == "skip":
                            bad(lineno, "over_long", f"{len(ids):,} tokens, more than --seq-length {limit:,} "
                                "(pass --overlong truncate to cut it, or a larger --seq-length)")
                            continue
                        if not any(flags[:limit]):
                            bad(lineno, "over_long", f"its prompt alone has more than --seq-length {limit:,} "
                                "tokens, so nothing of the response would be left")
                            continue
                        ids, flags = ids[:limit], flags[:limit]
                        n_truncated += 1
                        if len(truncated) < KEEP_LINES:
                            truncated.append(lineno)
                    array = np.asarray(ids, dtype=np.int64)
                    if int(array.min()) < 0 or int(array.max()) > top:
                        raise DataPrepareError(
                            f"{input_name}:{lineno}: {kind} gave token id {int(array.max())}, outside "
                            f"[0, {top}]; the tokenizer files disagree with its vocabulary size"
                        )
                    builders["text"].add_document(array.astype(dtype), [len(ids)])
                    builders["response"].add_document(np.asarray(flags, dtype=np.uint8), [len(ids)])
                    for out in outputs.values():
                        out.documents += 1
                        out.sequences += 1
                        out.tokens += len(ids)
                    written += 1
                    tokens += len(ids)
                    response_tokens += sum(flags)
                if task is not None:
                    progress.update(task, advance=chunk.nbytes, documents=written, tokens=tokens)
        skipped = sum(counts.values())
        if written == 0:
            found = ", ".join(f"{k} {v} (lines {_lines_text(lines[k], v)})" for k, v in counts.items() if v)
            raise DataPrepareError(
                f"--input {input_name}: no conversation was written"
                + (f"; every row is bad: {found}" if found else " (only blank lines)")
                + ". Rows look like {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, "
                "{\"role\": \"assistant\", \"content\": \"...\"}]} or {\"prompt\": \"...\", \"response\": \"...\"}"
            )
        for name in outputs:
            builders[name].finalize(tmp[name] + ".idx")
        commit_datasets(outputs, tmp, renamed)
        sft = {
            "format": fmt or "messages",
            "chat_template": template,
            "chat_template_sha256": chat.template_sha256(jinja),
            "chat_template_jinja": jinja,
            "response_prefix": prefix + RESPONSE_SUFFIX,
            "special_tokens": new_ids,
            "special_tokens_in_vocab": {
                **{t: i for t, i in in_vocab.items() if t in used_specials or template != "tokenizer"},
                **({eod_text: eod} if eod_text else {}),
            },
            "eod_id": eod,
            "max_length": options.seq_length,
            "overlong": overlong,
            "rows": {"read": read, "written": written, "skipped": skipped, "truncated": n_truncated},
            "bad_rows": {k: v for k, v in counts.items() if v},
            "bad_row_lines": {k: v for k, v in lines.items() if v},
            "truncated_lines": truncated,
            "response_tokens": response_tokens,
            "prompt_tokens": tokens - response_tokens,
        }
        write_record(
            prefix,
            tokenizer=tokenizer_section(kind, vocab_size=vocab, eod_id=eod, files=files),
            documents=written,
            tokens=tokens,
            sft=sft,
        )
    except BaseException as exc:
        discard_partial(outputs, tmp, builders, renamed)
        if isinstance(exc, OSError):
            raise DataPrepareError(
                f"--output-prefix {output_prefix}: cannot write the dataset in {out_dir or os.curdir}: "
                f"{exc.strerror or exc}; temporary files removed"
            ) from None
        raise
    finally:
        restore_handlers(handlers)
    if n_truncated:
        _note(console, notes, f"{n_truncated:,} rows cut to --seq-length {options.seq_length:,} (their last "
              f"response is incomplete and has no EOD): lines {_lines_text(truncated, n_truncated)}")
    return SftResult(
        input=redact_text(input_name), output_prefix=output_prefix, tokenizer_type=kind, vocab_size=vocab, eod=eod,
        dtype=dtype.name, chat_template=template, chat_template_sha256=sft["chat_template_sha256"],
        format=sft["format"], documents=written, tokens=tokens, response_tokens=response_tokens,
        prompt_tokens=tokens - response_tokens, rows=sft["rows"], bad_rows=sft["bad_rows"],
        bad_row_lines=sft["bad_row_lines"], truncated_lines=truncated, special_tokens=new_ids,
        special_tokens_in_vocab=sft["special_tokens_in_vocab"], max_length=options.seq_length,
        overlong=overlong, on_bad=on_bad, datasets=list(outputs.values()), record=record_file,
        elapsed_s=time.perf_counter() - start_time, notes=notes,
    )


def _same(a: str, b: str) -> bool:
    """Whether two paths name one file (links followed); False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _token_text(tokenizer: Any, token_id: int) -> str:
    """The string of one id (``<|endoftext|>``), or "" when the tokenizer cannot say."""
    hf = getattr(getattr(tokenizer, "_tokenizer", None), "tokenizer", None)
    if hf is not None and hasattr(hf, "convert_ids_to_tokens"):  # its detokenize drops special tokens
        with contextlib.suppress(Exception):
            return str(hf.convert_ids_to_tokens(token_id) or "")
    try:
        return str(tokenizer.detokenize([token_id]))
    except Exception:  # noqa: BLE001
        return ""


def _lines_text(kept: list[int], total: int) -> str:
    text = ", ".join(str(n) for n in kept)
    return text + (f" and {total - len(kept):,} more" if total > len(kept) else "")


def print_sft_summary(console: Console, result: SftResult) -> None:
    """The summary table of ``data prepare --sft`` (as the pre-training prepare prints it)."""
    table = Table(title="dlmspec data prepare --sft", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = result.rows
    specials = ", ".join(f"{t} {i}" for t, i in result.special_tokens.items()) or "none"
    rows_out = [
        ("input", f"{result.input} ({result.format})"),
        ("tokenizer", f"{result.tokenizer_type} (vocab {result.vocab_size:,}, eod {result.eod}, {result.dtype})"),
        ("chat template", f"{result.chat_template} (sha256 {result.chat_template_sha256[:12]})"),
        ("new token ids", specials),
        ("rows", f"{rows['read']:,} read, {rows['written']:,} written, {rows['skipped']:,} skipped, "
                 f"{rows['truncated']:,} truncated"),
    ]
    for kind_, count in result.bad_rows.items():
        rows_out.append((f"bad: {kind_}", f"{count:,} (lines {_lines_text(result.bad_row_lines[kind_], count)})"))
    if rows["truncated"]:
        rows_out.append(("truncated", f"{rows['truncated']:,} to --seq-length {result.max_length:,} "
                         f"(lines {_lines_text(result.truncated_lines, rows['truncated'])})"))
    rows_out += [
        ("tokens", f"{result.tokens:,} ({result.response_tokens:,} response, {result.prompt_tokens:,} prompt)"),
        ("elapsed", f"{result.elapsed_s:.2f} s"),
        ("tokens/s", f"{result.tokens_per_s:,.0f}"),
        ("dataset", f"{result.datasets[0].prefix}.{{bin,idx}}"),
        ("response flags", f"{result.datasets[1].prefix}.{{bin,idx}}"),
        ("record", result.record),
    ]
    for name, value in rows_out:
        table.add_row(Text(name), Text(value))
    console.print(table)


def prepare_sft_command(
    input_path: Optional[str],
    output_prefix: str,
    *,
    json_keys: Any,
    workers: int,
    append_eod: bool,
    hub: Any,
    options: SftOptions,
    **kwargs: Any,
) -> SftResult:
    """``dlmspec data prepare --sft``: :func:`prepare_sft` called with the command's arguments,
    refusing the pre-training flags it does not take (``--hf-dataset``, ``--json-keys``;
    ``--append-eod`` is what SFT does anyway; ``--workers`` above 1 is noted and ignored).

    Raises:
        DataPrepareError: as :func:`prepare_sft`, and for those flags.
    """
    if hub is not None:
        raise DataPrepareError(
            f"--sft: reads --input FILE.jsonl only, not {hub.describe()}; export the split to JSONL "
            "(datasets' Dataset.to_json) and pass --input"
        )
    if input_path is None:
        raise DataPrepareError("--sft: pass --input FILE.jsonl (one conversation a line)")
    keys = [json_keys] if isinstance(json_keys, str) else list(json_keys)
    if keys != [JSON_KEY]:
        raise DataPrepareError(
            f"--json-keys {','.join(keys)}: not used with --sft; name the rows' keys with --messages-key "
            "or --prompt-key/--response-key"
        )
    result = prepare_sft(input_path, output_prefix, options=options, **kwargs)
    if int(workers) > 1:
        from dlmspec.data.prepare import _note

        _note(kwargs.get("console") or Console(stderr=True), result.notes,
              f"--workers {workers}: --sft runs in one process (rendering and tokenizing a conversation set is quick)")
    return result
