"""The errors of ``dlmspec data prepare``: :class:`DataPrepareError` for a problem with the user's
input (the command prints it in red and exits 2) and :class:`PrepareInterrupted` for SIGTERM or
SIGHUP during a run (the command exits ``128 + signum``)."""

from __future__ import annotations

import signal


class DataPrepareError(Exception):
    """A problem with the user's input; the message says what and where (no traceback)."""


class PrepareInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived while :func:`dlmspec.data.prepare.prepare` wrote its temporary
    files.

    Raised in the main thread by the handler that :func:`dlmspec.data.prepare.prepare` installs
    (only where the signal had its default action), so the temporary files are removed as for
    Ctrl-C.
    ``signum`` is the signal's number; the CLI exits ``128 + signum``, as the shell would.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
