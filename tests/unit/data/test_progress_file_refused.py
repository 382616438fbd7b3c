"""``data prepare --resume`` reads its progress file through dlmspec.files
(:func:`dlmspec.data.shards.read_progress`): a progress file nested 100,000 deep, a FIFO or a
link to /dev/zero is refused with the file and the fix (--force), never a RecursionError or a
hang."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from dlmspec.data.errors import DataPrepareError
from dlmspec.data.shards import read_progress


@pytest.mark.parametrize("kind, why", [("nested", "nests"), ("fifo", "FIFO"), ("dev-zero", "character device")])
def test_a_progress_file_that_is_not_one_is_refused(tmp_path: Path, kind: str, why: str) -> None:
    path = tmp_path / "out.progress.json"
    timer = None
    if kind == "nested":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "fifo":
        os.mkfifo(path)

        def release() -> None:
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass

        timer = threading.Timer(3.0, release)
        timer.start()
    else:
        path.symlink_to("/dev/zero")
    try:
        with pytest.raises(DataPrepareError) as refused:
            read_progress(str(path))
    finally:
        if timer is not None:
            timer.cancel()
    text = str(refused.value)
    assert str(path) in text and why in text and "--force" in text
    assert read_progress(str(tmp_path / "none.json")) is None
