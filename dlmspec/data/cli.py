"""The ``dlmspec data`` command group (a typer app, loaded when the command runs): ``dlmspec data
prepare`` with Megatron-LM's ``preprocess_data.py`` flag names, and ``dlmspec data inspect``
(:mod:`dlmspec.data.inspect`). The work is
:func:`dlmspec.data.prepare.prepare`; here are the flags, the summary table and the exit codes
(2 for bad input, ``128 + signum`` when interrupted)."""

from __future__ import annotations

import os
import signal
from functools import partial
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlmspec.cli.help import MARKUP_MODE, Command, Group
from dlmspec.cli.output import print_envelope, shown, use_json
from dlmspec.data.errors import DataPrepareError, PrepareInterrupted
from dlmspec.data.hub import source_from_flags
from dlmspec.data.inspect import SAMPLE_TOKENS, Inspection, inspect_dataset
from dlmspec.data.prepare import PrepareResult, prepare
from dlmspec.data.read import MAX_LINE_BYTES
from dlmspec.data.sft import SftOptions, prepare_sft_command
from dlmspec.data.sft_summary import print_sft_summary
from dlmspec.errors import EXIT_USAGE, SpecIssue
from dlmspec.tokenizers import valid_tokenizer_types


app = typer.Typer(
    cls=Group,
    help="Prepare training data for megatron-core, and inspect it.",
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=MARKUP_MODE,
)


@app.callback()
def _data_group() -> None:
    """Prepare training data for megatron-core, and inspect it."""


def _print_summary(console: Console, result: PrepareResult) -> None:
    table = Table(title="dlmspec data prepare", show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [
        ("input", result.input),
        (
            "tokenizer",
            f"{result.tokenizer_type} (vocab {result.vocab_size:,}, eod {result.eod}, "
            f"{result.dtype})",
        ),
        ("documents", f"{result.documents:,}"),
        ("tokens", f"{result.tokens:,}"),
        ("elapsed", f"{result.elapsed_s:.2f} s ({result.workers} workers)"),
        ("tokens/s", f"{result.tokens_per_s:,.0f}"),
    ]
    if result.shard_size is not None:
        resumed = f", {result.resumed_shards:,} kept from the interrupted run" if result.resumed_shards else ""
        rows.append(("shards", f"{len(result.shards):,} of up to {result.shard_size:,} tokens{resumed}"))
    for out in result.datasets:
        detail = f"{out.documents:,} documents, {out.tokens:,} tokens"
        if out.empty_documents:
            detail += f", {out.empty_documents:,} empty"
        if result.shard_size is not None:
            rows.append((f"key {out.json_key}", f"{result.manifests[out.json_key]} ({detail})"))
            continue
        rows.append((f"key {out.json_key}", f"{out.prefix}.{{bin,idx}} ({detail})"))
    for name, value in rows:
        table.add_row(Text(name), Text(shown(value)))  # Text: no markup in paths or keys
    console.print(table)


@app.command(cls=Command, name="prepare")
def prepare_command(
    ctx: typer.Context,
    input: Optional[list[str]] = typer.Option(
        None,
        "--input",
        help="JSONL file, one JSON object per line (.jsonl, .jsonl.gz, .jsonl.zst), a folder of them "
        "or a quoted glob ('data/*.jsonl.gz'); repeat for more, read in order (or --hf-dataset).",
    ),
    # The Hugging Face source: datasets.load_dataset(path, name, split=, revision=, streaming=).
    hf_dataset: Optional[str] = typer.Option(
        None,
        "--hf-dataset",
        help="Hugging Face dataset instead of --input: a hub name (Salesforce/wikitext) or a "
        "local folder of .jsonl/.parquet/.csv files; --json-keys names its columns. Needs the "
        "datasets library (dlmspec's hf extra).",
    ),
    hf_config: Optional[str] = typer.Option(
        None, "--hf-config", help="Its config (the hub's subset), e.g. wikitext-2-raw-v1."
    ),
    hf_split: Optional[str] = typer.Option(
        None, "--hf-split", help="Its split (default train; validation, test, ...)."
    ),
    hf_revision: Optional[str] = typer.Option(
        None, "--hf-revision", help="Branch, tag or commit of the dataset (pin it to rerun alike)."
    ),
    no_hf_streaming: bool = typer.Option(
        False,
        "--no-hf-streaming",
        help="Download the split into the Hugging Face cache first (kept for offline reruns) "
        "instead of streaming its rows (the default).",
    ),
    output_prefix: str = typer.Option(
        ..., "--output-prefix", help="Output path prefix: a .bin/.idx pair per key of --json-keys, named PREFIX_KEY_document."
    ),
    tokenizer_type: str = typer.Option(
        ..., "--tokenizer-type", help=f"One of {valid_tokenizer_types()}."
    ),
    tokenizer_model: Optional[str] = typer.Option(
        None,
        "--tokenizer-model",
        help="HuggingFace / MultimodalTokenizer directory or name; SentencePiece, GPTSentencePiece or "
        "Llama2 .model; tiktoken vocab .json.",
    ),
    vocab_file: Optional[str] = typer.Option(
        None, "--vocab-file", help="GPT-2 vocab.json; BertWordPiece* vocab.txt."
    ),
    merge_file: Optional[str] = typer.Option(None, "--merge-file", help="GPT-2 merges.txt."),
    vocab_size: Optional[int] = typer.Option(
        None, "--vocab-size",
        help="NullTokenizer / NullMultimodalTokenizer vocabulary size (TikTokenizer: total size).",
    ),
    json_keys: list[str] = typer.Option(
        ["text"],
        "--json-keys",
        help="Field(s) (or --hf-dataset columns) to tokenize, one dataset each; repeat or a,b.",
    ),
    workers: int = typer.Option(
        1, "--workers", help="Tokenizer processes (capped at the CPUs this process can use)."
    ),
    max_line_bytes: int = typer.Option(
        MAX_LINE_BYTES,
        "--max-line-bytes",
        help="Longest --input line (document) read, in bytes, newline not counted; a longer line is "
        "an error naming it. Each worker holds a line whole while tokenizing it: about 150x "
        "its size with a byte-level BPE.",
    ),
    append_eod: bool = typer.Option(
        False, "--append-eod", help="Append the tokenizer's EOD id to every document."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Replace an existing dataset at the output names (never an input file).",
    ),
    shard_size: Optional[str] = typer.Option(
        None,
        "--shard-size",
        help="Tokens per shard (2e9, 500M, 1.5G): numbered shards PREFIX-00000_KEY_document, each kept "
        "once complete, and a manifest (PREFIX_KEY_document, then .manifest.json) that data.train can name.",
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue an interrupted --shard-size run after its last complete shard (same arguments).",
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar on stderr."),
    # --sft: conversations to the SFT dataset (dlmspec.data.sft; docs/sft-data.md)
    sft: bool = typer.Option(False, "--sft", help="Conversations (JSONL messages or prompt/response) to an SFT dataset with response flags."),
    chat_template: Optional[str] = typer.Option(None, "--chat-template", help="--sft: chatml (default), llama3, plain, or tokenizer (the HF tokenizer's own)."),
    messages_key: Optional[str] = typer.Option(None, "--messages-key", help="--sft: the rows' messages key (default messages)."),
    prompt_key: Optional[str] = typer.Option(None, "--prompt-key", help="--sft: the rows' prompt key (default prompt)."),
    response_key: Optional[str] = typer.Option(None, "--response-key", help="--sft: the rows' response key (default response)."),
    seq_length: Optional[int] = typer.Option(None, "--seq-length", help="--sft: most tokens a sample has, EOD included (the training seq_length)."),
    overlong: Optional[str] = typer.Option(None, "--overlong", help="--sft: a row over --seq-length: skip (default) or truncate (counted either way)."),
    on_bad: Optional[str] = typer.Option(None, "--on-bad", help="--sft: a bad row: skip (default; counted by kind, lines listed) or fail."),
    first_new_token_id: Optional[int] = typer.Option(None, "--first-new-token-id", help="--sft: first id of chat tokens the vocabulary lacks (default vocab size + 1)."),
    mask_token_id: Optional[int] = typer.Option(None, "--mask-token-id", help="--sft: the objective's [MASK] id, which no new chat token may take."),
    pad_token_id: Optional[int] = typer.Option(None, "--pad-token-id", help="--sft: the pad id, which no new chat token may take."),
) -> None:
    """Tokenize JSONL or a Hugging Face dataset into Megatron indexed datasets (as Megatron-LM's
    preprocess_data.py)."""
    use_json(ctx, json_output)
    err = Console(stderr=True)
    try:
        # one flag per choice (a --x/--no-x pair widens the help's name column past 80 columns)
        hf_streaming = False if no_hf_streaming else None
        show_progress = not no_progress
        inputs = list(input or [])
        hub = source_from_flags(" ".join(inputs) if inputs else None, hf_dataset, hf_config, hf_split, hf_revision, hf_streaming)
        options = SftOptions(chat_template, messages_key, prompt_key, response_key, seq_length, overlong,
                             on_bad, first_new_token_id, mask_token_id, pad_token_id)
        if not sft and options.given():
            raise DataPrepareError(f"{options.given()[0]} is an SFT flag; add --sft (conversations) or drop it")
        if sft and (shard_size is not None or resume):
            raise DataPrepareError(f"{'--shard-size' if shard_size is not None else '--resume'}: not used with --sft "
                                   "(an SFT set is written whole); drop it")
        scale = {} if sft else {"shard_size": shard_size, "resume": resume}
        result = (partial(prepare_sft_command, options=options) if sft else prepare)(
            _sft_input(inputs) if sft else (inputs or None),
            output_prefix,
            tokenizer_type=tokenizer_type,
            tokenizer_model=tokenizer_model,
            vocab_file=vocab_file,
            merge_file=merge_file,
            vocab_size=vocab_size,
            json_keys=json_keys,
            workers=workers,
            append_eod=append_eod,
            force=force,
            max_line_bytes=max_line_bytes,
            show_progress=show_progress,
            console=err,
            hub=hub,
            **scale,
        )
    except DataPrepareError as exc:
        _fail(err, str(exc), json_output, "data-prepare")
        raise typer.Exit(code=EXIT_USAGE) from None
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, PrepareInterrupted) else int(signal.SIGINT)
        kept = getattr(exc, "kept", None)  # a --shard-size run: its complete shards stay
        _fail(err, f"interrupted ({signal.Signals(signum).name}): temporary files removed, "
              + (kept or "no dataset written"), json_output, "interrupted")
        raise typer.Exit(code=128 + signum) from None
    if json_output:
        print_envelope("data prepare", ok=True, result=result.to_dict())
    else:
        (print_sft_summary if sft else _print_summary)(Console(), result)


def _sft_input(values: list[str]) -> Optional[str]:
    """The one ``--input`` file of ``--sft`` (its bad rows are listed by line number, of one file).

    Raises:
        DataPrepareError: several ``--input`` values, a folder or a glob.
    """
    if not values:
        return None
    one = values[0]
    if len(values) > 1 or os.path.isdir(one) or (not os.path.exists(one) and set("*?[") & set(one)):
        raise DataPrepareError(
            f"--sft reads one --input file (.jsonl, .jsonl.gz or .jsonl.zst), got --input {' '.join(values)}; "
            "concatenate the files first (cat a.jsonl b.jsonl > all.jsonl), or prepare each to its own "
            "--output-prefix"
        )
    return one


def _print_inspection(console: Console, found: Inspection) -> None:
    # every string read from the dataset's files (its name, record, manifest, sample) goes through
    # shown(): secrets hidden, terminal escapes and lone surrogates escaped; Text: no markup
    table = Table(title=Text(f"dlmspec data inspect {shown(found.prefix)}"), show_header=False,
                  title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    tok = found.tokenizer
    if tok is None:
        tokenizer = "unknown (no PREFIX.dlmspec.json record)"
    else:
        files = ", ".join(f"{k} {v.get('path')}" for k, v in sorted((tok.get("files") or {}).items()))
        tokenizer = (f"{tok.get('type')} (vocab {tok.get('vocab_size')}, eod {tok.get('eod_id')}"
                     f"{', ' + files if files else ''}{'' if tok.get('files_match') else ', FILES CHANGED'})")
    rows = [
        ("tokenizer", tokenizer),
        ("documents", f"{found.documents:,} ({found.empty_documents:,} empty)"),
        ("sequences", f"{found.sequences:,}"),
        ("tokens", f"{found.tokens:,} ({found.dtype}; mean {found.mean_document_tokens:,.1f}, "
                   f"max {found.max_document_tokens:,} per document)"),
    ]
    if found.response is not None:  # SFT data: the tokens that carry loss (the response mask)
        rows.append(("loss tokens", f"{found.response['tokens']:,} ({100 * found.response['share']:.1f}% of tokens: "
                                    "responses, their end-of-turn tokens and final EOD)"))
    if found.shards is not None:
        rows.insert(0, ("shards", f"{len(found.shards):,} ({found.shards[0]['prefix']} ... {found.shards[-1]['prefix']})"
                        if found.shards else "0"))
    for name, value in rows:
        table.add_row(Text(name), Text(shown(value)))
    console.print(table)
    if found.histogram:
        hist = Table(title="document length histogram (tokens)", title_justify="left")
        hist.add_column("tokens", justify="right")
        hist.add_column("documents", justify="right")
        hist.add_column("")
        top = max(b["documents"] for b in found.histogram)
        for b in found.histogram:
            span = f"{b['min']:,}" if b["min"] == b["max"] else f"{b['min']:,}-{b['max']:,}"
            hist.add_row(span, f"{b['documents']:,}", "#" * max(1, round(30 * b["documents"] / top)))
        console.print(hist)
    sample = found.sample
    if sample["document"] is not None:
        console.print(Text(f"sample: document {sample['document']}, first {len(sample['ids'])} ids", style="bold"))
        console.print(Text(shown(sample["ids"])), soft_wrap=True)
        if sample.get("marked") is not None:
            from dlmspec.data.inspect import LOSS_CLOSE, LOSS_OPEN

            console.print(Text(f"loss on {sample['response_tokens']} of {len(sample['ids'])} sample tokens, "
                               f"between {LOSS_OPEN} and {LOSS_CLOSE}:"), soft_wrap=True)
            console.print(_marked_text(shown(repr(sample["marked"])), LOSS_OPEN, LOSS_CLOSE), soft_wrap=True)
        elif sample["text"] is not None:
            console.print(Text(shown(repr(sample["text"]))), soft_wrap=True)
    for note in found.notes:
        console.print(Text(f"note: {shown(note)}", style="yellow"), soft_wrap=True)


def _marked_text(text: str, open_: str, close: str) -> Text:
    """``text`` with each span from ``open_`` to ``close`` (markers kept, so it reads in plain
    text too) in bold green: the tokens that carry loss."""
    out = Text()
    rest = text
    while open_ in rest:
        before, _, after = rest.partition(open_)
        inside, found, rest = after.partition(close)
        out.append(before)
        out.append(open_ + inside + (close if found else ""), style="bold green")
    out.append(rest)
    return out


@app.command(cls=Command, name="inspect")
def inspect_command(
    ctx: typer.Context,
    prefix: str = typer.Argument(..., help="Dataset prefix (PREFIX.bin + PREFIX.idx), prepare's --output-prefix, or a sharded "
                                "output's *.manifest.json (all its shards as one dataset)."),
    sample_document: int = typer.Option(0, "--sample-document", help="Document shown as the sample (0-based)."),
    sample_tokens: int = typer.Option(SAMPLE_TOKENS, "--sample-tokens", help="Its first tokens shown and decoded."),
    no_decode: bool = typer.Option(False, "--no-decode", help="Show the sample as ids; build no tokenizer."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Show a dataset before a run: documents, tokens, length histogram, a decoded sample and
    the tokenizer it was written with."""
    use_json(ctx, json_output)
    err = Console(stderr=True)
    try:
        found = inspect_dataset(prefix, sample_document=sample_document, sample_tokens=sample_tokens,
                                decode=not no_decode)
    except DataPrepareError as exc:
        _fail(err, str(exc), json_output, "data-inspect", command="data inspect")
        raise typer.Exit(code=EXIT_USAGE) from None
    if json_output:
        print_envelope("data inspect", ok=True, result=found.to_dict())
    else:
        _print_inspection(Console(), found)


def _fail(err: Console, message: str, json_output: bool, rule: str, command: str = "data prepare") -> None:
    """Report a failed prepare (or inspect): ``error: MESSAGE`` in red on stderr, or with
    ``--json`` the envelope (:func:`dlmspec.cli.output.envelope`) on stdout."""
    if json_output:
        print_envelope(command, ok=False, issues=[SpecIssue(f"<{command}>", message, rule=rule,
                                                            source=f"dlmspec.data.{command.split()[-1]}")])
    else:
        message = shown(message, keep_newlines=True)  # it may quote a file's name or contents
        err.print(f"error: {message}" if rule != "interrupted" else message, style="bold red", markup=False,
                  highlight=False, soft_wrap=rule != "interrupted")
