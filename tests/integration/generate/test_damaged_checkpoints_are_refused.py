"""`dlmspec generate` / `dlmspec eval` on a damaged checkpoint (backends/generate/load.py): a missing,
truncated or zeroed ``.distcp`` shard, a truncated ``.metadata``, a ``latest`` tracker that is not
UTF-8, 10 MB long or a FIFO, a ``dlmspec.json`` whose ``spec`` is a list, nested 100,000 deep or a
FIFO, a ``spec.lock.toml`` that is garbage, a FIFO or a link to /dev/zero, a mask id of 10**30: each
ends in exit code 2 naming the file, why and a fix, in seconds, without a traceback."""

from __future__ import annotations

import json
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

from dlmspec.cli import main
from tiny_ckpt import tiny_runs  # noqa: F401 (a fixture)

from checkpoint_files_kit import (  # noqa: F401 (fixtures among them)
    linked_copy,
    replace,
)

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)


class Hung(BaseException):
    """The command ran past its deadline (not an ``OSError``, so no handler of the code under
    test takes it for a read error)."""


@contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the suite) when the block runs longer than ``seconds``: a FIFO
    opened for reading blocks until a writer comes."""
    def stop(signum, frame):
        raise Hung(f"still running after {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)






def _damage(case: str, run: Path, it: Path) -> str:
    """Damage the linked copy as ``case`` says; returns a piece of the file name the issue names."""
    shard = it / "__0_0.distcp"
    if case == "missing distcp":
        replace(shard)
        return str(it)
    if case == "truncated distcp":
        data = shard.read_bytes()
        replace(shard, data[: len(data) // 3])
        return str(it)
    if case == "zeroed distcp":
        replace(shard, bytes(shard.stat().st_size))
        return str(it)
    if case == "truncated metadata":
        data = (it / ".metadata").read_bytes()
        replace(it / ".metadata", data[:200])
        return str(it)
    if case == "latest not utf-8":
        (run / "checkpoints" / "latest").write_bytes(b"\xff\xfeiter_\x80\x81\n")
        return "latest"
    if case == "latest 10 MB":
        (run / "checkpoints" / "latest").write_bytes(b"iter_0000010" + b"x" * (10 << 20))
        return "latest"
    if case == "latest fifo":
        replace(run / "checkpoints" / "latest", fifo=True)
        return "latest"
    if case == "spec is a list":
        meta = json.loads((it / "dlmspec.json").read_text())
        meta["spec"] = [1]
        replace(it / "dlmspec.json", json.dumps(meta).encode())
        return str(it)
    if case == "record nested 100000 deep":
        replace(it / "dlmspec.json", b"[" * 100_000 + b"]" * 100_000)
        return "dlmspec.json"
    if case == "record fifo":
        replace(it / "dlmspec.json", fifo=True)
        return "dlmspec.json"
    if case == "record mask id 10**30":
        meta = json.loads((it / "dlmspec.json").read_text())
        meta["spec"]["record"]["objective.mask_token_id"] = 10**30
        replace(it / "dlmspec.json", json.dumps(meta).encode())
        return "dlmspec.json"
    if case == "lock garbage":
        replace(it / "spec.lock.toml", b"\x00\x01[[[ not = toml = at all\n")
        return "spec.lock.toml"
    if case == "lock fifo":
        replace(it / "spec.lock.toml", fifo=True)
        return "spec.lock.toml"
    if case == "lock linked to /dev/zero":
        replace(it / "spec.lock.toml", link="/dev/zero")
        return "spec.lock.toml"
    raise AssertionError(case)


CASES = {
    "missing distcp": "the weights cannot be read",
    "truncated distcp": "the weights cannot be read",
    "zeroed distcp": "the weights cannot be read",
    "truncated metadata": "the weights cannot be read",
    "latest not utf-8": "not UTF-8",
    "latest 10 MB": "larger than 4.0 KiB",
    "latest fifo": "FIFO",
    "spec is a list": "holds no spec record",
    "record nested 100000 deep": "nests arrays and objects more than",
    "record fifo": "FIFO",
    "record mask id 10**30": "objective.mask_token_id = 1000000000000000000000000000000 is not a token id",
    "lock garbage": "not valid TOML",
    "lock fifo": "FIFO",
    "lock linked to /dev/zero": "a character device",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_checkpoint_exits_2_naming_the_file_why_and_a_remedy(tiny_runs, tmp_path, capsys, case):
    run, it = linked_copy(tiny_runs["mdm"][0], tmp_path)
    named = _damage(case, run, it)
    capsys.readouterr()
    with deadline(120):
        code = main(["generate", str(run), "--prompt", "a", "--device", "cpu", "--json"])
    out = capsys.readouterr()
    assert code == 2, (case, out.out[-2000:], out.err[-3000:])
    (issue,) = json.loads(out.out)["issues"]
    assert issue["key"] == "RUN_OR_CHECKPOINT" and issue["rule"] == "generate-load", issue
    assert CASES[case] in issue["message"], (case, issue)
    assert named in str(issue["value"]) and issue["hint"], (case, issue)
    assert len(issue["message"]) < 1000, issue  # a 10 MB file is not copied into the message
    assert "Traceback" not in out.err
    if case == "latest 10 MB":  # the issue table on a terminal: drawn at once (a 10 MB cell took minutes)
        with deadline(60):
            code = main(["generate", str(run), "--prompt", "a", "--device", "cpu"])
        err = capsys.readouterr().err
        assert code == 2 and "latest" in err and len(err) < 5000, err[:2000]


@pytest.mark.parametrize("case", ["truncated distcp", "latest not utf-8", "lock garbage"])
def test_eval_refuses_a_damaged_checkpoint_as_generate_does(tiny_runs, tmp_path, capsys, case):
    run, it = linked_copy(tiny_runs["mdm"][0], tmp_path)
    _damage(case, run, it)
    choices = tmp_path / "mc.jsonl"
    choices.write_text('{"context": "The sky is", "choices": [" blue", " green"], "label": 0}\n')
    capsys.readouterr()
    with deadline(120):
        code = main(["eval", str(run), "--choices", str(choices), "--device", "cpu", "--json"])
    out = capsys.readouterr()
    assert code == 2, (case, out.err[-3000:])
    (issue,) = json.loads(out.out)["issues"]
    assert issue["key"] == "RUN_OR_CHECKPOINT" and CASES[case] in issue["message"] and issue["hint"], issue


def test_the_undamaged_linked_copy_loads(tiny_runs, tmp_path, capsys):
    """The fixture itself is sound: the same linked copy, undamaged, generates (exit 0)."""
    run, _ = linked_copy(tiny_runs["mdm"][0], tmp_path)
    capsys.readouterr()
    code = main(["generate", str(run), "--prompt", "a", "--device", "cpu", "--json", "--steps", "2",
                 "--gen-length", "4", "--block-length", "4"])
    assert code == 0, capsys.readouterr()


def test_the_load_error_list_takes_a_safe_unpicklers_refusal():
    """A refusal raised by a safe unpickler around the checkpoint reads (a ``ValueError`` or
    ``RuntimeError`` subclass, or ``pickle.UnpicklingError``) is among the errors mapped to exit 2."""
    import pickle

    from dlmspec.backends.generate.load import checkpoint_read_errors, describe_read_error

    class CheckpointRefused(pickle.UnpicklingError):
        pass

    class RefusedValue(ValueError):
        pass

    errors = checkpoint_read_errors()
    for exc in (CheckpointRefused("global torch.nn.Foo is not allowed"), RefusedValue("no"), EOFError("Ran out of input")):
        assert isinstance(exc, errors)
    assert describe_read_error(EOFError("Ran out of input")) == "EOFError: Ran out of input"


def test_a_read_error_is_described_without_the_ranks_traceback():
    """torch's CheckpointException carries each rank's traceback: the one-line description names
    the rank's error and never prints a traceback."""
    from torch.distributed.checkpoint.api import CheckpointException

    from dlmspec.backends.generate.load import describe_read_error

    try:
        raise ValueError("bad header")
    except ValueError as inner:
        import traceback

        exc = CheckpointException("read", {0: (inner, traceback.extract_tb(inner.__traceback__))})
    text = describe_read_error(exc)
    assert text.startswith("ValueError: bad header") and "Traceback" not in text, text
