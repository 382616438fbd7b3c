"""The resume tracker ``latest`` (backends/megatron/checkpointing.py) is read as an untrusted file:
binary bytes, a pipe, a huge file or a name that is no folder name are refused with
FileNotFoundError (train.py --check turns it into exit 2), never a traceback or a hang."""

from __future__ import annotations

import os

import pytest

from dlmspec.backends.megatron.checkpointing import read_latest_checkpoint


def test_a_tracker_naming_a_saved_folder_resolves(tmp_path):
    (tmp_path / "iter_0000010").mkdir()
    (tmp_path / "latest").write_text("iter_0000010\n")
    assert read_latest_checkpoint(str(tmp_path)) == str(tmp_path / "iter_0000010")


@pytest.mark.parametrize("kind", ["binary", "fifo", "huge", "path", "long", "empty"])
def test_a_tracker_that_is_no_folder_name_is_refused(tmp_path, kind):
    tracker = tmp_path / "latest"
    if kind == "fifo":
        os.mkfifo(tracker)
    else:
        tracker.write_bytes({"binary": b"\x80\xff\x00", "huge": b"i" * (1 << 20), "path": b"../../etc\n",
                             "long": b"9" * 5000, "empty": b"\n"}[kind])
    with pytest.raises(FileNotFoundError) as info:
        read_latest_checkpoint(str(tmp_path))
    assert str(tracker) in str(info.value)
