"""The one exception type of :mod:`backends.convert`."""

from __future__ import annotations


class ConversionError(Exception):
    """A checkpoint cannot be converted as asked.

    Raised for a missing or unexpected tensor, a tensor whose shape disagrees with the target
    model dimensions, an unknown model family, a config that the converter cannot represent in
    megatron-core (or back), and for unusable paths. The message always names the tensor (or
    config key, or path) and what was expected.

    Attributes:
        tensor: the tensor name (or config key / path) the problem is about, or ``None``.
        expected: what was expected there (a shape, a value, a description), or ``None``.
    """

    def __init__(self, message: str, *, tensor: str | None = None, expected: object = None):
        super().__init__(message)
        self.tensor = tensor
        self.expected = expected
