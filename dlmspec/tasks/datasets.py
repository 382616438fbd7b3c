"""The Megatron indexed datasets of a generated task (``dlmspec task make --prepare-data GPT2_DIR``):
the four datasets the bundled task specs read, written by ``dlmspec data prepare``'s own functions
(:func:`dlmspec.data.prepare.prepare`, :func:`dlmspec.data.sft.prepare_sft`) in this process, with the
arguments the commands of docs/tasks.md give them, so the ``.bin``/``.idx`` bytes are those commands'.

For ``--out DIR`` (``DIR`` without a trailing slash; ``.data/task-addition``):

=================  ===========================  ===============================  =====================================
dataset            input (in ``DIR``)           prefix read by the specs          ``dlmspec data prepare`` flags
=================  ===========================  ===============================  =====================================
``train``          ``pretrain-train.jsonl``      ``DIR-train_text_document``       ``--append-eod``
``valid``          ``pretrain-validation.jsonl`` ``DIR-valid_text_document``       ``--append-eod``
``sft-train``      ``sft-train.jsonl``           ``DIR-sft-train_text_document``   ``--sft --chat-template plain --seq-length 24``
``sft-valid``      ``sft-validation.jsonl``      ``DIR-sft-valid_text_document``   ``--sft --chat-template plain --seq-length 24``
=================  ===========================  ===============================  =====================================

every one with ``--tokenizer-type GPT2BPETokenizer --vocab-file GPT2_DIR/vocab.json --merge-file
GPT2_DIR/merges.txt`` (the demo's tokenizer). ``specs/task-addition-dlm.toml`` and
``task-addition-ar.toml`` read ``train``/``valid``, ``specs/task-addition-dlm-sft.toml`` reads
``sft-train``/``sft-valid``; :data:`SFT_SEQ_LENGTH` is that spec's ``train.seq_length`` and
:data:`SFT_CHAT_TEMPLATE` its ``stage.sft.chat_template`` (tests/unit/tasks checks both against the spec).

Plain Python: torch, megatron-core and ``tokenizers`` are imported by the data-prepare functions when
they run (:func:`dlmspec.data.prepare.load_runtime`), never at import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from rich.console import Console

__all__ = ["TaskDataset", "TOKENIZER_TYPE", "SFT_CHAT_TEMPLATE", "SFT_SEQ_LENGTH", "GPT2_FILES", "task_datasets",
           "gpt2_files", "existing_outputs", "prepare_task_datasets"]

#: The demo's tokenizer (``specs/demo-dlm.toml``: GPT-2's byte-level BPE).
TOKENIZER_TYPE = "GPT2BPETokenizer"
#: ``specs/task-addition-dlm-sft.toml``'s ``stage.sft.chat_template``.
SFT_CHAT_TEMPLATE = "plain"
#: ``specs/task-addition-dlm-sft.toml``'s ``train.seq_length``: the longest SFT sample, EOD included
#: (3-digit addition at fixed width: a 16-token rendered prompt, a 4-digit answer and EOD).
SFT_SEQ_LENGTH = 24
#: The files GPT2_DIR must hold: ``--vocab-file`` and ``--merge-file`` of ``dlmspec data prepare``.
GPT2_FILES = ("vocab.json", "merges.txt")


class TaskDataError(ValueError):
    """A ``--prepare-data`` problem: ``value``, ``why`` and ``fix`` (the flag is ``--prepare-data``
    unless ``flag`` says otherwise)."""

    def __init__(self, value: Any, why: str, fix: str, flag: str = "--prepare-data") -> None:
        self.flag, self.value, self.why, self.fix = flag, value, why, fix
        super().__init__(f"{flag} {value}: {why}. Fix: {fix}")


@dataclass(frozen=True)
class TaskDataset:
    """One dataset of a task: its ``name`` (``train``, ``valid``, ``sft-train``, ``sft-valid``), the
    task file it reads (``input_path``), its ``--output-prefix`` and whether it is an SFT set."""

    name: str
    input_path: str
    output_prefix: str
    sft: bool

    @property
    def prefix(self) -> str:
        """The prefix a spec's ``[data]`` names: ``{output_prefix}_text_document``
        (:func:`dlmspec.data.outputs.dataset_prefix`, the name data prepare writes)."""
        from dlmspec.data.outputs import dataset_prefix

        return dataset_prefix(self.output_prefix, "text")

    def files(self) -> List[str]:
        """Every path it writes: ``PREFIX.bin``, ``PREFIX.idx``, the record ``PREFIX.dlmspec.json``
        and, for an SFT set, the response flags ``PREFIX_response.{bin,idx}``."""
        from dlmspec.data.record import record_path

        out = [self.prefix + ".bin", self.prefix + ".idx", record_path(self.prefix)]
        if self.sft:
            from dlmspec.data.sft import RESPONSE_SUFFIX

            out += [self.prefix + RESPONSE_SUFFIX + ".bin", self.prefix + RESPONSE_SUFFIX + ".idx"]
        return out


def _base(out: str | os.PathLike) -> str:
    """``DIR`` of the prefixes ``DIR-train`` ...: ``--out`` without a trailing slash
    (``.data/task-addition/`` -> ``.data/task-addition``); a folder with no name of its own
    (``.``, ``..``, ``/``) is resolved first, so the prefixes sit beside it, never inside it."""
    path = Path(out)
    if path.name in ("", ".", ".."):
        path = path.resolve()
    return str(path)


def task_datasets(out: str | os.PathLike) -> List[TaskDataset]:
    """The four datasets of a task written to ``out`` (module docstring), in the order they are
    written."""
    base = _base(out)
    folder = Path(out)
    return [
        TaskDataset("train", str(folder / "pretrain-train.jsonl"), f"{base}-train", False),
        TaskDataset("valid", str(folder / "pretrain-validation.jsonl"), f"{base}-valid", False),
        TaskDataset("sft-train", str(folder / "sft-train.jsonl"), f"{base}-sft-train", True),
        TaskDataset("sft-valid", str(folder / "sft-validation.jsonl"), f"{base}-sft-valid", True),
    ]


def gpt2_files(folder: str | os.PathLike) -> Tuple[str, str]:
    """``(vocab.json, merges.txt)`` paths of ``folder`` after checking that both are regular files.

    Raises:
        TaskDataError: ``folder`` missing or not a folder, or a file missing, a link or not a
            regular file.
    """
    path = Path(folder)
    fetch = ("put GPT-2's vocab.json and merges.txt in one folder (e.g. .data/gpt2, where "
             "docs/getting-started.md downloads them) and pass it")
    if not path.exists():
        raise TaskDataError(str(folder), "no such folder", fetch)
    if not path.is_dir():
        raise TaskDataError(str(folder), "is not a folder (it should hold GPT-2's vocab.json and merges.txt)",
                            "pass the folder that holds them, not a file")
    found = []
    for name in GPT2_FILES:
        file = path / name
        if not file.exists() and not file.is_symlink():
            raise TaskDataError(str(folder), f"has no {name} (GPT-2's BPE needs {' and '.join(GPT2_FILES)})", fetch)
        if not file.is_file():
            raise TaskDataError(str(folder), f"{file} is not a regular file", fetch)
        found.append(str(file))
    return found[0], found[1]


def existing_outputs(datasets: List[TaskDataset], force: bool = False) -> List[Tuple[str, str, str]]:
    """``(path, why, fix)`` of every output path that would stop the run, by data prepare's own rule
    (:func:`dlmspec.data.outputs.occupant`): a folder (with ``force`` too), and without ``force``
    any file or link there; all of them at once, where data prepare stops at the first, and the
    dataset record and response files too, so that nothing is written when one would stop it."""
    from dlmspec.data.outputs import occupant

    found = []
    for dataset in datasets:
        for path in dataset.files():
            there = occupant(path)
            if there == "folder":
                found.append((path, "exists and is a folder; a dataset file cannot replace it",
                              "move it away, or choose another --out folder"))
            elif there == "file" and not force:
                found.append((path, "the dataset file exists and would be overwritten",
                              "pass --force (it replaces the datasets of an earlier run), or choose another --out folder"))
    return found


def prepare_task_datasets(datasets: List[TaskDataset], vocab_file: str, merge_file: str, *, workers: int = 1,
                          force: bool = False, show_progress: bool = True,
                          console: Optional[Console] = None) -> List[Dict[str, Any]]:
    """Write ``datasets`` with ``dlmspec data prepare``'s functions, one after another, each with its
    own progress bar on ``console`` (stderr by default).

    Returns:
        One summary a dataset: ``name``, ``input``, ``prefix``, ``documents``, ``tokens``, ``sft``
        and, for an SFT set, ``response_tokens`` and ``skipped`` (bad or over-long rows by kind).

    Raises:
        dlmspec.data.errors.DataPrepareError: as :func:`dlmspec.data.prepare.prepare` and
            :func:`dlmspec.data.sft.prepare_sft` (the datasets written before it are kept).
        KeyboardInterrupt: interrupted (the dataset being written leaves no file).
    """
    from dlmspec.data.prepare import prepare
    from dlmspec.data.sft import SftOptions, prepare_sft

    console = console or Console(stderr=True)
    tokenizer = {"tokenizer_type": TOKENIZER_TYPE, "vocab_file": vocab_file, "merge_file": merge_file}
    out: List[Dict[str, Any]] = []
    for index, dataset in enumerate(datasets, 1):
        if show_progress:
            console.print(f"dataset {index}/{len(datasets)}: {dataset.input_path} -> {dataset.prefix}",
                          markup=False, highlight=False, soft_wrap=True)
        row: Dict[str, Any] = {"name": dataset.name, "input": dataset.input_path, "prefix": dataset.prefix,
                               "sft": dataset.sft}
        if dataset.sft:
            sft = prepare_sft(dataset.input_path, dataset.output_prefix, **tokenizer,
                              options=SftOptions(chat_template=SFT_CHAT_TEMPLATE, seq_length=SFT_SEQ_LENGTH),
                              force=force, show_progress=show_progress, console=console)
            row.update(documents=sft.documents, tokens=sft.tokens, response_tokens=sft.response_tokens,
                       skipped={k: v for k, v in sft.bad_rows.items() if v})
        else:
            result = prepare(dataset.input_path, dataset.output_prefix, **tokenizer, append_eod=True,
                             workers=workers, force=force, show_progress=show_progress, console=console)
            row.update(documents=result.documents, tokens=result.tokens)
        out.append(row)
    return out
