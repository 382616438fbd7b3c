"""Stop signals: a run that gets one saves a checkpoint and exits with the requeue code.

SLURM sends SIGTERM at the time limit (and SIGUSR1 earlier with ``--signal=USR1@<s>``); torchrun
forwards it to every rank. :class:`ExitSignalWatcher` records it and lets the ranks agree after
each step, so they all save the same step (:data:`~dlmspec.backends.megatron.config.REQUEUE_EXIT_CODE`).
"""

from __future__ import annotations

import signal
from typing import Optional, Sequence

import torch
import torch.distributed as dist

#: Signals that stop a run (and that torchrun / SLURM send to the whole process group).
EXIT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")


class ExitSignalWatcher:
    """Records exit signals and agrees across ranks on whether one arrived.

    The handler only sets a flag; the loop calls :meth:`any_rank_received`
    after each step, which all-reduces the flag (MAX) over the world so every
    rank saves the same step and exits together, whichever ranks got the
    signal.

    Args:
        names: Signal names (``"SIGTERM"``, ``"SIGUSR1"``, ...).

    Raises:
        ValueError: For an unknown signal name.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.received: Optional[str] = None
        self._previous = {}
        for name in names:
            sig = getattr(signal, name, None)
            if not isinstance(sig, signal.Signals):
                raise ValueError(f"unknown signal {name!r}")
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def any_rank_received(self, device: torch.device) -> Optional[str]:
        """The signal name if any rank received one (``"remote"`` if not this one)."""
        flag = torch.tensor([1 if self.received else 0], dtype=torch.int32, device=device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if int(flag.item()) == 0:
            return None
        return self.received or "remote"

    def restore(self) -> None:
        """Reinstall the previous handlers."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
