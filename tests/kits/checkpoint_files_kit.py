"""Helpers shared by tests (moved from test_damaged_checkpoints_are_refused.py): linked_copy, replace."""

from __future__ import annotations

import os
from pathlib import Path


def linked_copy(run_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A run folder whose ``checkpoints/latest`` and ``iter_*`` files are links to the tiny run's
    (a damaged file is then written in place of its link, the original untouched).

    Returns:
        ``(run folder, iter folder)``.
    """
    (src_iter,) = [p for p in (run_dir / "checkpoints").iterdir() if p.is_dir()]
    run = tmp_path / "run"
    it = run / "checkpoints" / src_iter.name
    it.mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text(src_iter.name + "\n")
    for f in src_iter.iterdir():
        (it / f.name).symlink_to(f)
    return run, it


def replace(path: Path, data: bytes | None = None, *, fifo: bool = False, link: str | None = None) -> Path:
    """Put ``data`` (or a FIFO, or a link to ``link``) where ``path``'s link was."""
    original = path.resolve() if path.is_symlink() else None
    if path.is_symlink() or path.exists():
        path.unlink()
    if fifo:
        os.mkfifo(path)
    elif link is not None:
        path.symlink_to(link)
    elif data is not None:
        path.write_bytes(data)
    return original  # type: ignore[return-value]
