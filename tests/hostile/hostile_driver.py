"""Runs hostile-corpus cases (:mod:`hostile_corpus`) and judges each.

Each case gets a folder of its own (its commands' working directory, with ``HOME``, ``TMPDIR``
and the library caches inside it), built by the case, then snapshotted (every entry, links not
followed: kind, size, SHA-256 of regular files up to 64 MiB, link targets). Each command runs as
a subprocess (the venv's ``dlmspec`` console script, or its ``python`` for ``train.py --check``)
started through a launcher that sets ``RLIMIT_AS`` (default 2 GiB) and then ``exec``s it, in a
session of its own; the driver polls ``wait4`` and kills the whole process group past the
timeout (default 20 s). ``wait4``'s ``ru_maxrss`` is the peak resident memory of the command and
of every descendant it waited for (Linux reports the maximum over them, as ``RUSAGE_CHILDREN``).
As tests/kits/fuzz_driver.py: one process per case, a memory cap, a timeout, the peak RSS; cases run
``jobs`` at a time.

Verdicts per case (all must hold):

* ``no_traceback``: no ``Traceback (most recent call last)`` in any command's output;
* ``exit_code``: every exit code in the case's allowed set (``{0, 2}``; controls ``{0}``);
* ``no_hang``: no command hung: used more than the timeout (20 s) of CPU, sat idle (no CPU for
  3 s) past the timeout, or ran past 6 timeouts of wall-clock time (on an idle machine this is
  the 20 s wall-clock rule; on a shared, busy one a slow command that progresses is not a hang);
* ``memory``: no command's peak RSS over the memory cap;
* ``files_unchanged``: no entry of the folder created, changed or removed outside the case's
  declared outputs (the victim file unchanged, links not written through);
* ``no_code_run``: the canary file absent;
* ``no_secret_leak``: the case's secret in no command's output and no file written;
* ``no_raw_escapes``: none of the case's raw terminal escapes in the output.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import signal
import stat
import sys
import threading
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path[:0] = [p for p in (str(HERE), str(HERE.parent / "kits")) if p not in sys.path]

from hostile_corpus import ALWAYS_WRITABLE, Case, tools  # noqa: E402
from hostile_data import CANARY  # noqa: E402

TIMEOUT_S = 20.0
MEMORY_BYTES = 2 << 30
#: A command that got no CPU for this long after the timeout is blocked: killed as a hang.
IDLE_S = 3.0
#: A command still progressing is killed at this many timeouts of wall-clock time.
HARD_FACTOR = 6
TRACEBACK = b"Traceback (most recent call last)"
#: Regular files up to this size are hashed whole; larger ones (sparse hostile files) by size,
#: mtime and their first and last MiB.
HASH_LIMIT = 64 << 20
#: Output read back per command (a command that prints GiBs is cut here; the tail is kept).
OUTPUT_LIMIT = 64 << 20

#: Sets the address-space limit, then becomes the command (argv[1]: bytes, argv[2:]: the command).
LAUNCHER = ("import os, resource, sys; m = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_AS, (m, m)); "
            "os.execv(sys.argv[2], sys.argv[2:])")

#: Environment variables passed through to the commands (others, secrets included, are not).
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "VIRTUAL_ENV", "DLMSPEC_SHARED_DATA")

VERDICTS = ("no_traceback", "exit_code", "no_hang", "memory", "files_unchanged", "no_code_run", "no_secret_leak",
            "no_raw_escapes")


# ------------------------------------------------------------------------------------ snapshot
def _digest(path: str, size: int) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        if size <= HASH_LIMIT:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                sha.update(chunk)
        else:
            sha.update(handle.read(1 << 20))
            handle.seek(size - (1 << 20))
            sha.update(handle.read(1 << 20))
    return sha.hexdigest()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (links not followed): ``{relative posix path: facts}``."""
    found: dict[str, tuple] = {}

    def walk(folder: str, rel: str) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            found[rel or "."] = ("unreadable", exc.errno)
            return
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                found[name] = ("link", os.readlink(entry.path))
            elif stat.S_ISDIR(st.st_mode):
                found[name] = ("dir",)
                walk(entry.path, name)
            elif stat.S_ISREG(st.st_mode):
                extra = (st.st_mtime_ns,) if st.st_size > HASH_LIMIT else ()
                try:
                    found[name] = ("file", st.st_size, _digest(entry.path, st.st_size), *extra)
                except OSError as exc:
                    found[name] = ("file", st.st_size, f"unreadable {exc.errno}")
            else:
                found[name] = ("special", stat.S_IFMT(st.st_mode), st.st_rdev)

    walk(str(root), "")
    return found


def allowed(rel: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``rel`` matches one of ``patterns`` (``DIR/**``: DIR and all below it)."""
    for pattern in patterns:
        if pattern.endswith("/**"):
            prefix = pattern[:-3]
            if rel == prefix or rel.startswith(prefix + "/"):
                return True
        elif fnmatch.fnmatchcase(rel, pattern):
            return True
    return False


def changes(before: dict[str, tuple], after: dict[str, tuple]) -> list[tuple[str, str]]:
    """``[(path, "created" | "removed" | "changed")]``, sorted."""
    out = []
    for rel in sorted(set(before) | set(after)):
        if rel not in before:
            out.append((rel, "created"))
        elif rel not in after:
            out.append((rel, "removed"))
        elif before[rel] != after[rel]:
            out.append((rel, "changed"))
    return out


# ------------------------------------------------------------------------------------ commands
def case_env(folder: Path) -> dict[str, str]:
    """The commands' environment: HOME, TMPDIR and the caches inside the case folder, offline,
    one thread each (two busy cores), no GPU, no terminal."""
    home, tmp = folder / "home", folder / "tmp"
    home.mkdir(exist_ok=True)
    if len(str(tmp)) > 60:  # Unix socket paths (multiprocessing's managers) hold at most 107 bytes
        tmp = Path(tempfile.mkdtemp(prefix="hc-tmp-"))
    tmp.mkdir(exist_ok=True)
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update(HOME=str(home), TMPDIR=str(tmp), XDG_CACHE_HOME=str(home / ".cache"), XDG_CONFIG_HOME=str(home / ".config"),
               MPLCONFIGDIR=str(home / "mpl"), HF_HOME=str(home / "hf"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", TRITON_CACHE_DIR=str(home / "triton"), TORCHINDUCTOR_CACHE_DIR=str(home / "inductor"),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="",
               PYTHONDONTWRITEBYTECODE="1", COLUMNS="120", TERM="dumb", WANDB_MODE="disabled")
    return env


def run_command(argv: list[str], cwd: Path, env: dict[str, str], log: Path, *, timeout: float, memory: int,
                python: str) -> dict[str, Any]:
    """Run one command under the memory cap and the timeout; its output goes to ``log``."""
    start = time.monotonic()
    with open(log, "wb") as out:
        pid = os.fork()
        if pid == 0:  # the child: a session of its own, output to the log, no stdin
            try:
                os.setsid()
                os.chdir(cwd)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
                os.execve(python, [python, "-S", "-c", LAUNCHER, str(memory), *argv], env)
            finally:
                os._exit(127)
    timed_out = False
    ticks = os.sysconf("SC_CLK_TCK")
    last_cpu, last_change = 0.0, start
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        now = time.monotonic()
        cpu = session_cpu_seconds(pid, ticks)
        if cpu > last_cpu + 0.05:
            last_cpu, last_change = cpu, now
        wall = now - start
        # a hang: the CPU time of a busy loop, no CPU for IDLE_S past the timeout (blocked on a
        # FIFO, say), or the hard wall-clock limit (a machine shared with other work slows a
        # command that progresses: that is not a hang)
        if cpu > timeout or (wall > timeout and now - last_change > IDLE_S) or wall > timeout * HARD_FACTOR:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.05 if wall < 2 else 0.25)
    wall = time.monotonic() - start
    try:  # descendants left in its session (writer processes, a timed-out command's children)
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    rc = os.waitstatus_to_exitcode(status)
    size = log.stat().st_size
    with open(log, "rb") as handle:
        if size > OUTPUT_LIMIT:
            head = handle.read(OUTPUT_LIMIT // 2)
            handle.seek(size - OUTPUT_LIMIT // 2)
            output = head + handle.read()
        else:
            output = handle.read()
    cpu = usage.ru_utime + usage.ru_stime
    return {"rc": rc, "timed_out": timed_out, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "max_rss_bytes": usage.ru_maxrss * 1024,
            "output_bytes": size, "output": output}


def session_cpu_seconds(sid: int, ticks: int) -> float:
    """CPU seconds (user + system, with reaped children) of the processes of session ``sid``."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 (session), counted after the ")" of the name
            total += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    return total / ticks


def _expand(argv: list[str], tool: dict[str, str], base: Path) -> list[str]:
    return [a.replace("{dlmspec}", tool["dlmspec"]).replace("{python}", tool["python"]).replace("{lm_eval}", tool["lm_eval"])
            .replace("{base}", str(base)) for a in argv]


def _folder_name(case_id: str) -> str:
    return case_id.replace("/", "__")


def _secret_in_files(folder: Path, paths: list[str], secret: bytes) -> list[str]:
    hits = []
    for rel in paths:
        path = folder / rel
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size > HASH_LIMIT:
            continue
        try:
            if secret in path.read_bytes():
                hits.append(rel)
        except OSError:
            continue
    return hits


def run_case(case: Case, root: Path, base: Path, *, timeout: float = TIMEOUT_S, memory: int = MEMORY_BYTES,
             python: str | None = None, keep: bool = False) -> dict[str, Any]:
    """Build, run and judge one case; returns its record (see the module docstring)."""
    tool = tools(python)
    folder = root / "cases" / _folder_name(case.id)
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    started = time.monotonic()
    record: dict[str, Any] = {"id": case.id, "surface": case.surface, "hostile": case.hostile}
    try:
        case.build(folder)
    except Exception as exc:  # noqa: BLE001 - a corpus bug: reported as such
        record.update(ok=False, failures=[f"building the case failed: {type(exc).__name__}: {exc}"], verdicts={}, commands=[])
        return record
    env = case_env(folder)
    before = snapshot(folder)
    commands = []
    outputs: list[bytes] = []
    for number, argv in enumerate(case.commands):
        expanded = _expand(argv, tool, base)
        result = run_command(expanded, folder, env, logs / f"{_folder_name(case.id)}.{number}.log",
                             timeout=case.timeout_s or timeout, memory=memory, python=tool["python"])
        output = result.pop("output")
        outputs.append(output)
        text = output.decode("utf-8", "replace")
        result.update(argv=argv, traceback=TRACEBACK in output, output_tail=text[-1500:])
        commands.append(result)
    after = snapshot(folder)
    patterns = tuple(case.outputs) + ALWAYS_WRITABLE
    changed = changes(before, after)
    unexpected = [f"{rel} {how}" for rel, how in changed if not allowed(rel, patterns)]
    canary = (folder / CANARY).exists() or (base / CANARY).exists()
    secret_hits: list[str] = []
    if case.secret:
        needle = case.secret.encode()
        secret_hits += [f"output of command {i} ({' '.join(c['argv'][:3])})" for i, (c, out) in enumerate(zip(commands, outputs)) if needle in out]
        written = [rel for rel, how in changed if how != "removed"]
        secret_hits += [f"file {rel}" for rel in _secret_in_files(folder, written, needle)]
    escapes = [repr(marker) for marker in case.forbidden_output if any(marker.encode() in out for out in outputs)]
    verdicts = {
        "no_traceback": not any(c["traceback"] for c in commands),
        "exit_code": all(_rc_ok(case, c) for c in commands if not c["timed_out"]),
        "no_hang": not any(c["timed_out"] for c in commands),
        "memory": all(c["max_rss_bytes"] <= memory for c in commands),
        "files_unchanged": not unexpected,
        "no_code_run": not canary,
        "no_secret_leak": not secret_hits,
        "no_raw_escapes": not escapes,
    }
    failures = []
    for i, c in enumerate(commands):
        cmd = " ".join(c["argv"][1:4])
        if c["timed_out"]:
            failures.append(f"[{cmd}] hung: killed after {c['wall_s']:.0f} s wall, {c['cpu_s']:.0f} s CPU "
                            f"(limit {case.timeout_s or timeout:.0f} s)")
        elif not _rc_ok(case, c):
            failures.append(f"[{cmd}] exit code {c['rc']} (allowed {sorted(case.expect_rc)})")
        if c["traceback"]:
            failures.append(f"[{cmd}] traceback: {_last_line(c['output_tail'])}")
        if c["max_rss_bytes"] > memory:
            failures.append(f"[{cmd}] peak RSS {c['max_rss_bytes'] >> 20} MiB")
    if unexpected:
        failures.append("files changed outside the outputs: " + ", ".join(unexpected[:6]))
    if canary:
        failures.append("the canary file exists: hostile code ran")
    if secret_hits:
        failures.append("the secret leaked: " + ", ".join(secret_hits[:6]))
    if escapes:
        failures.append("raw terminal escapes printed: " + ", ".join(escapes))
    record.update(ok=all(verdicts.values()), verdicts=verdicts, failures=failures, commands=commands,
                  unexpected_changes=unexpected, wall_s=round(time.monotonic() - started, 3))
    if not keep and record["ok"]:
        _remove(folder)
    else:
        record["folder"] = str(folder)
    return record


def _rc_ok(case: Case, command: dict[str, Any]) -> bool:
    if command["rc"] in case.expect_rc:
        return True
    return bool(case.accept_refusal) and command["rc"] == 2 and case.accept_refusal in command["output_tail"]


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def run_cases(cases: list[Case], root: Path, base: Path, *, jobs: int = 2, timeout: float = TIMEOUT_S,
              memory: int = MEMORY_BYTES, python: str | None = None, keep: bool = False,
              report: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run ``cases`` ``jobs`` at a time; returns their records in the cases' order. ``report`` is
    called with each record as it finishes (from a worker thread, one at a time)."""
    lock = threading.Lock()
    base_before = snapshot(base)

    def one(case: Case) -> dict[str, Any]:
        record = run_case(case, root, base, timeout=timeout, memory=memory, python=python, keep=keep)
        if report is not None:
            with lock:
                report(record)
        return record

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        records = list(pool.map(one, cases))
    base_changes = [f"{rel} {how}" for rel, how in changes(base_before, snapshot(base))]
    if base_changes:  # a case wrote into the shared material: every record says so
        for record in records:
            record.setdefault("failures", []).append("the shared base folder changed: " + ", ".join(base_changes[:6]))
            record["verdicts"]["files_unchanged"] = False
            record["ok"] = False
    return records


def summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals: cases, passed, failed, and failures per surface, per class and per verdict."""
    out: dict[str, Any] = {"cases": len(records), "passed": sum(r["ok"] for r in records),
                           "failed": sum(not r["ok"] for r in records), "by_surface": {}, "by_class": {}, "by_verdict": {}}
    for r in records:
        for key, name in (("by_surface", r["surface"]), ("by_class", r["hostile"])):
            slot = out[key].setdefault(name, {"cases": 0, "failed": 0})
            slot["cases"] += 1
            slot["failed"] += not r["ok"]
        for verdict, ok in r.get("verdicts", {}).items():
            out["by_verdict"].setdefault(verdict, 0)
            out["by_verdict"][verdict] += not ok
    return out


def strip_for_json(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records as the result JSON keeps them (output tails only for failed commands' cases)."""
    kept = []
    for r in records:
        r = dict(r)
        r["commands"] = [{**c, "output_tail": c["output_tail"] if not r["ok"] else c["output_tail"][-300:]} for c in r.get("commands", [])]
        kept.append(r)
    return kept


def dumps(data: Any) -> str:
    return json.dumps(data, indent=1, ensure_ascii=True)
