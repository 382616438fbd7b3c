"""Stop signals: a run that gets one saves a checkpoint and exits with the requeue code.

SLURM sends SIGTERM at the time limit (and SIGUSR1 earlier with ``--signal=USR1@<s>``); torchrun
forwards it to every rank. :class:`ExitSignalWatcher` records it and lets the ranks agree after
each step, so they all save the same step (:data:`~dlmspec.backends.megatron.config.REQUEUE_EXIT_CODE`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import sys
import threading
from typing import Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist

#: Signals that stop a run (and that torchrun / SLURM send to the whole process group).
EXIT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")
#: Seconds after a stop signal at which a rank that is still running prints every thread's stack
#: (before torchrun's and SLURM's default 30 s grace ends in SIGKILL), so a save-and-exit that hangs
#: says where.
STACKS_AFTER_STOP_S = 20.0


class ExitSignalWatcher:
    """Records exit signals and agrees across ranks on whether one arrived.

    The handler only sets a flag; the loop calls :meth:`any_rank_received`
    after each step, which all-reduces the flag (MAX) over the world so every
    rank saves the same step and exits together, whichever ranks got the
    signal.

    The first signal also arms :func:`faulthandler.dump_traceback_later`: a rank still running
    ``stacks_after_s`` seconds later (a save or collective that hangs) prints every thread's Python
    stack to stderr, from faulthandler's own thread, which needs no GIL; a rank that exits first
    prints nothing, and :meth:`restore` disarms it.

    Args:
        names: Signal names (``"SIGTERM"``, ``"SIGUSR1"``, ...).
        stacks_after_s: seconds, or ``None`` for no stacks (default :data:`STACKS_AFTER_STOP_S`).

    Raises:
        ValueError: For an unknown signal name.
    """

    def __init__(self, names: Sequence[str], stacks_after_s: Optional[float] = STACKS_AFTER_STOP_S) -> None:
        self.received: Optional[str] = None
        self._previous = {}
        self._stacks_after_s = stacks_after_s
        self._armed = False
        for sig in signal_numbers(names):
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        out = _stderr_file() if self._stacks_after_s is not None and not self._armed else None
        if out is not None:
            self._armed = True
            print(f"[dlmspec] {self.received} received; a rank still running {self._stacks_after_s:g} s from now "
                  "prints its threads' stacks", file=out, flush=True)
            faulthandler.dump_traceback_later(self._stacks_after_s, exit=False, file=out)

    def any_rank_received(self, device: torch.device) -> Optional[str]:
        """The signal name if any rank received one (``"remote"`` if not this one)."""
        flag = torch.tensor([1 if self.received else 0], dtype=torch.int32, device=device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if int(flag.item()) == 0:
            return None
        return self.received or "remote"

    def restore(self) -> None:
        """Reinstall the previous handlers, and disarm the stacks a stop signal armed."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if self._armed:
            faulthandler.cancel_dump_traceback_later()
            self._armed = False


def signal_numbers(names: Sequence[str]) -> List[signal.Signals]:
    """The signals named (``"SIGTERM"``, ...).

    Raises:
        ValueError: For an unknown signal name.
    """
    numbers = []
    for name in names:
        sig = getattr(signal, name, None)
        if not isinstance(sig, signal.Signals):
            raise ValueError(f"unknown signal {name!r}")
        numbers.append(sig)
    return numbers


@contextlib.contextmanager
def signals_ignored(names: Sequence[str] = EXIT_SIGNALS) -> Iterator[None]:
    """While the body starts helper processes, the stop signals ``names`` set to ``SIG_IGN``, the
    previous handlers back afterwards: ``SIG_IGN`` survives fork and exec (handlers and the signal
    mask do not), so the helpers ignore a stop signal sent to the whole process group for their
    life. A signal arriving in the few milliseconds of the swap is lost. Off the main thread, where
    handlers cannot be set, nothing changes.

    Raises:
        ValueError: For an unknown signal name.
    """
    numbers = signal_numbers(names)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {n: signal.signal(n, signal.SIG_IGN) for n in numbers}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def ignore_exit_signals(worker_id: int) -> None:
    """DataLoader ``worker_init_fn`` (:func:`dlmspec.backends.megatron.data.build_dataloader`): workers
    ignore SIGTERM, SIGUSR1 and SIGINT.

    torchrun (torch.distributed.elastic) forwards a stop signal to each rank's whole process
    group, DataLoader workers included. A worker killed that way makes the rank's SIGCHLD handler
    raise ``RuntimeError: DataLoader worker ... is killed by signal: Terminated`` in the middle of
    the checkpoint the rank is saving on that very signal (seen on the H200: the save at the
    stop was lost). Workers do not need the signal: they exit when the rank closes the loader or
    dies (PyTorch's worker loop watches its parent).
    """
    for name in ("SIGTERM", "SIGUSR1", "SIGINT"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)


def stop_watcher(names: Sequence[str]) -> Optional[ExitSignalWatcher]:
    """The training loop's :class:`ExitSignalWatcher` of ``names`` (``None`` when there are none),
    with torch.compile's workers started so that those signals spare them
    (:func:`shield_compile_workers`)."""
    if not names:
        return None
    watcher = ExitSignalWatcher(names)
    shield_compile_workers(names)
    return watcher


def _stderr_file():
    """``sys.stderr``, else ``sys.__stderr__``, whichever is a real file (faulthandler writes to a
    file descriptor); ``None`` when neither is (no stacks then)."""
    for out in (sys.stderr, sys.__stderr__):
        fileno = getattr(out, "fileno", None)
        if fileno is None:
            continue
        try:
            fileno()
        except (OSError, ValueError):  # a capture object without a descriptor
            continue
        return out
    return None


def shield_compile_workers(names: Sequence[str], *, cuda_only: bool = True) -> bool:
    """Start torch inductor's compile-worker pool now, with the stop signals ``names`` ignored while
    it starts, so that its processes keep that disposition and outlive a stop signal.

    torchrun stops a worker with ``killpg`` (its whole process group) and SLURM signals every
    process of a job step, so inductor's compile workers (a sidecar process and its pool, started
    at the first ``torch.compile``, children of the training process) get the SIGTERM that the
    training process only records (:class:`ExitSignalWatcher`). Without them a compile that comes
    after the signal (a shape not seen yet: the generation evaluation's, a last short batch's) waits
    on their results for ever, so the job hangs until SIGKILL and its save-and-exit is lost
    (tests/integration/runtime/test_runtime_signals_moe.py shows both on CPU). An ignored disposition
    survives ``exec``, so workers started under it live until the training process exits (inductor's
    workers watch their parent and stop with it).

    Args:
        names: signal names, as :class:`ExitSignalWatcher`'s.
        cuda_only: start the pool only where CUDA is available (the runtime compiles only there:
            fused RoPE, compiled norms, FlexAttention); ``False`` for the CPU test.

    Returns:
        Whether the pool was started here: ``False`` without CUDA (with ``cuda_only``), where inductor
        compiles in-process (one compile thread), or where its pool exists already (started before
        this call; its workers then die with the signal as before).

    Raises:
        ValueError: for an unknown signal name.
    """
    if not signal_numbers(names) or (cuda_only and not torch.cuda.is_available()):
        return False
    from torch._inductor import async_compile, config

    pool = async_compile.AsyncCompile.process_pool  # functools.lru_cache(1): made once, on first use
    threads = getattr(async_compile, "get_compile_threads", lambda: config.compile_threads)()
    if not threads or threads <= 1 or not hasattr(pool, "cache_info") or pool.cache_info().currsize:
        return False
    with signals_ignored(names):
        pool()  # the sidecar starts now; its workers are its children
    return True
