"""`dlmspec data prepare --workers N` forks its workers with the stop signals blocked: a SIGTERM
that reaches a worker before its initializer has run takes the default action there, instead of
running the parent's handler (which raised ``PrepareInterrupted`` in a copy of the parent's stack:
under pytest-xdist that copy ended the whole test session, and in a real run it removed the
parent's temporary files)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork and POSIX signals")

_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path
    from dlmspec.data.prepare import prepare

    tmp = Path(sys.argv[1])
    flag = tmp / "signalled"

    def after_in_child():
        # The first worker sends itself SIGTERM right after the fork, before its initializer.
        try:
            fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        os.write(fd, " ".join(sorted(signal.Signals(s).name for s in blocked)).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGTERM)

    os.register_at_fork(after_in_child=after_in_child)
    src = tmp / "ids.jsonl"
    src.write_text("".join(json.dumps({"text": "1 2 3"}) + "\\n" for _ in range(50)))
    parent = os.getpid()
    result = prepare(src, tmp / "out", workers=2, tokenizer_type="NullTokenizer", vocab_size=10)
    print("done", os.getpid() == parent, result.documents, flush=True)
    print("mask now", sorted(signal.Signals(s).name for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    """
)


def test_a_worker_signalled_before_its_initializer_never_runs_the_parent_handler(tmp_path):
    result = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path)], capture_output=True, text=True,
                            timeout=120, start_new_session=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "PrepareInterrupted" not in result.stderr, result.stderr[-2000:]
    # One process finished the run (the parent), with every document; the signalled worker died
    # of the signal and the pool replaced it.
    assert result.stdout.splitlines()[0] == "done True 50", result.stdout
    # The worker held the stop signals blocked from the fork on; the parent's mask is as before.
    blocked = (tmp_path / "signalled").read_text().split()
    assert {"SIGINT", "SIGTERM", "SIGHUP"} <= set(blocked), blocked
    assert result.stdout.splitlines()[1] == "mask now []", result.stdout
    assert (tmp_path / "out_text_document.bin").is_file()
    assert not list(tmp_path.glob("*tmp-*"))
