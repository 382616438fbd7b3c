"""convert reads config.json and the other JSON of a checkpoint through dlmspec.files (a FIFO,
/dev/zero, 100,000 nested brackets: a ConversionError naming the file, never a hang or a
RecursionError), and the small files it writes into its temporary folder are created
exclusively (a link planted there is never written through)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from dlmspec.backends.convert import hf_io
from dlmspec.backends.convert._atomic import write_new
from dlmspec.backends.convert.errors import ConversionError


def _release_after(path: Path, seconds: float = 3.0) -> threading.Timer:
    def release() -> None:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    timer = threading.Timer(seconds, release)
    timer.start()
    return timer


@pytest.mark.parametrize("kind, why", [("nested", "nests"), ("fifo", "FIFO"), ("dev-zero", "character device"),
                                       ("huge-integer", "not valid JSON")])
def test_a_config_json_that_is_not_one_is_refused_by_name(tmp_path: Path, kind: str, why: str) -> None:
    config = tmp_path / "config.json"
    timer = None
    if kind == "nested":
        config.write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif kind == "fifo":
        os.mkfifo(config)
        timer = _release_after(config)
    elif kind == "dev-zero":
        config.symlink_to("/dev/zero")
    else:
        config.write_text('{"hidden_size": ' + "9" * 5000 + "}")
    try:
        with pytest.raises(ConversionError) as refused:
            hf_io.read_hf_config(tmp_path)
    finally:
        if timer is not None:
            timer.cancel()
    assert str(config) in str(refused.value) and why in str(refused.value)


def test_write_new_refuses_a_link_planted_at_its_name(tmp_path: Path) -> None:
    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    planted = tmp_path / "config.json"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_new(planted, "{}\n")
    assert victim.read_text() == "precious"
    write_new(tmp_path / "index.json", "{}\n")
    assert (tmp_path / "index.json").read_text() == "{}\n"
