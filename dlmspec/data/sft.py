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

The parts: :mod:`dlmspec.data.sft_rows` (a JSON row to chat messages, or why it is bad),
:mod:`dlmspec.data.sft_tokens` (the tokenizer side: special-token ids, tokenizing text as text) and
:mod:`dlmspec.data.sft_summary` (the summary printed after a run); this module holds the options,
the run (:func:`prepare_sft`) and its result.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from rich.console import Console

from dlmspec.credentials import redact_text
from dlmspec.data import chat
from dlmspec.data.errors import DataPrepareError
from dlmspec.data.outputs import (DatasetOutput, check_outputs, commit_datasets, dataset_prefix, discard_partial,
                                  install_termination_handlers, protected_inputs, remove_stale_tmp, restore_handlers,
                                  tmp_tag)
from dlmspec.data.read import CHUNK_BYTES, CHUNK_DOCS, MAX_LINE_BYTES, check_input, read_chunks
from dlmspec.data.record import record_path, tokenizer_section, write_record
from dlmspec.data.sft_rows import BadRow, row_messages
from dlmspec.data.sft_summary import KEEP_LINES, SftResult, _lines_text, _same, _token_text
from dlmspec.data.sft_tokens import _hf_tokenizer, _require_hf, assign_special_ids, text_tokenize
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
                # the chunk's rows, written at once (the bytes of one add_document a row)
                chunk_ids: list[int] = []
                chunk_flags: list[int] = []
                chunk_lengths: list[int] = []
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
                    if min(ids) < 0 or max(ids) > top:
                        raise DataPrepareError(
                            f"{input_name}:{lineno}: {kind} gave token id {max(ids)}, outside "
                            f"[0, {top}]; the tokenizer files disagree with its vocabulary size"
                        )
                    chunk_ids.extend(ids)
                    chunk_flags.extend(flags)
                    chunk_lengths.append(len(ids))
                    for out in outputs.values():
                        out.documents += 1
                        out.sequences += 1
                        out.tokens += len(ids)
                    written += 1
                    tokens += len(ids)
                    response_tokens += sum(flags)
                if chunk_lengths:
                    one_each = [1] * len(chunk_lengths)
                    builders["text"].add_documents(np.asarray(chunk_ids, dtype=np.int64).astype(dtype),
                                                   chunk_lengths, one_each)
                    builders["response"].add_documents(np.asarray(chunk_flags, dtype=np.uint8), chunk_lengths,
                                                       one_each)
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
