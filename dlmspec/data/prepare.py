"""``dlmspec data prepare``: JSONL (or a Hugging Face dataset) to Megatron indexed datasets
(``.bin`` + ``.idx``).

The output is what Megatron-LM's ``tools/preprocess_data.py`` writes, with the same flag names:
one dataset per ``--json-keys`` key, named ``{output_prefix}_{key}_document``, written by
megatron-core's :class:`~megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder` with
``DType.optimal_dtype(vocab_size)``. A document is a JSON line's value under a key: a string,
or a list of strings that become the document's sequences. Empty sequences are dropped, EOD is
appended to the last sequence of non-empty documents with ``--append-eod``, and a document with
no tokens adds a document boundary only, all as Megatron does.

Lines are read in the parent (:mod:`dlmspec.data.read`), parsed and tokenized in ``--workers``
processes (at most the CPUs this process may use; :mod:`dlmspec.data.encode`) and written in
input order. Every bad line (invalid or too deeply nested JSON, a missing key, a line too long)
stops the run with its line number. What is written where, and what is never overwritten:
:mod:`dlmspec.data.outputs`. With ``hub`` (``--hf-dataset``) the documents are a Hugging Face
dataset's rows instead (:mod:`dlmspec.data.hub`), read in the parent, in the dataset's order,
and tokenized as JSON lines with the same values are: the same output bytes.

:func:`prepare` does the work and returns a :class:`PrepareResult`; :mod:`dlmspec.data.cli` is
the command. User-input problems raise :class:`~dlmspec.data.errors.DataPrepareError`. torch,
megatron-core, numpy and ``tokenizers`` (the runtime extra) are imported by :func:`load_runtime`
only, which says ``install dlmspec[runtime]`` when one is missing.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

from rich.console import Console

from dlmspec.data.builder import exclusive_builder, indexed_dataset_classes
from dlmspec.data.encode import ChunkEncoder, EncodeConfig, EncodedKey
from dlmspec.credentials import redact_text
from dlmspec.data.errors import DataPrepareError
from dlmspec.files import FileRefused, read_json
from dlmspec.data.hub import HubSource, open_dataset
from dlmspec.data.outputs import (
    DatasetOutput,
    check_outputs,
    commit_datasets,
    discard_partial,
    install_termination_handlers,
    remove_file,
    protected_inputs,
    remove_stale_tmp,
    restore_handlers,
    tmp_tag,
    dataset_prefix,
)
from dlmspec.data.read import CHUNK_BYTES, CHUNK_DOCS, MAX_LINE_BYTES, read_chunks, resolve_inputs
from dlmspec.data.record import tokenizer_section, write_record
from dlmspec.data import shards as sharding
from dlmspec.tokenizers import TokenizerError, TokenizerArgs, canonical_tokenizer_type


@dataclass
class PrepareResult:
    """What :func:`prepare` wrote; ``to_dict()`` is the ``--json`` summary."""

    input: str
    output_prefix: str
    tokenizer_type: str
    vocab_size: int
    eod: Optional[int]
    dtype: str
    workers: int
    append_eod: bool
    documents: int
    tokens: int
    elapsed_s: float
    datasets: list[DatasetOutput] = field(default_factory=list)
    #: One-line notes printed during the run (stale temporary files removed, ...).
    notes: list[str] = field(default_factory=list)
    #: The ``--hf-dataset`` source (dataset, config, split, revision, streaming); None for --input.
    hf_dataset: Optional[dict[str, Any]] = None
    #: Every ``--input`` file read, in order: path, bytes, mtime (:meth:`InputFile.to_dict`).
    inputs: list[dict[str, Any]] = field(default_factory=list)
    #: ``--shard-size`` (tokens); None: one dataset per key. Then, per shard, its index and per
    #: key its prefix and counts; the manifest per key; how many shards (and their tokens, all
    #: keys) an interrupted run had written before ``--resume``.
    shard_size: Optional[int] = None
    shards: list[dict[str, Any]] = field(default_factory=list)
    manifests: dict[str, str] = field(default_factory=dict)
    resumed_shards: int = 0
    resumed_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        """Tokens written per second by this run (shards kept from before ``--resume`` left out)."""
        new = self.tokens - self.resumed_tokens
        return new / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tokens_per_s"] = round(self.tokens_per_s, 1)
        data["elapsed_s"] = round(self.elapsed_s, 3)
        return data


def _parse_json_keys(json_keys: Sequence[str] | str) -> tuple[str, ...]:
    if isinstance(json_keys, str):
        json_keys = [json_keys]
    keys: list[str] = []
    for item in json_keys:
        for key in str(item).split(","):
            key = key.strip()
            if not key:
                continue
            if key in keys:
                raise DataPrepareError(f"--json-keys names {key!r} twice")
            keys.append(key)
    if not keys:
        raise DataPrepareError("--json-keys is empty; name at least one field (e.g. text)")
    return tuple(keys)


def _note(console: Console, notes: list[str], text: str) -> None:
    """Print a one-line note on ``console`` and keep it for the result."""
    notes.append(text)
    console.print(f"note: {text}", style="yellow", markup=False, highlight=False, soft_wrap=True)


def _cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, as under SLURM or taskset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _progress(console: Console) -> Any:
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("tokenizing"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[documents]:,} docs"),
        TextColumn("{task.fields[tokens]:,} tokens"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


#: The modules ``data prepare`` needs from the runtime extra (``dlmspec[runtime]``), in the order
#: :func:`load_runtime` imports them (the quick ones first), and the distribution of each.
RUNTIME_MODULES = {"numpy": "numpy", "tokenizers": "tokenizers", "torch": "torch", "megatron": "megatron-core"}


def load_runtime() -> tuple[Any, Any, Any]:
    """Import what ``data prepare`` needs from the runtime extra: numpy, the ``tokenizers``
    library (GPT-2 BPE; Hugging Face tokenizers build on it) and megatron-core's indexed-dataset
    writer (torch under it). The one place the command loads the runtime: the tokenizers and the
    workers built after it find these modules imported.

    Returns:
        ``(numpy, DType, IndexedDatasetBuilder)``; the builder creates its files exclusively
        (:func:`exclusive_builder`).

    Raises:
        DataPrepareError: a module cannot be imported (the runtime extra is not installed); the
            message names the module and its distribution and says ``install dlmspec[runtime]``.
    """
    try:
        import numpy as np
        import tokenizers  # noqa: F401  (imported here to be checked; dlmspec.tokenizers uses it)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # megatron-core's import-time warnings (Apex, TE)
            DType, IndexedDatasetBuilder = indexed_dataset_classes()  # megatron-core's writer, lightly imported
    except ImportError as exc:
        module = (exc.name or "").split(".")[0] or "?"
        provider = RUNTIME_MODULES.get(module, module)
        raise DataPrepareError(
            f"data prepare needs {provider} (module {module!r} cannot be imported: {exc}), "
            'which the runtime extra installs: install dlmspec[runtime] (pip install "dlmspec[runtime]")'
        ) from None
    return np, DType, exclusive_builder(IndexedDatasetBuilder)


def input_label(files: Sequence[Any]) -> str:
    """The inputs as the summary's ``input`` names them: the file, or ``FIRST ... LAST (N files)``
    (token-shaped parts redacted, :func:`dlmspec.credentials.redact_text`)."""
    if len(files) == 1:
        return redact_text(files[0].path)
    return redact_text(f"{files[0].path} ... {files[-1].path} ({len(files):,} files)")


def prepare(
    input_path: str | os.PathLike | Sequence[str | os.PathLike] | None,
    output_prefix: str | os.PathLike,
    *,
    tokenizer_type: str,
    tokenizer_model: str | None = None,
    vocab_file: str | None = None,
    merge_file: str | None = None,
    vocab_size: int | None = None,
    json_keys: Sequence[str] | str = ("text",),
    workers: int = 1,
    append_eod: bool = False,
    force: bool = False,
    max_line_bytes: int = MAX_LINE_BYTES,
    show_progress: bool = False,
    console: Console | None = None,
    chunk_docs: int = CHUNK_DOCS,
    chunk_bytes: int = CHUNK_BYTES,
    hub: HubSource | None = None,
    shard_size: int | str | None = None,
    resume: bool = False,
) -> PrepareResult:
    """Tokenize a JSONL file (or a Hugging Face dataset) into one Megatron indexed dataset per
    JSON key.

    Args:
        input_path: JSONL file, one JSON object per line (blank lines are skipped), or a list of
            ``--input`` values: files (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``), folders, globs,
            read in order as one stream (:func:`dlmspec.data.read.resolve_inputs`); None with
            ``hub``.
        output_prefix: datasets go to ``{output_prefix}_{key}_document.{bin,idx}``.
        tokenizer_type, tokenizer_model, vocab_file, merge_file, vocab_size: passed to
            :func:`dlmspec.tokenizers.build_tokenizer`.
        json_keys: fields to tokenize, one dataset each (``"a,b"`` also splits).
        workers: tokenizer processes; 1 tokenizes in this process. More than the CPUs this
            process may use is capped there, with a note. Output bytes do not depend on it.
        append_eod: append the tokenizer's EOD to every non-empty document.
        force: replace files at the output names (a dataset from an earlier run). An output
            that is an input file is refused even so.
        max_line_bytes: longest line read, in bytes, newline not counted; a longer line is
            a DataPrepareError naming it (it is measured, never held whole in memory).
        show_progress: draw a rich progress bar on ``console`` (default: stderr).
        chunk_docs, chunk_bytes: size of the unit of work sent to a worker.
        hub: read this Hugging Face dataset's rows instead of ``input_path``
            (:func:`dlmspec.data.hub.open_dataset`; ``json_keys`` name its columns, every row is
            a document, ``max_line_bytes`` does not apply).
        shard_size: tokens per shard (``2e9``, ``500M``; :func:`dlmspec.data.shards.parse_shard_size`):
            numbered shards and a manifest per key instead of one dataset, written as they fill
            and kept when the run is interrupted (:mod:`dlmspec.data.shards`). None: one dataset.
        resume: with ``shard_size``, continue an interrupted run after its last complete shard
            (its progress file must show the same arguments); with nothing to resume, start.
    Returns:
        A :class:`PrepareResult` with the counts and the written paths.

    Raises:
        DataPrepareError: the runtime extra is missing (:func:`load_runtime`); both or neither
            of ``input_path`` and ``hub``; a dataset that cannot be opened or read; bad input file,
            JSON (also nested too deeply), keys, a line over ``max_line_bytes``, or tokenizer
            arguments; an output name that is an input file, or (without ``force`` or, sharded,
            ``resume``) already exists; ``resume`` with other arguments than the interrupted run's
            (naming what differs), without ``shard_size``, with ``hub`` or with ``force``; a write
            error (disk full). Any exception (and KeyboardInterrupt) removes the temporary files;
            no ``.idx`` is left behind; complete shards are kept (the exception's ``kept`` says so).
        PrepareInterrupted: SIGTERM or SIGHUP during the run (temporary files removed).
    """
    if (input_path is None) == (hub is None):
        raise DataPrepareError(
            "pass --input FILE.jsonl or --hf-dataset NAME (one of them)"
            if hub is None
            else f"--input {input_path} and {hub.describe()}: pass one of them, not both"
        )
    if input_path is None or isinstance(input_path, (str, os.PathLike)):
        values = None if input_path is None else [os.fspath(input_path)]
    else:
        values = [os.fspath(v) for v in input_path]
    input_name = None if values is None else " ".join(values)
    output_prefix = os.fspath(output_prefix)
    keys = _parse_json_keys(json_keys)
    shard_size = sharding.parse_shard_size(shard_size)
    if resume and force:
        raise DataPrepareError("--resume and --force: pass one of them (--resume continues the interrupted run, "
                               "--force starts over and replaces its shards)")
    if resume and shard_size is None:
        raise DataPrepareError(
            "--resume continues a run with --shard-size (its complete shards are kept); add the interrupted "
            "run's --shard-size, or drop --resume (without --shard-size the dataset is written whole at the end)"
        )
    if resume and hub is not None:
        raise DataPrepareError(f"--resume continues a run of --input files, not {hub.describe()}; drop --resume "
                               "(and pass --force to replace the shards)")
    if int(workers) < 1:
        raise DataPrepareError(f"--workers must be at least 1, got {workers}")
    if int(max_line_bytes) < 1:
        raise DataPrepareError(f"--max-line-bytes must be at least 1, got {max_line_bytes}")
    console = console or Console(stderr=True)
    notes: list[str] = []
    workers = int(workers)
    cpus = _cpu_count()
    if workers > cpus:
        _note(
            console,
            notes,
            f"--workers {workers:,} is more than the {cpus} CPUs this process can use; "
            f"using {cpus} workers",
        )
        workers = cpus
    files = [] if values is None else resolve_inputs(values)
    input_files = [f.path for f in files]
    outputs = {
        key: DatasetOutput(
            json_key=key,
            prefix=dataset_prefix(output_prefix, key),
            bin_path=dataset_prefix(output_prefix, key) + ".bin",
            idx_path=dataset_prefix(output_prefix, key) + ".idx",
        )
        for key in keys
    }
    protected = protected_inputs(
        input_files,
        *(None if p is None else os.fspath(p) for p in (tokenizer_model, vocab_file, merge_file)),
    )
    if shard_size is None:
        check_outputs(outputs, output_prefix, protected, bool(force))
    else:
        sharding.check_protected(output_prefix, keys, protected)
        existing = sharding.existing_outputs(output_prefix, keys)
        if existing and not (force or resume):
            if _interrupted(sharding.progress_path(output_prefix)):
                earlier = ("an interrupted run's: pass --resume to continue it after its last complete shard, "
                           "--force to start over")
            else:
                earlier = "a dataset from an earlier run? pass --force to replace it"
            shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3:,} more" if len(existing) > 3 else "")
            raise DataPrepareError(
                f"--output-prefix {output_prefix} --shard-size: {shown} already exist ({earlier}), or pick "
                "another --output-prefix"
            )
    try:
        spec = TokenizerArgs(
            tokenizer_type=canonical_tokenizer_type(tokenizer_type),
            tokenizer_model=None if tokenizer_model is None else os.fspath(tokenizer_model),
            vocab_file=None if vocab_file is None else os.fspath(vocab_file),
            merge_file=None if merge_file is None else os.fspath(merge_file),
            vocab_size=vocab_size,
        )
    except TokenizerError as exc:
        raise DataPrepareError(str(exc)) from None
    opened = None if hub is None else open_dataset(hub, keys, show_progress=show_progress)
    label = input_label(files) if hub is None else hub.describe()
    np, DType, IndexedDatasetBuilder = load_runtime()
    try:
        tokenizer = spec.build()
    except TokenizerError as exc:
        raise DataPrepareError(str(exc)) from None
    if append_eod and tokenizer.eod is None:
        raise DataPrepareError(
            f"--append-eod: the {spec.tokenizer_type} tokenizer has no end-of-document token"
        )

    vocab = int(tokenizer.vocab_size)
    dtype = np.dtype(DType.optimal_dtype(vocab))
    out_dir = os.path.dirname(dataset_prefix(output_prefix, keys[0]))
    if out_dir:
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as exc:
            raise DataPrepareError(
                f"cannot create output directory {out_dir}: {exc.strerror}"
            ) from None

    for text in remove_stale_tmp(output_prefix, protected):
        _note(console, notes, text)
    inputs = [f.to_dict() for f in files]
    writer = None
    start_after = None
    if shard_size is not None:
        section = _tokenizer_section(spec, tokenizer, vocab)
        arguments = sharding.run_arguments(inputs, section, keys, bool(append_eod), shard_size, dtype.name)
        kept: list[dict[str, Any]] = []
        state_path = sharding.progress_path(output_prefix)
        state = read_progress(state_path) if resume else None
        if resume and state is None:
            if sharding.existing_outputs(output_prefix, keys):
                raise DataPrepareError(
                    f"--resume: no progress file {state_path}, so the files at --output-prefix {output_prefix} "
                    "are not an interrupted run's; pass --force (instead of --resume) to replace them"
                )
            _note(console, notes, f"--resume: nothing to resume (no {state_path}); starting at the first document")
        if state is not None:
            changed = sharding.differences(state.get("arguments") or {}, arguments)
            if changed:
                raise DataPrepareError(
                    f"--resume: the arguments differ from the earlier run's ({state_path}): "
                    f"{'; '.join(changed)}. Rerun with the same arguments, or pass --force (instead of "
                    "--resume) to start over"
                )
            kept = list(state.get("shards") or [])
            sharding.check_kept_shards(output_prefix, kept)
            if state.get("complete"):
                _note(console, notes, f"--resume: the run is complete already ({len(kept):,} shards); nothing to do")
                return _sharded_result(label, output_prefix, spec, vocab, tokenizer, dtype, workers, append_eod,
                                       0.0, keys, kept, 0, notes, hub, inputs, shard_size)
            if kept:
                start_after = tuple(kept[-1]["end"])
                _note(console, notes, f"--resume: {len(kept):,} complete shards kept; continuing after "
                                      f"{files[start_after[0]].path}:{start_after[1]}")
        elif force:
            for path in [sharding.progress_path(output_prefix)] + [sharding.manifest_path(output_prefix, k)
                                                                    for k in keys]:
                remove_file(path)  # nothing may point at a mix of old and new shards
        writer = sharding.ShardWriter(output_prefix, keys, shard_size, IndexedDatasetBuilder, dtype, section,
                                      inputs, arguments, kept)

    tag = tmp_tag()
    tmp = {key: f"{outputs[key].prefix}.{tag}" for key in keys}
    handlers: dict[int, Any] = {}
    builders: dict[str, Any] = {}
    renamed_bins: set[str] = set()
    config = EncodeConfig(
        tokenizer=spec,
        json_keys=keys,
        append_eod=bool(append_eod),
        input_name=label,
        dtype=dtype.name,
        max_line_bytes=int(max_line_bytes),
        unit="line" if hub is None else "row",
    )
    documents = 0
    tokens_seen = 0
    start = time.perf_counter()
    try:
        handlers.update(install_termination_handlers())
        if writer is not None:
            writer.write_progress(complete=False)
        for key in keys if writer is None else ():
            try:
                builders[key] = IndexedDatasetBuilder(tmp[key] + ".bin", dtype=dtype.type)
            except OSError as exc:
                raise DataPrepareError(f"cannot write {tmp[key]}.bin: {exc.strerror}") from None

        with ChunkEncoder(config, tokenizer, workers) as encoder:
            progress = (
                _progress(console)
                if show_progress
                else contextlib.nullcontext()
            )
            with progress:
                task = None
                if show_progress:  # bytes of the file, or rows of the dataset (None: unknown)
                    task = progress.add_task(
                        "tokenizing",
                        total=sum(f.size for f in files[(start_after or (0,))[0]:]) if opened is None
                        else opened.num_rows,
                        documents=0,
                        tokens=0,
                    )
                if opened is None:
                    chunks = read_chunks(
                        input_files, max(1, chunk_docs), max(1, chunk_bytes), int(max_line_bytes),
                        start_after=start_after,
                    )
                else:
                    chunks = opened.chunks(max(1, chunk_docs), max(1, chunk_bytes))
                for encoded in encoder.imap(chunks):
                    if writer is not None:
                        writer.add(encoded)
                    else:
                        for key, part in encoded.keys.items():
                            _write_documents(builders[key], part, outputs[key])
                    documents += encoded.documents
                    tokens_seen += sum(len(part.tokens) for part in encoded.keys.values())
                    if task is not None:
                        progress.update(
                            task,
                            advance=encoded.nbytes if opened is None else encoded.documents,
                            documents=documents,
                            tokens=tokens_seen,
                        )

        if writer is not None:
            if documents == 0 and not writer.shards:
                raise DataPrepareError(f"input file has no JSON lines (only blank lines): {label}")
            manifests = writer.finish()
            if force:
                for path in sharding.remove_extra_shards(output_prefix, keys, len(writer.shards)):
                    notes.append(f"removed {path} (a shard of the earlier run, past this run's last)")
            return _sharded_result(label, output_prefix, spec, vocab, tokenizer, dtype, workers, append_eod,
                                   time.perf_counter() - start, keys, writer.shards, writer.resumed, notes, hub,
                                   inputs, shard_size, manifests)
        if documents == 0:
            if hub is not None:
                raise DataPrepareError(f"{label}: the split has no rows; pick another --hf-split")
            if len(files) > 1:
                raise DataPrepareError(f"--input {input_name}: the {len(files):,} files have no JSON lines "
                                       "(only blank lines)")
            raise DataPrepareError(f"input file has no JSON lines (only blank lines): {label}")
        for key in keys:
            builders[key].finalize(tmp[key] + ".idx")
        commit_datasets(outputs, tmp, renamed_bins)
    except BaseException as exc:
        if writer is not None:
            writer.discard()
            if not writer.shards:  # nothing kept: leave nothing (a rerun starts as the first did)
                remove_file(sharding.progress_path(output_prefix))
            if isinstance(exc, KeyboardInterrupt):
                exc.kept = writer.kept_text()  # type: ignore[attr-defined]
        else:
            discard_partial(outputs, tmp, builders, renamed_bins)
        if isinstance(exc, OSError):  # disk full, quota, permissions: input reads raise their own
            where = f" ({exc.filename})" if exc.filename else ""
            raise DataPrepareError(
                f"--output-prefix {output_prefix}: cannot write the dataset in "
                f"{out_dir or os.curdir}{where}: {exc.strerror or exc}; temporary files removed"
            ) from None
        raise
    finally:
        restore_handlers(handlers)
    elapsed = time.perf_counter() - start
    _write_records(outputs.values(), spec, tokenizer, vocab, inputs)

    return PrepareResult(
        input=label,
        output_prefix=output_prefix,
        tokenizer_type=spec.tokenizer_type,
        vocab_size=vocab,
        eod=tokenizer.eod,
        dtype=dtype.name,
        workers=workers,
        append_eod=bool(append_eod),
        documents=documents,
        tokens=sum(o.tokens for o in outputs.values()),
        elapsed_s=elapsed,
        datasets=[outputs[key] for key in keys],
        notes=notes,
        hf_dataset=None if hub is None else hub.to_dict(),
        inputs=inputs,
    )


def _interrupted(progress_file: str) -> bool:
    """Whether ``progress_file`` is an unfinished sharded run's (False: none, complete, or not a
    progress file; read with :func:`dlmspec.files.read_json`, so a FIFO or device is never opened
    for reading)."""
    try:
        body = read_json(progress_file, limit=PROGRESS_MAX_BYTES, what="progress file")
    except FileRefused:
        return False
    return isinstance(body, dict) and body.get("complete") is False


#: The largest progress file read (one entry of about 300 bytes per shard and key: 100,000
#: shards of a few keys fit).
PROGRESS_MAX_BYTES = 256 << 20
#: The largest count or offset a progress file may hold (bytes, tokens, line numbers): int64.
_MAX_COUNT = 2**63 - 1
_START_AGAIN = "pass --force (instead of --resume) to start over, or move the file away to start again without --resume"


def _progress_refused(path: str, key: str, value: Any, why: str) -> DataPrepareError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return DataPrepareError(f"--resume: {path}: {key} is {shown}: {why}; the file was not written by an "
                            f"interrupted run of this dlmspec (or was changed since). {_START_AGAIN}")


def _count(path: str, key: str, value: Any) -> int:
    if type(value) is not int:
        raise _progress_refused(path, key, value, "expected a whole number")
    if not 0 <= value <= _MAX_COUNT:
        raise _progress_refused(path, key, value, f"expected a number from 0 to {_MAX_COUNT}")
    return value


def read_progress(path: str) -> Optional[dict[str, Any]]:
    """The progress file of an interrupted sharded run (``PREFIX.prepare-progress.json``, written
    by :class:`dlmspec.data.shards.ShardWriter`), every field checked; None when there is none.

    Read with :func:`dlmspec.files.read_json` (a regular file only, at most
    :data:`PROGRESS_MAX_BYTES`, UTF-8, nested at most 64 levels). Checked: ``kind`` and
    ``version``; ``complete`` a boolean; ``arguments`` an object whose ``inputs`` (path, bytes,
    mtime_ns), ``tokenizer``, ``json_keys``, ``append_eod``, ``shard_size`` and ``dtype`` have the
    types :func:`dlmspec.data.shards.run_arguments` writes; ``shards`` a list whose entry ``i`` has
    ``index`` ``i``, ``end`` ``[file index, line]`` (a file of ``arguments.inputs``, not before the
    previous entry's end) and, for each key of ``arguments.json_keys``, counts from 0 to 2**63 - 1.
    (Whether the arguments are this run's is :func:`dlmspec.data.shards.differences`' question;
    a line past the input's end is found when the input is read, :func:`dlmspec.data.read.read_chunks`.)

    Raises:
        DataPrepareError: the file cannot be read (FIFO, device, too large, not UTF-8 or JSON) or a
            field is wrong; the message names the file, the key, its value and the fix (start over
            with ``--force``, or move the file away and run without ``--resume``).
    """
    if not os.path.lexists(path):
        return None
    try:
        body = read_json(path, limit=PROGRESS_MAX_BYTES, what="progress file")
    except FileRefused as exc:
        raise DataPrepareError(f"--resume: {exc.path}: {exc.why}; {_START_AGAIN}") from None
    if not isinstance(body, dict):
        raise _progress_refused(path, "the file", type(body).__name__, "expected a JSON object")
    if body.get("kind") != sharding.PROGRESS_KIND:
        raise _progress_refused(path, "'kind'", body.get("kind"), f"expected {sharding.PROGRESS_KIND!r}")
    if body.get("version") != sharding.PROGRESS_VERSION or type(body.get("version")) is not int:
        raise _progress_refused(path, "'version'", body.get("version"),
                                f"this dlmspec reads version {sharding.PROGRESS_VERSION}")
    if type(body.get("complete")) is not bool:
        raise _progress_refused(path, "'complete'", body.get("complete"), "expected true or false")
    arguments = body.get("arguments")
    if not isinstance(arguments, dict):
        raise _progress_refused(path, "'arguments'", arguments, "expected an object")
    inputs = arguments.get("inputs")
    if not isinstance(inputs, list):
        raise _progress_refused(path, "'arguments.inputs'", inputs, "expected a list of input files")
    for i, item in enumerate(inputs):
        where = f"'arguments.inputs[{i}]'"
        if not isinstance(item, dict):
            raise _progress_refused(path, where, item, "expected an object (path, bytes, mtime_ns)")
        if not isinstance(item.get("path"), str):
            raise _progress_refused(path, where[:-1] + ".path'", item.get("path"), "expected a path")
        _count(path, where[:-1] + ".bytes'", item.get("bytes"))
        if type(item.get("mtime_ns")) is not int:
            raise _progress_refused(path, where[:-1] + ".mtime_ns'", item.get("mtime_ns"), "expected a whole number")
    tokenizer = arguments.get("tokenizer")
    if not isinstance(tokenizer, dict):
        raise _progress_refused(path, "'arguments.tokenizer'", tokenizer, "expected an object")
    tok_files = tokenizer.get("files", {})
    if tok_files is not None and (not isinstance(tok_files, dict)
                                  or not all(isinstance(v, dict) for v in tok_files.values())):
        raise _progress_refused(path, "'arguments.tokenizer.files'", tok_files, "expected an object of objects")
    json_keys = arguments.get("json_keys")
    if not isinstance(json_keys, list) or not all(isinstance(k, str) for k in json_keys):
        raise _progress_refused(path, "'arguments.json_keys'", json_keys, "expected a list of key names")
    if type(arguments.get("append_eod")) is not bool:
        raise _progress_refused(path, "'arguments.append_eod'", arguments.get("append_eod"), "expected true or false")
    _count(path, "'arguments.shard_size'", arguments.get("shard_size"))
    if not isinstance(arguments.get("dtype"), str):
        raise _progress_refused(path, "'arguments.dtype'", arguments.get("dtype"), "expected a dtype name")
    shards = body.get("shards")
    if not isinstance(shards, list):
        raise _progress_refused(path, "'shards'", shards, "expected a list of complete shards")
    previous = (0, 0)
    for i, entry in enumerate(shards):
        where = f"'shards[{i}]"
        if not isinstance(entry, dict):
            raise _progress_refused(path, where + "'", entry, "expected an object (index, end, keys)")
        if type(entry.get("index")) is not int or entry.get("index") != i:
            raise _progress_refused(path, where + ".index'", entry.get("index"), f"expected {i} (shards in order)")
        end = entry.get("end")
        if not isinstance(end, list) or len(end) != 2:
            raise _progress_refused(path, where + ".end'", end, "expected [file index, line number]")
        file_index = _count(path, where + ".end[0]'", end[0])
        line = _count(path, where + ".end[1]'", end[1])
        if file_index >= len(inputs):
            raise _progress_refused(path, where + ".end[0]'", file_index,
                                    f"'arguments.inputs' lists {len(inputs)} input file{'s' if len(inputs) != 1 else ''}")
        if (file_index, line) < previous:
            raise _progress_refused(path, where + ".end'", end, f"before the previous shard's end {list(previous)}")
        previous = (file_index, line)
        counts = entry.get("keys")
        if not isinstance(counts, dict) or sorted(counts) != sorted(json_keys):
            shown = sorted(counts) if isinstance(counts, dict) else counts
            raise _progress_refused(path, where + ".keys'", shown,
                                    f"expected counts for each of 'arguments.json_keys' {json_keys}")
        for key in json_keys:
            if not isinstance(counts[key], dict):
                raise _progress_refused(path, f"{where}.keys.{key}'", counts[key], "expected an object of counts")
            for name in ("documents", "tokens", "sequences", "empty_documents", "bin_bytes", "idx_bytes"):
                _count(path, f"{where}.keys.{key}.{name}'", counts[key].get(name))
    return body


def _tokenizer_section(spec: TokenizerArgs, tokenizer: Any, vocab: int) -> dict[str, Any]:
    """The record's ``tokenizer`` section (:func:`dlmspec.data.record.tokenizer_section`)."""
    files = {k: os.path.abspath(v) if v and os.path.exists(v) else v for k, v in spec.files().items()}
    try:
        return tokenizer_section(spec.tokenizer_type, vocab_size=vocab, eod_id=tokenizer.eod, files=files)
    except OSError as exc:
        raise DataPrepareError(f"cannot read the tokenizer file {exc.filename}: {exc.strerror or exc}") from None


def _sharded_result(label: str, output_prefix: str, spec: TokenizerArgs, vocab: int, tokenizer: Any, dtype: Any,
                    workers: int, append_eod: bool, elapsed: float, keys: Sequence[str], shards: list[dict[str, Any]],
                    resumed: int, notes: list[str], hub: Any, inputs: list[dict[str, Any]], shard_size: int,
                    manifests: Optional[dict[str, str]] = None) -> PrepareResult:
    """The :class:`PrepareResult` of a sharded run (``shards``: the progress file's entries)."""
    totals = sharding.kept_outputs(output_prefix, keys, shards)
    first = next(iter(totals.values()))
    before = sum(c["tokens"] for s in shards[:resumed] for c in s["keys"].values())
    return PrepareResult(
        input=label, output_prefix=output_prefix, tokenizer_type=spec.tokenizer_type, vocab_size=vocab,
        eod=tokenizer.eod, dtype=dtype.name, workers=workers, append_eod=bool(append_eod),
        documents=first.documents, tokens=sum(o.tokens for o in totals.values()), elapsed_s=elapsed,
        datasets=[totals[k] for k in keys], notes=notes, hf_dataset=None if hub is None else hub.to_dict(),
        inputs=inputs, shard_size=shard_size, resumed_shards=resumed, resumed_tokens=before,
        manifests=manifests or {k: sharding.manifest_path(output_prefix, k) for k in keys},
        shards=[{"index": s["index"], "keys": {k: {"path": sharding.shard_prefix(output_prefix, s["index"], k),
                                                    "documents": c["documents"], "tokens": c["tokens"]}
                                               for k, c in s["keys"].items()}} for s in shards],
    )


def _write_records(outputs: Any, spec: TokenizerArgs, tokenizer: Any, vocab: int,
                   inputs: list[dict[str, Any]]) -> None:
    """``PREFIX.dlmspec.json`` beside each dataset written (:mod:`dlmspec.data.record`): the
    tokenizer (type, vocabulary size, EOD id, its files with their SHA-256), the counts and the
    ``--input`` files (path, bytes, mtime; none for ``--hf-dataset``), so
    ``dlmspec data inspect`` and the checks can tell how the dataset was made.

    Raises:
        DataPrepareError: a record cannot be written (the dataset itself is complete).
    """
    section = _tokenizer_section(spec, tokenizer, vocab)
    for out in outputs:
        try:
            write_record(out.prefix, tokenizer=section, documents=out.documents, tokens=out.tokens,
                         **({"inputs": inputs} if inputs else {}))
        except OSError as exc:
            raise DataPrepareError(
                f"{out.prefix}.{{bin,idx}} written, but its record {out.prefix}.dlmspec.json cannot be "
                f"written: {exc.strerror or exc}"
            ) from None


def _write_documents(builder: Any, part: EncodedKey, out: DatasetOutput) -> None:
    """Append a chunk's documents of one key (``builder.add_documents``: the bytes of one
    ``add_document`` per document, written at once) and count them in ``out``."""
    builder.add_documents(part.tokens, part.sequence_lengths, part.sequences_per_document)
    out.documents += len(part.sequences_per_document)
    out.sequences += len(part.sequence_lengths)
    out.tokens += len(part.tokens)
    out.empty_documents += part.sequences_per_document.count(0)
