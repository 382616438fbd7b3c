"""The input files of ``dlmspec generate`` and ``eval``: prompts (``--prompt``, ``--prompts``
JSON lines), multiple-choice items (``--choices``, at most :data:`MAX_CHOICES` per item) and a
Megatron indexed dataset (``--data``: :func:`find_dataset`, :func:`dataset_windows`), each read
through :mod:`dlmspec.files` with a byte cap (:data:`MAX_FILE_BYTES`); a bad line is an issue
naming the file and line.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional

from dlmspec.cli.generate_options import _issue

#: Largest prompts / choices file read, bytes.
MAX_FILE_BYTES = 64 << 20

#: Most bad lines of one file reported at once (the file is not read past the last of them).
MAX_LINE_ISSUES = 20


class _LineIssues:
    """The issues of a file's bad lines, gathered so one run names them all (up to
    :data:`MAX_LINE_ISSUES`); :meth:`add` raises once that many are held, :meth:`raise_any` at the end."""

    def __init__(self) -> None:
        self.issues: list[Any] = []

    def add(self, error: Any) -> None:
        """Hold the issue of ``error`` (a one-issue :class:`SpecError` from :func:`_issue`)."""
        self.issues.extend(error.issues)
        if len(self.issues) >= MAX_LINE_ISSUES:
            self.raise_any(more=True)

    def raise_any(self, *, more: bool = False) -> None:
        """Raise the held issues as one :class:`SpecError`, if any; ``more``: lines past the last
        were not read (the last issue says so)."""
        if not self.issues:
            return
        from dlmspec.errors import SpecError

        if more:
            last = self.issues[-1]
            last.message += f" ({MAX_LINE_ISSUES} bad lines reported; the file was not read further)"
        raise SpecError(list(self.issues))


def _read_lines(path: str, flag_name: str, bad: Optional[_LineIssues] = None) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON)`` of each non-blank line of a JSONL file, read with
    :func:`dlmspec.files.iter_lines` (a regular file only, no line longer than
    ``dlmspec.files.MAX_LINE_BYTES``, at most :data:`MAX_FILE_BYTES` in all, UTF-8, each line nested
    at most ``dlmspec.files.MAX_NESTING`` levels). ``bad``: a line that is not JSON is held there
    and skipped, instead of raised.

    Raises:
        SpecError: the file is missing, not a regular file (a FIFO, a device, a folder), too large,
            a line too long, not UTF-8, not JSON or nested too deep (named, with the line).
    """
    from dlmspec.files import FileRefused, iter_lines, loads_json

    what = flag_name.lstrip("-") + " file"
    total = 0
    try:
        for number, raw in iter_lines(path, what=what):
            total += len(raw) + 1
            if total > MAX_FILE_BYTES:
                raise _issue(flag_name, path, f"is larger than {MAX_FILE_BYTES >> 20} MiB", "split it into smaller files")
            if not raw.strip():
                continue
            try:
                row = loads_json(raw, where=path, what=f"line {number}")
            except FileRefused as exc:
                error = _issue(flag_name, f"{path}:{number}", f"line {number} is not JSON ({exc.why})",
                               'one JSON object per line, e.g. {"prompt": "Once upon a time"}', file=path,
                               line=number)
                if bad is None:
                    raise error from None
                bad.add(error)
                continue
            yield number, row
    except FileRefused as exc:
        raise _issue(flag_name, path, exc.why, exc.hint) from None


def unicode_problem(text: str) -> Optional[str]:
    """Why ``text`` cannot be tokenized or printed as UTF-8 (a lone surrogate: an unpaired
    ``\\ud800`` escape in JSON, or bytes of the command line that are not UTF-8), else ``None``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"character {exc.start} is a lone surrogate (U+{ord(text[exc.start]):04X}), not text: "
                "it is not valid UTF-8")
    return None


def read_prompts(prompt: list[str], prompts_file: Optional[str]) -> list[dict[str, Any]]:
    """The prompts of ``--prompt TEXT`` (repeatable) or ``--prompts FILE.jsonl``: per line
    ``{"prompt": TEXT}`` or ``{"prompt_ids": [id, ...]}`` (token ids: for a model without a tokenizer).

    Returns:
        ``[{"prompt": TEXT} or {"prompt_ids": [...]}, ...]``.

    Raises:
        SpecError: neither or both given, an empty prompt, a bad file or line (named).
    """
    if bool(prompt) == bool(prompts_file):
        raise _issue("--prompt", None if not prompt else prompt[0],
                     "give the prompts one way: --prompt TEXT (repeatable) or --prompts FILE.jsonl" if not prompt
                     else "--prompt and --prompts were both given",
                     '--prompt "Once upon a time" or --prompts prompts.jsonl')
    if prompt:
        for text in prompt:
            if not text:
                raise _issue("--prompt", text, "is empty: the model needs at least one token", '--prompt "The"')
            why = unicode_problem(text)
            if why:
                raise _issue("--prompt", text.encode("utf-8", "backslashreplace").decode("ascii", "replace"), why,
                             "give the prompt as UTF-8 text")
        return [{"prompt": text} for text in prompt]
    out: list[dict[str, Any]] = []
    bad = _LineIssues()
    for number, row in _read_lines(prompts_file, "--prompts", bad):  # type: ignore[arg-type]
        text = row.get("prompt") if isinstance(row, dict) else None
        ids = row.get("prompt_ids") if isinstance(row, dict) else None
        if isinstance(text, str) and text:
            why = unicode_problem(text)
            if why:
                bad.add(_issue("--prompts", f"{prompts_file}:{number}", f"line {number}: \"prompt\" {why}",
                               "write the prompt as UTF-8 text (a \\ud83d escape needs its pair, e.g. \\ud83d\\ude00)",
                               file=prompts_file, line=number))
                continue
            out.append({"prompt": text})
        elif isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            out.append({"prompt_ids": ids})
        else:
            bad.add(_issue("--prompts", f"{prompts_file}:{number}", f"line {number} has neither a non-empty \"prompt\" "
                           "string nor a non-empty \"prompt_ids\" list of token ids",
                           '{"prompt": "Once upon a time"} or {"prompt_ids": [464, 2068]}', file=prompts_file,
                           line=number))
    bad.raise_any()
    if not out:
        raise _issue("--prompts", prompts_file, "holds no prompt", '{"prompt": "Once upon a time"} per line')
    return out


#: Most choices one multiple-choice item may have (benchmarks have 2 to ~10).
MAX_CHOICES = 1000


def _choice_issue(path: str, number: int, row: Any) -> Any:
    """The issue (a one-issue :class:`SpecError`) of line ``number`` of a ``--choices`` file, else ``None``."""
    ok = (isinstance(row, dict) and isinstance(row.get("context"), str) and isinstance(row.get("choices"), list)
          and len(row["choices"]) >= 2 and all(isinstance(c, str) and c for c in row["choices"]))
    if not ok:
        return _issue("--choices", f"{path}:{number}",
                      f"line {number} is not {{\"context\": str, \"choices\": [at least 2 non-empty str], \"label\": int}}",
                      '{"context": "The sky is", "choices": [" blue", " green"], "label": 0}', file=path, line=number)
    if len(row["choices"]) > MAX_CHOICES:
        return _issue("--choices", f"{path}:{number}", f"line {number} has {len(row['choices']):,} choices: an item "
                      f"has at most {MAX_CHOICES:,} (each choice is one scored forward pass)",
                      "split the item, or keep the choices a question really has", file=path, line=number)
    for name, text in [("context", row["context"])] + [(f"choice {i}", c) for i, c in enumerate(row["choices"])]:
        why = unicode_problem(text)
        if why:
            return _issue("--choices", f"{path}:{number}", f"line {number}: the {name} {why}",
                          "write it as UTF-8 text (a \\ud83d escape needs its pair, e.g. \\ud83d\\ude00)",
                          file=path, line=number)
    label = row.get("label")
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(row["choices"]):
        return _issue("--choices", f"{path}:{number}", f"line {number}: \"label\" = {label!r} is not an index of its "
                      f"{len(row['choices'])} choices", f"a label in 0..{len(row['choices']) - 1}", file=path,
                      line=number)
    return None


def read_choices(path: str) -> list[dict[str, Any]]:
    """Multiple-choice items of a JSONL file: ``{"context": str, "choices": [str, ...], "label": int}``.

    Raises:
        SpecError: a bad file or line (named, with the line).
    """
    items = []
    bad = _LineIssues()
    for number, row in _read_lines(path, "--choices", bad):
        error = _choice_issue(path, number, row)
        if error is not None:
            bad.add(error)
            continue
        items.append(row)
    bad.raise_any()
    if not items:
        raise _issue("--choices", path, "holds no item", '{"context": ..., "choices": [...], "label": 0} per line')
    return items


def find_dataset(prefix: str) -> str:
    """The indexed dataset's prefix (``PREFIX.bin`` + ``PREFIX.idx``); ``PREFIX_text_document`` is
    tried too (``dlmspec data prepare --output-prefix PREFIX`` writes it).

    Raises:
        SpecError: neither exists (``--data`` named).
    """
    for candidate in (prefix, prefix + "_text_document"):
        if os.path.isfile(candidate + ".bin") and os.path.isfile(candidate + ".idx"):
            return candidate
    from dlmspec.data.errors import DataPrepareError
    from dlmspec.data.inspect import manifest_shards, resolve_manifest

    try:
        manifest = resolve_manifest(prefix) or resolve_manifest(prefix + "_text_document")
        shards = manifest_shards(manifest)[1] if manifest else []
    except DataPrepareError:
        shards = []
    if shards:
        raise _issue("--data", prefix, f"a sharded output ({manifest}, {len(shards)} shards): eval scores the "
                     "first windows of one dataset", f"pass one shard, e.g. --data {shards[0]}")
    raise _issue("--data", prefix, f"no {prefix}.bin / .idx (nor {prefix}_text_document.bin / .idx)",
                 "give the prefix `dlmspec data prepare --output-prefix` wrote, e.g. .data/demo-valid")


def dataset_windows(prefix: str, *, seq_length: int, num_sequences: int, vocab_size: int) -> tuple[Any, dict[str, Any]]:
    """The first ``num_sequences`` windows of ``seq_length`` tokens of the dataset's documents,
    concatenated in order (as megatron-core's GPT dataset packs them, without shuffling).

    Returns:
        ``(LongTensor[n, seq_length], facts)``; ``n <= num_sequences`` when the data is shorter.

    Raises:
        SpecError: the dataset cannot be read, holds no full window, or ids outside the vocabulary.
    """
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from dlmspec.data.index import check_index
    from dlmspec.files import FileRefused

    try:  # an index that contradicts itself or its .bin is refused before megatron-core maps it
        check_index(prefix, exact_bin=True)
    except FileRefused as exc:
        raise _issue("--data", prefix, exc.why, exc.hint) from None
    try:
        data = IndexedDataset(prefix, mmap=True)
    except Exception as exc:  # noqa: BLE001 - megatron raises AssertionError/ValueError/OSError on a bad file
        raise _issue("--data", prefix, f"cannot be read as a Megatron indexed dataset ({str(exc)[:200]})",
                     "give a prefix `dlmspec data prepare` wrote") from None
    need = seq_length * num_sequences
    pieces, have, docs = [], 0, 0
    for i in range(len(data)):
        doc = np.asarray(data[i], dtype=np.int64)
        pieces.append(doc)
        have += doc.size
        docs += 1
        if have >= need:
            break
    flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    n = min(num_sequences, flat.size // seq_length)
    if n == 0:
        raise _issue("--seq-length", seq_length, f"the dataset holds {flat.size} tokens, less than one window",
                     f"--seq-length {max(2, flat.size)}")
    windows = torch.from_numpy(flat[: n * seq_length].reshape(n, seq_length).copy())
    top = int(windows.max())
    if top >= vocab_size:
        raise _issue("--data", prefix, f"holds token id {top}, outside the model's vocabulary of {vocab_size}",
                     "score data tokenized with the model's tokenizer")
    return windows, {"prefix": prefix, "documents_read": docs, "num_sequences": n, "seq_length": seq_length,
                     "tokens": n * seq_length, "windows": "the first documents concatenated in order, cut into "
                     "windows of seq_length (no shuffling)"}
