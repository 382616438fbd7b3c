"""A run directory after (or while) it trains: ``dlmspec show RUN_DIR`` prints its provenance and
last metrics; :func:`read_run` is what ``dlmspec plot`` (:mod:`dlmspec.cli.plot`) reads too.

A run directory is ``[logging] run_dir`` (default ``runs/<name>``): the runtime appends one
``start`` record per launch to its ``metrics.jsonl``, then ``train`` / ``valid`` / ``checkpoint``
records and an ``exit`` record (``backends/megatron/metrics.py``). A line that does not parse (the
last one of a job killed mid-write) is skipped and counted. Imports neither torch nor matplotlib.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dlmspec.errors import SpecError, SpecIssue
from dlmspec.files import FileRefused, iter_lines, loads_json
from dlmspec.wording import count

#: The runtime's metrics file inside a run directory (``MetricsLogger``).
METRICS_FILE = "metrics.jsonl"


@dataclass
class RunLog:
    """The records of one run directory's ``metrics.jsonl``.

    Attributes:
        run_dir: The directory as given.
        records: Every record that parsed, in file order.
        skipped: Lines that did not parse (a truncated last line, say).
    """

    run_dir: str
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0

    def events(self, event: str) -> list[dict[str, Any]]:
        """The records of one ``event`` (``"start"``, ``"train"``, ``"valid"``, ...), in order."""
        return [r for r in self.records if r.get("event") == event]

    def last(self, event: str) -> dict[str, Any] | None:
        """The last record of ``event``, or ``None``."""
        found = self.events(event)
        return found[-1] if found else None

    @property
    def name(self) -> str:
        """The run's name (the last ``start`` record's), else the directory's name."""
        start = self.last("start")
        return str(start.get("name")) if start and start.get("name") else os.path.basename(os.path.normpath(self.run_dir))

    def series(self, event: str, key: str) -> tuple[list[int], list[float]]:
        """``(iterations, values)`` of ``key`` in the ``event`` records, by iteration; where a
        resume repeated iterations, the later launch's value wins. Records whose iteration is not
        an integer in ``[0, 2**63)`` or whose value is not a number a float holds are left out."""
        by_iteration: dict[int, float] = {}
        for record in self.events(event):
            value, iteration = record.get(key), record.get("iteration")
            if (isinstance(iteration, int) and not isinstance(iteration, bool) and 0 <= iteration <= MAX_ITERATION
                    and _real(value)):
                by_iteration[iteration] = float(value)
        steps = sorted(by_iteration)
        return steps, [by_iteration[s] for s in steps]


#: Iterations a record may give: megatron-core counts them in an int64.
MAX_ITERATION = 2**63 - 1


def _run_issue(run_dir: str, argument: str, message: str, hint: str) -> SpecError:
    """An error about the run folder ``run_dir`` (the table's "where" is the folder, not a spec)."""
    return SpecError([SpecIssue(argument, message, value=run_dir, hint=hint, rule="arguments", file=run_dir)])


def iter_metrics(path: str | os.PathLike[str]) -> Iterator[dict[str, Any] | None]:
    """Each non-blank line of the metrics file ``path`` (a run's ``metrics.jsonl``, or a copy of it
    under another name), in file order: its record (a JSON object), or ``None`` for a line that is
    not one (not JSON, as the last line of a job killed mid-write; not UTF-8; nested deeper than
    :data:`dlmspec.files.MAX_NESTING`; an integer longer than Python converts; a list or a number).

    Read with :func:`dlmspec.files.iter_lines`: a regular file only, no line longer than
    :data:`dlmspec.files.MAX_LINE_BYTES`. The one reader of metrics files: :func:`read_run` (for
    ``dlmspec show`` / ``plot`` / ``fit``) and ``bench/common.py``'s ``read_metrics`` use it.

    Raises:
        FileRefused: ``path`` is missing, unreadable or not a regular file (raised before the
            first record), or a line is longer than the cap (raised when the reading reaches it).
    """
    for _line_no, line in iter_lines(path, what=f"run folder's {METRICS_FILE}"):
        if not line.strip():
            continue
        try:
            record = loads_json(line, where=path, what="metrics record")
        except FileRefused:
            yield None
            continue
        yield record if isinstance(record, dict) else None


def read_run(run_dir: str, *, argument: str = "RUN_DIR") -> RunLog:
    """Read ``<run_dir>/metrics.jsonl`` (:func:`dlmspec.files.iter_lines`: a regular file, each
    line at most :data:`dlmspec.files.MAX_LINE_BYTES`; each record nested at most
    :data:`dlmspec.files.MAX_NESTING` levels). A line that is not a JSON object (not JSON, nested
    too deep, an integer longer than Python converts, a list) is skipped and counted.

    Args:
        run_dir: A run folder.
        argument: How the command line names it, for the error.

    Raises:
        SpecError: ``run_dir`` is not a folder, or its metrics.jsonl is missing, not a regular
            file (a FIFO, a link to a device), unreadable, or holds a line longer than the cap
            (the issue names the run folder, ``argument``, why and what to give instead).
    """
    hint = "give the run's [logging] run_dir (default runs/<name>), the folder that holds metrics.jsonl"
    if not os.path.isdir(run_dir):
        why = "is not a run folder: it is a file" if os.path.lexists(run_dir) else "is not a run folder: no such folder"
        raise _run_issue(run_dir, argument, why, hint)
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.lexists(path):
        raise _run_issue(run_dir, argument, f"is a folder without {METRICS_FILE} (no run has logged there yet)", hint)
    log = RunLog(run_dir)
    try:
        for record in iter_metrics(path):
            if record is None:
                log.skipped += 1
            else:
                log.records.append(record)
    except FileRefused as exc:
        raise _run_issue(run_dir, argument, f"{exc.path}: {exc.why}", exc.hint) from None
    return log


def _mapping(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else ``{}`` (a record written by hand may hold anything)."""
    return value if isinstance(value, dict) else {}


def _real(value: Any) -> bool:
    """A JSON number (not a bool) that converts to a float (a 400-digit integer does not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, infinity: Python's json reads them) as the
    string ``"nan"``, ``"inf"`` or ``"-inf"``, so ``--json`` prints standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def run_summary(log: RunLog) -> dict[str, Any]:
    """What ``dlmspec show RUN_DIR`` prints, as data (its ``--json`` result): the run's name, the
    number of launches, the last launch's provenance, its start phases' seconds, and the last
    ``train``, ``valid``, ``checkpoint`` and ``exit`` records. A provenance that is not an object
    is ``None``; of the phases only those with a number of seconds are kept."""
    start = log.last("start") or {}
    provenance = start.get("provenance")
    phases = {str(k): float(v) for k, v in _mapping(start.get("phases_s")).items() if _real(v)}
    return {
        "run_dir": log.run_dir,
        "name": log.name,
        "launches": len(log.events("start")),
        "skipped_lines": log.skipped,
        "provenance": provenance if isinstance(provenance, dict) else None,
        "phases_s": phases or None,
        "last_train": log.last("train"),
        "last_valid": log.last("valid"),
        "last_checkpoint": log.last("checkpoint"),
        "exit": log.last("exit"),
    }


def _number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) >= 1e15:
            return f"{value:.4g}"
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return str(value)


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """:func:`run_summary` as the text ``dlmspec show RUN_DIR`` prints."""
    lines = [f"run {summary['name']} ({os.path.join(summary['run_dir'], METRICS_FILE)}, "
             f"{summary['launches']} launch{'es' if summary['launches'] != 1 else ''}"
             + (f", {count(summary['skipped_lines'], 'unreadable line')} skipped" if summary["skipped_lines"] else "") + ")"]
    prov = summary.get("provenance")
    if prov:
        git = _mapping(prov.get("git"))
        versions = _mapping(prov.get("versions"))
        commit = (f"{git.get('commit')}{' (dirty: tracked files differ)' if git.get('dirty') else ''} in {git.get('root')}"
                  if git.get("commit") else "none (not launched inside a git repository)")
        lines += ["", "provenance (last launch)",
                  f"  spec content hash   {prov.get('spec_hash')}",
                  f"  dlmspec             {prov.get('dlmspec_version')}",
                  f"  git commit          {commit}"]
        lines += [f"  {name:<20}{versions.get(key) or 'not installed'}" for key, name in
                  (("python", "python"), ("torch", "torch"), ("cuda", "cuda"), ("megatron_core", "megatron-core"),
                   ("transformer_engine", "transformer-engine"), ("wandb", "wandb")) if key in versions]
    else:
        lines += ["", "provenance: none recorded (a run of an older dlmspec)"]
    if summary.get("phases_s"):
        lines.append("  start phases        " + ", ".join(f"{k} {v:.1f} s" for k, v in summary["phases_s"].items()))
    train = summary.get("last_train")
    if train:
        lines += ["", f"last train record (iteration {train.get('iteration')}"
                  + (f"/{train['train_iters']}" if train.get("train_iters") else "") + ")"]
        skip = {"event", "time", "iteration", "train_iters"}
        lines += [f"  {key:<20}{_number(value)}" for key, value in train.items() if key not in skip]
    valid = summary.get("last_valid")
    if valid:
        lines += ["", f"last validation      iteration {valid.get('iteration')}, loss {_number(valid.get('loss'))}"]
    ckpt = summary.get("last_checkpoint")
    if ckpt:
        lines.append(f"last checkpoint      {ckpt.get('path')} (iteration {ckpt.get('iteration')}, {ckpt.get('reason')})")
    end = summary.get("exit")
    if end:
        lines.append(f"exit                 {end.get('reason')} at iteration {end.get('iteration')}")
    elif train or summary["launches"]:
        lines.append("exit                 none yet (running, or killed before its exit record)")
    return lines


def show_run(run_dir: str, *, set_: list[str], json_output: bool) -> None:
    """``dlmspec show RUN_DIR``: :func:`summary_lines` on stdout, or the ``--json`` envelope.

    Raises:
        SpecError: ``--set`` given (it changes specs, not runs), or :func:`read_run`'s errors.
    """
    if set_:
        raise SpecError([SpecIssue("--set", "changes a spec, and RUN_DIR is a run folder", value=" ".join(set_),
                                   hint="drop --set, or give a spec file: dlmspec show SPEC --set ...",
                                   rule="arguments", file=run_dir)])
    summary = run_summary(read_run(run_dir))
    if json_output:
        from dlmspec.cli.output import print_envelope

        print_envelope("show", ok=True, result={"run": json_safe(summary)})
        return
    from dlmspec.cli.output import shown

    # each line quotes the run's own files (name, provenance, records): shown() hides secrets and
    # escapes terminal controls and lone surrogates, which stdout could not encode
    sys.stdout.write("\n".join(shown(line) for line in summary_lines(summary)) + "\n")
