"""A run directory after (or while) it trains: ``dlmspec show RUN_DIR`` prints its provenance and
last metrics; :func:`read_run` is what ``dlmspec plot`` (:mod:`dlmspec.cli.plot`) reads too.

A run directory is ``[logging] run_dir`` (default ``runs/<name>``): the runtime appends one
``start`` record per launch to its ``metrics.jsonl``, then ``train`` / ``valid`` / ``checkpoint``
records and an ``exit`` record (``backends/megatron/metrics.py``). A line that does not parse (the
last one of a job killed mid-write) is skipped and counted. Imports neither torch nor matplotlib.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from dlmspec.errors import SpecError, SpecIssue

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
        resume repeated iterations, the later launch's value wins."""
        by_iteration: dict[int, float] = {}
        for record in self.events(event):
            value, iteration = record.get(key), record.get("iteration")
            if isinstance(iteration, int) and isinstance(value, (int, float)) and not isinstance(value, bool):
                by_iteration[iteration] = float(value)
        steps = sorted(by_iteration)
        return steps, [by_iteration[s] for s in steps]


def read_run(run_dir: str, *, argument: str = "RUN_DIR") -> RunLog:
    """Read ``<run_dir>/metrics.jsonl``.

    Args:
        run_dir: A run directory.
        argument: How the command line names it, for the error.

    Raises:
        SpecError: ``run_dir`` is not a directory, or holds no readable metrics.jsonl (the
            issue names ``argument``, the value and what to give instead).
    """
    hint = "give the run's [logging] run_dir (default runs/<name>), the folder that holds metrics.jsonl"
    if not os.path.isdir(run_dir):
        raise SpecError([SpecIssue(argument, "is not a directory", value=run_dir, hint=hint, rule="arguments")])
    path = os.path.join(run_dir, METRICS_FILE)
    log = RunLog(run_dir)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    log.skipped += 1
                    continue
                if isinstance(record, dict):
                    log.records.append(record)
                else:
                    log.skipped += 1
    except FileNotFoundError:
        raise SpecError([SpecIssue(argument, f"holds no {METRICS_FILE} (no run has logged there yet)", value=run_dir,
                                   hint=hint, rule="arguments")]) from None
    except OSError as exc:
        raise SpecError([SpecIssue(argument, f"{METRICS_FILE} cannot be read ({exc.strerror})", value=run_dir,
                                   hint="check the file's permissions", rule="arguments")]) from None
    return log


def run_summary(log: RunLog) -> dict[str, Any]:
    """What ``dlmspec show RUN_DIR`` prints, as data (its ``--json`` result): the run's name, the
    number of launches, the last launch's provenance, its start phases' seconds, and the last
    ``train``, ``valid``, ``checkpoint`` and ``exit`` records."""
    start = log.last("start") or {}
    return {
        "run_dir": log.run_dir,
        "name": log.name,
        "launches": len(log.events("start")),
        "skipped_lines": log.skipped,
        "provenance": start.get("provenance"),
        "phases_s": start.get("phases_s"),
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
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return str(value)


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """:func:`run_summary` as the text ``dlmspec show RUN_DIR`` prints."""
    lines = [f"run {summary['name']} ({os.path.join(summary['run_dir'], METRICS_FILE)}, "
             f"{summary['launches']} launch{'es' if summary['launches'] != 1 else ''}"
             + (f", {summary['skipped_lines']} unreadable line(s) skipped" if summary["skipped_lines"] else "") + ")"]
    prov = summary.get("provenance")
    if prov:
        git = prov.get("git") or {}
        versions = prov.get("versions") or {}
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
        raise SpecError([SpecIssue("--set", "changes a spec, and RUN_DIR is a run directory", value=" ".join(set_),
                                   hint=f"drop --set, or give a spec file: dlmspec show SPEC --set ...",
                                   rule="arguments")])
    summary = run_summary(read_run(run_dir))
    if json_output:
        from dlmspec.cli.output import print_envelope

        print_envelope("show", ok=True, result={"run": summary})
        return
    sys.stdout.write("\n".join(summary_lines(summary)) + "\n")
