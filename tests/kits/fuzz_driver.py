"""Runs fuzz cases for ``tests/integration/fuzz/test_fuzz_specs.py``: each case in its own process.

``python tests/kits/fuzz_driver.py CASES.json RESULTS.json [--jobs N] [--timeout S] [--memory BYTES]``

CASES.json is a list of ``{"id": ..., "spec": PATH, "out": DIR}``. The driver imports dlmspec
once (CLI, typer app, compiler, planner, pydantic models, and what each command imports on
first use: it runs them once on a plain spec), then forks one child per case, so a
case costs its own work and not the ~0.5 s of a fresh interpreter. The child limits its address
space (``RLIMIT_AS``, default 2 GiB), sends stdout/stderr to files, and runs
``dlmspec validate SPEC``, ``dlmspec plan SPEC`` and ``dlmspec compile SPEC -o OUT`` through
:func:`dlmspec.cli.main`, as the console script does. It records each command's exit code,
whether it raised (with the traceback), whether the output holds a traceback, and the issues
the command reported (rule, key, severity), taken from :func:`dlmspec.cli.output.report_issues` and
:func:`dlmspec.cli.output.report_warnings`. The parent kills a child that runs past the timeout
(default 20 s) and records its peak resident memory (``wait4``'s ``ru_maxrss``).

RESULTS.json: one record per case: ``id``, ``status`` (``"done"``, ``"timeout"`` or
``"died"`` with the signal or exit status), ``max_rss_bytes``, ``wall_s`` and, when done,
``commands``: ``{name: {"rc", "raised", "traceback_in_output", "issues", "output_tail"}}``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

COMMANDS = (("validate", ["validate"]), ("plan", ["plan"]), ("compile", ["compile"]))


def warm_up() -> None:
    """Import and build what every command uses, once, before forking."""
    import dlmspec.cli as cli
    import dlmspec.cli.commands  # noqa: F401 - typer app
    import dlmspec.render.compile  # noqa: F401
    import dlmspec.plan  # noqa: F401
    from dlmspec.spec.load import load_text

    text = ('name = "w"\n[model]\npreset = "qwen3-0.6b"\n[train]\nglobal_batch_size = 8\nseq_length = 512\n'
            'train_iters = 10\n[data]\nmock = true\n')
    load_text(text, name="warm.toml")  # builds the pydantic validators
    cli.skip_pydantic_plugin_discovery()
    # Each command once on that spec, its output thrown away: what they import on first use (numpy,
    # rich's renderables, the plan report, ~0.1 s of CPU) is imported here, not again in every child,
    # and the templates compiled by compile are kept (dlmspec.render.compile keeps its environment).
    with tempfile.TemporaryDirectory() as folder, open(os.devnull, "w") as sink:
        spec = Path(folder) / "warm.toml"
        spec.write_text(text, encoding="utf-8")
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            for _, argv in COMMANDS:
                cli.main([*argv, str(spec)] + (["-o", str(Path(folder) / "out")] if argv == ["compile"] else []))
    # Every object made so far into the collector's permanent generation: a child's collections
    # then neither walk nor write (copy-on-write) the parent's objects.
    gc.collect()
    gc.freeze()


def _record(store: list, issues: Any) -> None:
    store.extend({"rule": i.rule, "key": i.key, "severity": i.severity} for i in issues)


def run_case(case: dict[str, Any], memory: int) -> dict[str, Any]:
    """In the child: run the commands of one case (see the module docstring)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    import dlmspec.cli as cli
    import dlmspec.cli.app
    import dlmspec.cli.commands
    import dlmspec.cli.output as output
    import dlmspec.cli.plan
    import dlmspec.cli.validate

    reported: list[dict[str, Any]] = []
    original_issues, original_warnings = output.report_issues, output.report_warnings

    def report_issues(issues: Any, **options: Any) -> None:
        _record(reported, issues)
        original_issues(issues, **options)

    def report_warnings(warnings: Any) -> None:
        _record(reported, warnings)
        original_warnings(warnings)

    # every module of dlmspec.cli that calls them (each imported the names; dlmspec.cli's fast path
    # imports them from dlmspec.cli.output when it reports)
    for module in (cli, dlmspec.cli.output, dlmspec.cli.app, dlmspec.cli.commands.compile,
                   dlmspec.cli.commands.new, dlmspec.cli.plan, dlmspec.cli.validate):
        for name, func in (("report_issues", report_issues), ("report_warnings", report_warnings)):
            if hasattr(module, name):
                setattr(module, name, func)
    results = {}
    for name, argv in COMMANDS:
        reported.clear()
        args = [*argv, case["spec"]] + (["-o", case["out"]] if name == "compile" else [])
        log = Path(case["out"] + f".{name}.log")
        with open(log, "w+b") as handle:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(handle.fileno(), 1)
            os.dup2(handle.fileno(), 2)
            raised = None
            try:
                rc = cli.main(args)
            except BaseException:  # noqa: BLE001 - the point: record what escaped
                rc = None
                raised = traceback.format_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            handle.seek(0)
            output = handle.read().decode("utf-8", "replace")
        results[name] = {"rc": rc, "raised": raised, "traceback_in_output": "Traceback (most recent call last)" in output,
                         "issues": list(reported), "output_tail": output[-2000:]}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases")
    parser.add_argument("results")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--memory", type=int, default=2 << 30)
    args = parser.parse_args(argv)
    cases = json.loads(Path(args.cases).read_text())
    warm_up()
    pending = list(reversed(cases))
    running: dict[int, tuple[dict[str, Any], float, str]] = {}
    results: list[dict[str, Any]] = []
    while pending or running:
        while pending and len(running) < args.jobs:
            case = pending.pop()
            result_file = case["out"] + ".result.json"
            pid = os.fork()
            if pid == 0:  # the child
                code = 0
                try:
                    data = run_case(case, args.memory)
                    with open(result_file, "w", encoding="utf-8") as handle:
                        json.dump(data, handle)
                except BaseException:  # noqa: BLE001
                    code = 3
                    try:
                        Path(result_file + ".crash").write_text(traceback.format_exc())
                    except BaseException:  # noqa: BLE001
                        pass
                os._exit(code)
            running[pid] = (case, time.monotonic(), result_file)
        pid, status, usage = os.wait4(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            for child, (case, start, _) in list(running.items()):
                if now - start > args.timeout:
                    os.kill(child, signal.SIGKILL)
                    os.waitpid(child, 0)
                    del running[child]
                    results.append({"id": case["id"], "status": "timeout", "wall_s": now - start, "max_rss_bytes": None})
            time.sleep(0.005)
            continue
        case, start, result_file = running.pop(pid)
        record: dict[str, Any] = {"id": case["id"], "wall_s": time.monotonic() - start,
                                  "max_rss_bytes": usage.ru_maxrss * 1024}
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and os.path.exists(result_file):
            record["status"] = "done"
            record["commands"] = json.loads(Path(result_file).read_text(encoding="utf-8"))
        else:
            crash = Path(result_file + ".crash")
            record["status"] = f"died ({'signal ' + str(os.WTERMSIG(status)) if os.WIFSIGNALED(status) else 'exit ' + str(os.WEXITSTATUS(status))})"
            record["crash"] = crash.read_text() if crash.exists() else None
        results.append(record)
    Path(args.results).write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
