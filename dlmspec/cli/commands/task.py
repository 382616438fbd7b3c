"""``dlmspec task make``: write a generated verifiable task (:mod:`dlmspec.tasks.make`): prompts and
answers of train / validation / held-out test, and the training data in the formats ``dlmspec data
prepare`` reads (pre-training text and SFT prompt/response pairs). With ``--prepare-data GPT2_DIR``
it then writes the four Megatron indexed datasets the bundled task specs read, with ``dlmspec data
prepare``'s own functions (:mod:`dlmspec.tasks.datasets`). docs/tasks.md.

Nothing is overwritten without ``--force``, and ``--force`` replaces only files a ``task.json``
in the folder lists (files this command wrote) and the datasets at the prefixes named for ``--out``;
a symbolic link is never written through. Every check (the task's options, its files, GPT2_DIR, the
datasets' paths) runs before the first file is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from dlmspec.cli.app import app
from dlmspec.cli.help import MARKUP_MODE, Command, Group
from dlmspec.cli.output import print_envelope, use_json
from dlmspec.errors import SpecError, SpecIssue
from dlmspec.spec.lines import COMMAND_LINE

task_app = typer.Typer(cls=Group, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=MARKUP_MODE,
                       help="Verifiable tasks: `dlmspec task make NAME --out DIR` (prompts, answers, training data).")
app.add_typer(task_app, name="task")


def _issue(key: str, value: Any, why: str, fix: str) -> SpecError:
    return SpecError([SpecIssue(key=key, value=value, message=why, hint=fix, rule="task-make", file=COMMAND_LINE,
                                source="dlmspec.cli.commands.task")])


def _listed_by_task_record(folder: Path) -> set[str]:
    """Names a ``task.json`` of ``dlmspec task make`` in ``folder`` lists (empty when none can be
    read: then ``--force`` replaces nothing)."""
    from dlmspec.files import FileRefused, read_json

    record_path = folder / "task.json"
    if record_path.is_symlink() or not record_path.is_file():
        return set()
    try:
        record = read_json(record_path, limit=1 << 20)
    except (FileRefused, ValueError):
        return set()
    if not isinstance(record, dict) or record.get("kind") != "dlmspec-task" or not isinstance(record.get("files"), dict):
        return set()
    return {str(name) for name in record["files"]} | {"task.json"}


def check_targets(folder: Path, names: list[str], force: bool) -> None:
    """Refuse (exit 2, every file named) when a target is a link or not a regular file, exists
    without ``force``, or exists with ``force`` but was not written by ``dlmspec task make``."""
    if folder.exists() and not folder.is_dir():
        raise _issue("--out", str(folder), "exists and is not a folder", "give a folder path")
    ours = _listed_by_task_record(folder) if force else set()
    problems = []
    for name in names:
        target = folder / name
        if target.is_symlink():
            problems.append((str(target), "is a symbolic link; dlmspec does not write through links", "remove the link"))
        elif not target.exists():
            continue
        elif not target.is_file():
            problems.append((str(target), "exists and is not a regular file", "choose another --out folder"))
        elif not force:
            problems.append((str(target), "the file exists and would be overwritten",
                             "pass --force, or choose another --out folder"))
        elif name not in ours:
            problems.append((str(target), "the file exists and is not listed in this folder's task.json of "
                             "`dlmspec task make`: --force replaces only files it wrote",
                             "move it away first, or choose another --out folder"))
    if problems:
        raise SpecError([SpecIssue(key="--out", value=path, message=why, hint=fix, rule="output-file",
                                   file=COMMAND_LINE, source="dlmspec.cli.commands.task") for path, why, fix in problems])


@task_app.command("make", cls=Command)
def make_command(
    ctx: typer.Context,
    name: str = typer.Argument("addition", metavar="NAME", help="The task: addition (default), addition-padded (fixed width, easier) or sorting."),
    out: str = typer.Option(..., "--out", help="Folder to write the files into (created if missing)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the draws: the same seed and options give byte-identical files."),
    train: int = typer.Option(200_000, "--train", help="Training rows."),
    valid: int = typer.Option(1_000, "--valid", help="Validation rows."),
    test: int = typer.Option(1_000, "--test", help="Held-out test rows (at least 500)."),
    digits: Optional[int] = typer.Option(None, "--digits", help="addition: digits of each operand (5)."),
    length: Optional[int] = typer.Option(None, "--length", help="sorting: numbers in the list (10)."),
    max_value: Optional[int] = typer.Option(None, "--max-value", help="sorting: largest number, at most 9 (9)."),
    prepare_data: Optional[str] = typer.Option(
        None, "--prepare-data", metavar="GPT2_DIR",
        help="Also write the Megatron datasets the task specs read (DIR-train, DIR-valid, DIR-sft-train, DIR-sft-valid "
             "for --out DIR), tokenized with GPT-2's BPE from GPT2_DIR/vocab.json and merges.txt."),
    workers: int = typer.Option(1, "--workers", help="--prepare-data: tokenizer processes for the pre-training text."),
    force: bool = typer.Option(False, "--force", help="Replace files a previous `dlmspec task make` wrote there (and its datasets)."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Write a generated task: train/validation/test prompts with answers (JSONL), the held-out prompts
    in the plain chat template, pre-training text and SFT pairs for `dlmspec data prepare`, and task.json
    (options, seed, SHA-256 of each file); with --prepare-data, the tokenized datasets too."""
    use_json(ctx, json_output)
    from dlmspec.files import write_atomic
    from dlmspec.tasks.make import TASKS, TaskOptionError, resolve_options, task_files

    task = TASKS.get(name)
    if task is None:
        raise _issue("NAME", name, "not a task", "one of: " + ", ".join(TASKS))
    if seed < 0:
        raise _issue("--seed", seed, "a negative seed", "--seed 0")
    if test < 500:
        raise _issue("--test", test, "fewer than 500 held-out prompts give a 95 % interval wider than +-4.4 points",
                     "--test 1000")
    try:
        options = resolve_options(task, {"digits": digits, "length": length, "max_value": max_value})
        files = task_files(task, options, seed, {"train": train, "validation": valid, "test": test})
    except TaskOptionError as exc:
        raise _issue(exc.option, exc.value, exc.why, exc.fix) from None
    folder = Path(out)
    issues: list[SpecIssue] = []  # every file in the way named at once: the task's and the datasets'
    try:
        check_targets(folder, sorted(files), force)
    except SpecError as exc:
        issues += exc.issues
    try:
        datasets, gpt2 = _dataset_plan(folder, prepare_data, workers, force)
    except SpecError as exc:
        issues += exc.issues
    if issues:
        raise SpecError(issues)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for file_name, data in sorted(files.items()):
            write_atomic(folder / file_name, data)
    except OSError as exc:
        raise _issue("--out", out, f"cannot write: {exc.strerror or exc}", "a writable folder") from None
    result = {"task": name, "options": options, "seed": seed, "out": str(folder),
              "counts": {"train": train, "validation": valid, "test": test},
              "files": {n: len(d) for n, d in sorted(files.items())}}
    if datasets:
        if not json_output:
            print(f"task files written to {folder}; tokenizing its {len(datasets)} datasets with GPT-2's BPE "
                  f"from {prepare_data}", flush=True)
        result["datasets"] = _prepare(datasets, gpt2, prepare_data, workers, force)
    if json_output:
        print_envelope("task make", ok=True, result=result)
        return
    print(f"wrote {name} ({json.dumps(options)}, seed {seed}) to {folder}: {train} train, {valid} validation, "
          f"{test} test rows")
    for file_name, size in result["files"].items():
        print(f"  {file_name} ({size:,} bytes)")
    for row in result.get("datasets", []):
        skipped = sum(row.get("skipped", {}).values())
        print(f"  {row['prefix']} ({row['documents']:,} documents, {row['tokens']:,} tokens"
              + (f"; {skipped:,} rows skipped: {row['skipped']}" if skipped else "") + ")")


def _dataset_plan(folder: Path, gpt2_dir: Optional[str], workers: int, force: bool) -> tuple[list[Any], tuple[str, str]]:
    """The datasets ``--prepare-data`` writes and GPT-2's (vocab, merges) files, after every check
    (nothing written yet); ``([], ("", ""))`` without ``--prepare-data``.

    Raises:
        SpecError: GPT2_DIR missing or without vocab.json / merges.txt; ``--workers`` below 1; a
            dataset path that exists (without ``--force``: every one named) or is a folder.
    """
    if gpt2_dir is None:
        return [], ("", "")
    from dlmspec.tasks.datasets import TaskDataError, existing_outputs, gpt2_files, task_datasets

    if workers < 1:
        raise _issue("--workers", workers, "at least one tokenizer process is needed", "--workers 1")
    try:
        vocab, merges = gpt2_files(gpt2_dir)
    except TaskDataError as exc:
        raise _issue(exc.flag, exc.value, exc.why, exc.fix) from None
    datasets = task_datasets(folder)
    problems = existing_outputs(datasets, force)
    if problems:
        raise SpecError([SpecIssue(key="--prepare-data", value=path, message=why, hint=fix, rule="output-file",
                                   file=COMMAND_LINE, source="dlmspec.cli.commands.task") for path, why, fix in problems])
    return datasets, (vocab, merges)


def _prepare(datasets: list[Any], gpt2: tuple[str, str], gpt2_dir: str, workers: int, force: bool) -> list[dict[str, Any]]:
    """Write the datasets (:func:`dlmspec.tasks.datasets.prepare_task_datasets`, progress on stderr).

    Raises:
        SpecError: what ``dlmspec data prepare`` refuses (a tokenizer file it cannot read, an input
            that is an output, a write error), as ``--prepare-data``.
        typer.Exit: interrupted (``128 + signum``; the dataset being written leaves no file).
    """
    import signal

    from rich.console import Console

    from dlmspec.data.errors import DataPrepareError, PrepareInterrupted
    from dlmspec.tasks.datasets import SFT_SEQ_LENGTH, prepare_task_datasets

    err = Console(stderr=True)
    try:
        return prepare_task_datasets(datasets, *gpt2, workers=workers, force=force, console=err)
    except DataPrepareError as exc:
        again = "run again with --force (the task files are written; --force replaces them and the datasets)"
        if "over_long" in str(exc):  # the bad-row kind of an SFT row over --seq-length (dlmspec.data.sft.BAD_KINDS)
            raise _issue("--prepare-data", gpt2_dir, f"dlmspec data prepare refused: {exc}",
                         f"the SFT sets keep rows of at most {SFT_SEQ_LENGTH} tokens (task-addition-dlm-sft.toml's "
                         "train.seq_length), which 3-digit addition fits with GPT-2's BPE (one token a digit): pass "
                         "GPT-2's own vocab.json and merges.txt, or fewer --digits; then " + again) from None
        raise _issue("--prepare-data", gpt2_dir, f"dlmspec data prepare refused: {exc}",
                     "fix what it names, then " + again) from None
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, PrepareInterrupted) else int(signal.SIGINT)
        err.print(f"interrupted ({signal.Signals(signum).name}): the dataset being written left no file; run again "
                  "with --force", style="bold red", markup=False, highlight=False)
        raise typer.Exit(code=128 + signum) from None
