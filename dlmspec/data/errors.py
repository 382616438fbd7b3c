"""The errors of ``dlmspec data prepare``: :class:`DataPrepareError` for a problem with the user's
input (the command prints it in red and exits 2) and :class:`PrepareInterrupted` for SIGTERM or
SIGHUP during a run (the command exits ``128 + signum``)."""

from __future__ import annotations

import signal

from dlmspec.credentials import HIDDEN, redact_text


class DataPrepareError(Exception):
    """A problem with the user's input; the message says what and where (no traceback).

    The message is redacted (:func:`dlmspec.credentials.redact_text`): a token-shaped name in a
    path (``hf_...``, ``ghp_...``) or a password inside a URL (``https://user:pass@host/...``,
    as ``--hf-dataset`` may be given) is never printed."""

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(hide_secrets(str(message)), *args)


#: Secrets this process was given in values that messages may quote in altered forms (the
#: password of an ``--hf-dataset`` URL, which a library may print as ``https:/user:pass@...``).
_SECRETS: set[str] = set()


def add_secret(secret: str) -> None:
    """Never print ``secret`` in a :class:`DataPrepareError` (it becomes ``<hidden>``)."""
    if secret and len(secret) >= 3:
        _SECRETS.add(secret)


def hide_secrets(text: str) -> str:
    """``text`` with the secrets of :func:`add_secret` and every token or URL password
    (:func:`dlmspec.credentials.redact_text`) hidden."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
    return redact_text(text)


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
