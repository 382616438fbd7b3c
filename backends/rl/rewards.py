"""Reward functions scored in worker processes, each call with a timeout.

``RewardFunction("path/to/file.py:name", weight)`` or ``RewardFunction("builtin:exact_match")`` /
``"builtin:format"`` (:mod:`~dlmspec.backends.rl.reward_worker`); each is called
``function(prompt: str, completion: str, **row) -> float``.

:class:`RewardPool` keeps ``workers`` processes, each a fresh interpreter running
:mod:`dlmspec.backends.rl.reward_worker` (``python -m``, exec'd: never a fork of the training
process, which holds CUDA state, and the training script is not imported again, as
multiprocessing's ``spawn`` would import ``__main__``), talking over a socket pair.
:meth:`RewardPool.score` hands every (row,
function) call to a free worker and waits at most ``timeout_s`` for it. A call that

- raises (anything, ``SystemExit`` included) is a failure of kind ``"raised"``;
- returns something other than a finite real number (``bool`` counts as 0/1) is ``"not_a_number"``;
- runs past ``timeout_s`` is ``"timeout"``: its worker is killed and replaced;
- ends its worker (``os._exit``, a segfault, the out-of-memory killer) is ``"crashed"``: replaced.

A failure never raises: it is a :class:`RewardFailure` (prompt id, function, kind, message) in
:attr:`RewardScores.failures`, its value ``nan``; the other calls are scored and the pool goes on
working. The stage gives a row with a ``nan`` total no gradient
(:func:`~dlmspec.backends.rl.advantages.group_advantages`, :func:`~dlmspec.backends.rl.loss.policy_loss`)
and logs :meth:`RewardScores.failure_counts`.
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor


FAILURE_KINDS = ("raised", "timeout", "not_a_number", "crashed")

__all__ = ["FAILURE_KINDS", "RewardFunction", "RewardFailure", "RewardScores", "RewardPool", "RewardPoolError"]


class RewardPoolError(RuntimeError):
    """The pool cannot score at all: a reward function does not load, or workers do not start.
    ``str()`` names the function (or the pool), why, and a fix."""


@dataclass
class RewardFunction:
    """One reward: ``function`` (``"path/to/file.py:name"`` or ``"builtin:name"``) and its ``weight``
    in :attr:`RewardScores.total`."""

    function: str
    weight: float = 1.0


@dataclass
class RewardFailure:
    """One failed call: the row's ``prompt_id``, the ``function``, ``kind`` (one of
    :data:`FAILURE_KINDS`) and a one-line ``message``."""

    prompt_id: Any
    function: str
    kind: str
    message: str


@dataclass
class RewardScores:
    """The scores of ``N`` rows by ``F`` functions.

    Attributes:
        values: ``FloatTensor[N, F]`` (float32), ``nan`` where the call failed.
        total: ``FloatTensor[N]``, ``sum_f weight_f * values[:, f]``; ``nan`` if any call of the row failed.
        failures: every failed call, in row order.
    """

    values: Tensor
    total: Tensor
    failures: List[RewardFailure] = field(default_factory=list)

    def failure_counts(self) -> Dict[str, int]:
        """``{kind: count}`` over :data:`FAILURE_KINDS` (zeros included), for the step's log."""
        counts = {kind: 0 for kind in FAILURE_KINDS}
        for failure in self.failures:
            counts[failure.kind] += 1
        return counts


class _Worker:
    """One worker process (``python -m dlmspec.backends.rl.reward_worker FD``: a fresh interpreter,
    exec'd, so neither the training process's CUDA state nor its ``__main__`` module reaches it)
    and the parent's end of a socket pair, as a :class:`multiprocessing.connection.Connection`."""

    def __init__(self, functions: List[str], base_dir: Optional[str], memory_limit_mb: Optional[int]) -> None:
        parent, child = socket.socketpair()
        try:
            self.process = subprocess.Popen([sys.executable, "-m", "dlmspec.backends.rl.reward_worker", str(child.fileno())],
                                            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, close_fds=True)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        self.conn = Connection(parent.detach())
        self.ready = False
        self.started = time.monotonic()
        self.task: Optional[Tuple[int, int]] = None  # (row, function) in flight
        self.deadline = math.inf
        try:
            self.conn.send(("init", functions, base_dir, memory_limit_mb))
        except OSError:
            pass  # it died at once: its end of the socket is closed, which the pool reads as a crash

    @property
    def exitcode(self) -> Optional[int]:
        """The exit status once ended (``-N``: killed by signal ``N``), else ``None``."""
        return self.process.poll()

    def join(self, timeout: float) -> None:
        try:
            self.process.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process in uninterruptible sleep
            pass


class RewardPool:
    """Scores rows with reward functions in ``workers`` worker processes (module docstring).

    Args:
        functions: the rewards, at least one.
        workers: processes, >= 1.
        timeout_s: longest one call may run, seconds, > 0.
        base_dir: folder that relative function paths start from (the spec's folder); default the
            working directory.
        start_timeout_s: longest a worker may take to start and load the functions, seconds.
        memory_limit_mb: cap of each worker's address space, MiB (``RLIMIT_AS``; a reward that
            allocates past it raises ``MemoryError``, reported as ``"raised"``); default no cap.

    Raises:
        RewardPoolError: a function does not load (named, with why), or no worker starts.
        ValueError: bad arguments.
    """

    def __init__(self, functions: List[RewardFunction], *, workers: int = 2, timeout_s: float = 10.0,
                 base_dir: Optional[str] = None, start_timeout_s: float = 120.0,
                 memory_limit_mb: Optional[int] = None) -> None:
        if not functions:
            raise ValueError("RewardPool: give at least one reward function, e.g. RewardFunction('builtin:exact_match')")
        for f in functions:
            if not isinstance(f, RewardFunction) or not isinstance(f.function, str):
                raise ValueError(f"RewardPool: {f!r} is not a RewardFunction('path/to/file.py:name', weight)")
            if not isinstance(f.weight, (int, float)) or isinstance(f.weight, bool) or not math.isfinite(f.weight):
                raise ValueError(f"reward {f.function}: weight = {f.weight!r}, a finite number is needed (e.g. 1.0)")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"RewardPool: workers = {workers!r}, an integer >= 1 is needed (e.g. 2)")
        if not timeout_s > 0:
            raise ValueError(f"RewardPool: timeout_s = {timeout_s!r}, must be > 0 (e.g. 10)")
        self.functions = list(functions)
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.base_dir = base_dir
        if memory_limit_mb is not None and (isinstance(memory_limit_mb, bool) or not isinstance(memory_limit_mb, int)
                                            or memory_limit_mb < 64):
            raise ValueError(f"RewardPool: memory_limit_mb = {memory_limit_mb!r}, an integer >= 64 (MiB) or None")
        self.memory_limit_mb = memory_limit_mb
        self._specs = [f.function for f in self.functions]
        self._workers: List[_Worker] = []
        self._closed = False
        self.replaced = 0  #: workers killed and replaced so far (timeouts and crashes)
        for _ in range(workers):
            self._workers.append(_Worker(self._specs, base_dir, self.memory_limit_mb))
        try:
            self._wait_ready(all_workers=False)
        except BaseException:
            self.close()
            raise

    # -- workers -------------------------------------------------------------------------------

    def _on_ready(self, worker: _Worker, message: Any) -> None:
        tag, errors = message
        if tag != "ready":
            raise RewardPoolError(f"reward worker sent {tag!r} before 'ready'")
        worker.ready = True
        for spec, why in errors.items():
            if why is not None:
                raise RewardPoolError(f"reward function {spec}: {why}. Fix: point 'function' at an existing "
                                      "'path/to/file.py:name' that defines name(prompt, completion, **row), "
                                      "or use builtin:exact_match / builtin:format")

    def _wait_ready(self, *, all_workers: bool) -> None:
        """Wait for one (or every) starting worker's ``ready``; a worker that dies first, or does
        not answer within ``start_timeout_s``, is a :class:`RewardPoolError`."""
        while True:
            starting = [w for w in self._workers if not w.ready]
            if not starting or (not all_workers and len(starting) < len(self._workers)):
                return
            now = time.monotonic()
            late = min(w.started for w in starting) + self.start_timeout_s - now
            if late <= 0:
                raise RewardPoolError(f"reward workers did not start within {self.start_timeout_s:g} s "
                                      f"(loading {', '.join(self._specs)}). Fix: check that the reward files "
                                      "import quickly, or raise start_timeout_s")
            for conn in wait([w.conn for w in starting], timeout=late):
                worker = next(w for w in starting if w.conn is conn)
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    code = worker.exitcode
                    raise RewardPoolError(f"a reward worker exited (code {code}) while loading "
                                          f"{', '.join(self._specs)}. Fix: run the reward files with python "
                                          "to see why they fail to load") from None
                self._on_ready(worker, message)

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        fresh = _Worker(self._specs, self.base_dir, self.memory_limit_mb)
        self._workers[self._workers.index(worker)] = fresh
        self.replaced += 1
        return fresh

    # -- scoring -------------------------------------------------------------------------------

    def score(self, rows: Sequence[Dict[str, Any]]) -> RewardScores:
        """Score every row with every function (module docstring).

        Args:
            rows: dicts with ``"prompt"``, ``"completion"`` and ``"prompt_id"`` (plus the prompt
                file's other fields, handed to the functions as keyword arguments).

        Returns:
            :class:`RewardScores`.

        Raises:
            RewardPoolError: the pool is closed, or replacement workers cannot start.
            ValueError: a row is not a dict with those keys.
        """
        if self._closed:
            raise RewardPoolError("the reward pool is closed. Fix: score before close(), or make a new RewardPool")
        for i, row in enumerate(rows):
            if not isinstance(row, dict) or not {"prompt", "completion", "prompt_id"} <= row.keys():
                raise ValueError(f"row {i}: a dict with 'prompt', 'completion' and 'prompt_id' is needed")
        count, nfun = len(rows), len(self.functions)
        values = torch.full((count, nfun), float("nan"), dtype=torch.float32)
        failures: Dict[Tuple[int, int], RewardFailure] = {}
        pending = [(r, f) for r in range(count) for f in range(nfun)]
        pending.reverse()
        done = 0
        total_tasks = len(pending)

        def fail(task: Tuple[int, int], kind: str, message: str) -> None:
            row, fun = task
            failures[task] = RewardFailure(rows[row].get("prompt_id"), self._specs[fun], kind, message)

        while done < total_tasks:
            for worker in self._workers:
                if worker.ready and worker.task is None and pending:
                    task = pending.pop()
                    try:
                        worker.conn.send((task[0] * nfun + task[1], task[1], rows[task[0]]))
                    except (OSError, EOFError) as exc:  # the worker's pipe is gone: it died between calls
                        fail(task, "crashed", f"the reward worker could not take the call ({exc}); replaced")
                        done += 1
                        self._replace(worker)
                        continue
                    except Exception as exc:  # noqa: BLE001 - the row does not pickle (nothing was sent)
                        fail(task, "raised", f"the row cannot be sent to a worker: {type(exc).__name__}: {exc}")
                        done += 1
                        continue
                    worker.task = task
                    worker.deadline = time.monotonic() + self.timeout_s
            busy = [w for w in self._workers if w.task is not None or not w.ready]
            now = time.monotonic()
            deadline = min([w.deadline for w in busy if w.task is not None]
                           + [w.started + self.start_timeout_s for w in busy if not w.ready] + [now + 1.0])
            for conn in wait([w.conn for w in busy], timeout=max(0.0, deadline - now)):
                worker = next(w for w in self._workers if w.conn is conn)
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    worker.join(timeout=1)
                    code = worker.exitcode
                    if worker.task is None:
                        raise RewardPoolError(f"a reward worker exited (code {code}) while starting. Fix: run the "
                                              "reward files with python to see why they fail to load") from None
                    fail(worker.task, "crashed", f"the reward worker died (exit code {code}) during the call; replaced")
                    done += 1
                    self._replace(worker)
                    continue
                if not worker.ready:
                    self._on_ready(worker, message)
                    continue
                task = worker.task
                worker.task, worker.deadline = None, math.inf
                if task is None:
                    continue  # an answer after its call was given up (cannot happen: a late worker is killed)
                done += 1
                try:
                    task_id, kind, value = message
                except (TypeError, ValueError):
                    task_id, kind, value = None, "crashed", f"the worker sent {type(message).__name__}, not an answer"
                if task_id != task[0] * nfun + task[1]:
                    fail(task, "crashed", str(value) if task_id is None else "the reward worker answered another call; replaced")
                    self._replace(worker)
                    continue
                if kind == "ok":
                    values[task[0], task[1]] = float(value)
                else:
                    fail(task, kind if kind in FAILURE_KINDS else "raised", str(value))
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.task is not None and now >= worker.deadline:
                    fail(worker.task, "timeout", f"no answer within {self.timeout_s:g} s; the worker was killed and replaced")
                    done += 1
                    self._replace(worker)
                elif not worker.ready and now >= worker.started + self.start_timeout_s:
                    raise RewardPoolError(f"a replacement reward worker did not start within {self.start_timeout_s:g} s")
        weights = torch.tensor([f.weight for f in self.functions], dtype=torch.float32)
        total = (values * weights).sum(dim=1)
        ordered = [failures[key] for key in sorted(failures)]
        return RewardScores(values=values, total=total, failures=ordered)

    # -- life cycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the workers (asked to stop, killed after 2 s). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
        end = time.monotonic() + 2.0
        for worker in self._workers:
            worker.join(timeout=end - time.monotonic())
            worker.kill()
        self._workers = []

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass
