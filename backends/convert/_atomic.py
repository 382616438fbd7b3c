"""Write a directory so that nothing half-written ever sits at its final path."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from backends.convert.errors import ConversionError


@contextmanager
def atomic_directory(dst: str | os.PathLike[str], overwrite: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary directory beside ``dst``; on success rename it to ``dst``.

    The temporary directory is ``<parent>/.<name>.tmp-XXXX`` (same filesystem, so the final
    ``os.replace`` is atomic). If the body raises, the temporary directory is removed and
    ``dst`` is untouched. With ``overwrite`` an existing ``dst`` is first moved aside and
    deleted only after the new one is in place.

    Raises:
        ConversionError: ``dst`` exists and ``overwrite`` is false.
    """
    dst = Path(dst)
    if dst.exists() and not overwrite:
        raise ConversionError(
            f"destination {str(dst)!r} already exists (pass overwrite=True to replace it)",
            tensor=str(dst),
            expected="a path that does not exist",
        )
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.chmod(tmp, 0o755)
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(dst, old)
        os.replace(tmp, dst)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, dst)
