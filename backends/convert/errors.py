"""The exception types of :mod:`dlmspec.backends.convert`: :class:`ConversionError` for every input the
converter refuses, :class:`Interrupted` for a conversion stopped by SIGTERM."""

from __future__ import annotations


class ConversionError(Exception):
    """A checkpoint cannot be converted as asked.

    Raised for a missing or unexpected tensor, a tensor whose shape disagrees with the target
    model dimensions, an unknown model family, a config that the converter cannot represent in
    megatron-core (or back), unreadable or corrupt files, and for unusable paths. The message
    always names the tensor (or config key, or path) and what was expected.

    Attributes:
        tensor: the tensor name (or config key / path) the problem is about, or ``None``.
        expected: what was expected there (a shape, a value, a description), or ``None``.
        hint: what the user can do (the command prints it as ``fix:``), or ``None``.
    """

    def __init__(self, message: str, *, tensor: str | None = None, expected: object = None,
                 hint: str | None = None):
        super().__init__(message)
        self.tensor = tensor
        self.expected = expected
        self.hint = hint


class Interrupted(KeyboardInterrupt):
    """SIGTERM arrived while a checkpoint was being written (raised instead of dying, so the
    temporary folder is removed; see :func:`dlmspec.backends.convert._atomic.atomic_directory`).

    Attributes:
        signum: the signal's number.
    """

    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
