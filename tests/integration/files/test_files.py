"""dlmspec.files: the one reader of untrusted files (regular files only, byte, line and nesting
caps, :class:`FileRefused` naming the file, why and a fix) and the atomic writer that never writes
through a link."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from dlmspec import files
from dlmspec.files import FileRefused


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _unblock(path: Path) -> threading.Timer:
    """If a reader ever blocks on the FIFO ``path``, open its write end after a second so the
    test fails instead of hanging."""
    def release() -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass

    timer = threading.Timer(1.0, release)
    timer.start()
    return timer


@pytest.mark.parametrize("reader", [files.read_bytes, files.read_text, files.read_json, files.read_toml,
                                    lambda p: list(files.iter_lines(p))])
def test_every_reader_refuses_a_fifo_without_blocking(tmp_path: Path, reader) -> None:
    fifo = _fifo(tmp_path / "record.json")
    timer = _unblock(fifo)
    try:
        with pytest.raises(FileRefused) as refused:
            reader(fifo)
    finally:
        timer.cancel()
    assert refused.value.path == str(fifo) and "FIFO" in refused.value.why and refused.value.hint


@pytest.mark.parametrize("reader", [files.read_bytes, files.read_json, files.read_toml,
                                    lambda p: list(files.iter_lines(p))])
def test_dev_zero_and_a_link_to_it_are_refused_unread(tmp_path: Path, reader) -> None:
    link = tmp_path / "metrics.jsonl"
    link.symlink_to("/dev/zero")
    for path in ("/dev/zero", link):
        with pytest.raises(FileRefused, match="character device, not a regular file"):
            reader(path)


def test_a_file_past_the_byte_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b"[" + b"0," * 600 + b"0]")
    with pytest.raises(FileRefused, match="larger than 1.0 KiB"):
        files.read_json(path, limit=1024)
    assert len(files.read_json(path, limit=4096)) == 601


@pytest.mark.parametrize("reader, text", [
    (files.read_json, "[" * 100_000 + "]" * 100_000),
    (files.read_json, '{"a": ' * 100_000 + "1" + "}" * 100_000),
    (files.read_toml, "a = " + "[" * 100_000 + "]" * 100_000),
    (files.read_toml, "a = " + "{b = " * 100_000 + "1" + "}" * 100_000),
])
def test_nesting_of_100000_levels_is_refused_before_parsing(tmp_path: Path, reader, text: str) -> None:
    path = tmp_path / "deep"
    path.write_text(text)
    with pytest.raises(FileRefused, match="nests arrays and (objects|tables) more than 64 levels"):
        reader(path)


def test_brackets_inside_strings_do_not_count_as_nesting(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"text": "[" * 1000, "escaped": "\\\"[[[["}))
    assert files.read_json(path)["text"] == "[" * 1000


def test_a_huge_line_is_refused_without_holding_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"ok": 1}\n')
        f.write(b"x" * (3 << 20) + b"\n")
    lines = files.iter_lines(path, max_line_bytes=1 << 20)
    assert next(lines) == (1, b'{"ok": 1}')
    with pytest.raises(FileRefused, match="line 2 of the file is longer than 1.0 MiB"):
        next(lines)


def test_a_line_of_exactly_the_cap_is_read(tmp_path: Path) -> None:
    path = tmp_path / "lines"
    path.write_bytes(b"a" * 100 + b"\n" + b"b" * 100)
    assert [n for n, _ in files.iter_lines(path, max_line_bytes=100)] == [1, 2]


def test_non_utf8_is_refused_with_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"a": "caf\xe9"}')
    with pytest.raises(FileRefused, match=r"not UTF-8 text \(byte 10\)"):
        files.read_json(path)
    with pytest.raises(FileRefused, match="not UTF-8"):
        files.loads_json(b'"\xff"')


def test_json_with_a_5000_digit_integer_is_refused_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "n.json"
    path.write_text('{"iteration": ' + "9" * 5000 + "}")
    with pytest.raises(FileRefused, match="not valid JSON"):
        files.read_json(path)


def test_missing_file_and_folder_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(FileRefused, match="does not exist"):
        files.read_text(tmp_path / "nope")
    with pytest.raises(FileRefused, match="directory"):
        files.read_text(tmp_path)


def test_the_refusal_is_one_line_with_the_file_why_and_remedy(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "p")
    with pytest.raises(FileRefused) as refused:
        files.read_json(fifo, what="dataset record")
    text = str(refused.value)
    assert text.startswith(f"{fifo}: the dataset record is a FIFO") and ". Fix: " in text and "\n" not in text


# ------------------------------------------------------------------------------------------
# writing


def test_write_atomic_replaces_a_link_at_the_target_and_leaves_its_target_alone(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out.json"
    out.symlink_to(victim)
    files.write_atomic(out, "new\n")
    assert victim.read_text() == "precious"
    assert not out.is_symlink() and out.read_text() == "new\n"


def test_write_atomic_never_writes_through_a_link_at_the_temporary_name(tmp_path: Path, monkeypatch) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out.json"

    class FixedUuid:
        hex = "0123456789abcdef" * 2

    monkeypatch.setattr(files.uuid, "uuid4", lambda: FixedUuid())
    planted = tmp_path / ".out.json.tmp-0123456789ab"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        files.write_atomic(out, "new\n")
    assert victim.read_text() == "precious" and not out.exists()
    assert planted.is_symlink()  # the planted link is not ours to remove


def test_write_atomic_replaces_an_existing_file_whole(tmp_path: Path) -> None:
    out = tmp_path / "record.json"
    out.write_text("old contents that are longer than the new ones\n")
    inode = out.stat().st_ino
    files.write_atomic(out, b"new\n", mode=0o640)
    assert out.read_bytes() == b"new\n" and out.stat().st_ino != inode
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "plot.png"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with files.atomic_writer(out) as handle:
            handle.write(b"half")
            raise RuntimeError("disk full")
    assert out.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["plot.png"]


def test_create_exclusive_refuses_a_file_or_link_already_there(tmp_path: Path) -> None:
    link = tmp_path / "x"
    link.symlink_to(tmp_path / "target")
    with pytest.raises(FileExistsError):
        files.create_exclusive(link)
    assert not (tmp_path / "target").exists()


def test_a_large_cap_reserves_no_memory_for_a_small_file(tmp_path):
    """read_bytes with a 1 GiB cap reads a small file in a process limited to 256 MiB of address
    space beyond its start (a single read(limit + 1) would reserve the whole cap first)."""
    import subprocess
    import sys

    small = tmp_path / "small.json"
    small.write_text('{"a": 1}')
    code = (
        "import resource, sys\n"
        "from dlmspec import files\n"
        "with open('/proc/self/status') as f:\n"
        "    vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith('VmSize'))\n"
        "resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), vm + (256 << 20)))\n"
        f"print(files.read_json({str(small)!r}, limit=1 << 30))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "{'a': 1}" in done.stdout, done.stderr[-2000:]


def _nesting_by_characters(text: str, depth: int, *, toml: bool = False) -> bool:
    """The character-by-character definition of :func:`dlmspec.files.nesting_exceeds`."""
    level, quote, escaped = 0, "", False
    for char in text:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\" and quote == '"':
                escaped = True
            elif char == quote:
                quote = ""
            continue
        if char == '"' or (toml and char == "'"):
            quote = char
        elif char in "[{":
            level += 1
            if level > depth:
                return True
        elif char in "]}":
            level = max(0, level - 1)
    return False


def test_nesting_check_agrees_with_its_character_by_character_definition():
    import random

    from dlmspec.files import nesting_exceeds

    rng = random.Random(0)
    alphabet = "[]{}\"'\\ab\n"
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 16)))
        depth, toml = rng.randint(0, 4), rng.random() < 0.5
        assert nesting_exceeds(text, depth, toml=toml) == _nesting_by_characters(text, depth, toml=toml), (text, depth, toml)
