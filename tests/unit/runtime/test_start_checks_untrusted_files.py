"""train.py's start checks (``train.py --check`` and train()) on files that lie: a spec.lock.toml
replaced by garbage, /dev/zero, a FIFO or 100,000 nested brackets is refused with exit 2 naming
it; an ``.idx`` whose document index or sequence lengths contradict the file is refused by
:func:`dlmspec.backends.megatron.data.check_indexed_dataset`; a checkpoint's dlmspec.json nested
100,000 deep is refused on resume, not a RecursionError."""

from __future__ import annotations

import importlib.util
import os
import struct
import threading
import warnings
from pathlib import Path

import pytest

from dlmspec.render.compile import compile_spec

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "specs" / "demo-dlm.toml"
MOCK = ["data.mock=true", "data.train=[]", "data.valid=[]", "data.tokenizer.type=\"NullTokenizer\"",
        "data.tokenizer.vocab_size=50256"]
VOCAB = 1000


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lock")
    compile_spec(DEMO, folder, force=True, overrides=MOCK)
    return folder


def _module(folder: Path):
    spec = importlib.util.spec_from_file_location(f"train_{id(folder)}", folder / "train.py")
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
    return module


def _start(module, monkeypatch):
    """train() of the compiled module with megatron-core's start forbidden (the checks come first)."""
    from dlmspec.backends.megatron import training

    def forbidden(*args, **kwargs):
        raise AssertionError("megatron-core was started")

    monkeypatch.setattr(training, "initialize_distributed", forbidden)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tc, model_kwargs, ddp, opt = module.build_configs()
    return training.train(module.build_run(), transformer_config=tc, layer_spec=module.build_layer(),
                          model_kwargs=model_kwargs, ddp_config=ddp, optimizer_config=opt, **module.PARALLEL_SIZES)


def _release_after(path: Path, seconds: float = 3.0) -> threading.Timer:
    def release() -> None:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    timer = threading.Timer(seconds, release)
    timer.start()
    return timer


@pytest.mark.parametrize("kind", ["garbage", "nul-bytes", "dev-zero", "fifo", "nested", "no-lock-table"])
def test_a_lock_that_is_no_lock_file_is_refused_with_exit_2(tmp_path, compiled, monkeypatch, capsys, kind) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("train.py", "spec.lock.toml"):
        (folder / name).write_bytes((compiled / name).read_bytes())
    lock = folder / "spec.lock.toml"
    lock.unlink()
    timer = None
    if kind == "garbage":
        lock.write_bytes(b"\x00garbage [[[ = = \xff\xfe")
    elif kind == "nul-bytes":
        lock.write_bytes(b"\x00" * 4096)
    elif kind == "dev-zero":
        lock.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(lock)
        timer = _release_after(lock)
    elif kind == "nested":
        lock.write_text("a = " + "[" * 100_000 + "]" * 100_000)
    else:
        lock.write_text('[model]\nnum_layers = 2\n')
    module = _module(folder)
    try:
        with pytest.raises(SystemExit) as exit_:
            _start(module, monkeypatch)
    finally:
        if timer is not None:
            timer.cancel()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: ") and str(lock) in err and "dlmspec compile" in err
    assert "Traceback" not in err


def test_read_spec_lock_keeps_a_missing_lock_a_warning(tmp_path) -> None:
    from dlmspec.backends.megatron.spec_record import read_spec_lock

    missing = read_spec_lock(str(tmp_path / "spec.lock.toml"), "sha256:" + "0" * 64)
    assert missing.error is None and any("not found" in w for w in missing.warnings)


def _forged(lengths, pointers=None, documents=None) -> bytes:
    if pointers is None:
        pointers, at = [], 0
        for n in lengths:
            pointers.append(at)
            at += 2 * n
    documents = list(range(len(lengths) + 1)) if documents is None else documents
    return (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), len(documents))
            + struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(pointers)}q", *pointers)
            + struct.pack(f"<{len(documents)}q", *documents))


FORGED = {
    "document index 10**6": (_forged([10, 20, 30], documents=[0, 10**6, 3]), "document_indices[1] is 1,000,000"),
    "negative document index": (_forged([10, 20, 30], documents=[0, -1, 3]), "document_indices[1] is -1"),
    "negative length": (_forged([10, -20, 30], pointers=[0, 20, 20]), "sequence_lengths[1] is -20"),
    "length 2**31-1": (_forged([10, 2**31 - 1, 30], pointers=[0, 20, 40]), "sequence_pointers[2]"),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_an_index_that_contradicts_itself_is_a_problem(tmp_path, case) -> None:
    from dlmspec.backends.megatron.data import check_indexed_dataset

    idx, named = FORGED[case]
    prefix = tmp_path / "d"
    (tmp_path / "d.idx").write_bytes(idx)
    (tmp_path / "d.bin").write_bytes(b"\x01\x00" * 60)
    problems = check_indexed_dataset(str(prefix), VOCAB).problems
    assert len(problems) == 1 and named in problems[0] and str(prefix) + ".idx" in problems[0]


def test_an_index_that_is_a_fifo_is_a_problem_not_a_hang(tmp_path) -> None:
    from dlmspec.backends.megatron.data import check_indexed_dataset

    os.mkfifo(tmp_path / "d.idx")
    (tmp_path / "d.bin").write_bytes(b"\x01\x00" * 60)
    timer = _release_after(tmp_path / "d.idx")
    try:
        problems = check_indexed_dataset(str(tmp_path / "d"), VOCAB).problems
    finally:
        timer.cancel()
    assert len(problems) == 1 and "FIFO" in problems[0]


def test_a_checkpoint_record_nested_100000_deep_refuses_the_resume(tmp_path) -> None:
    from dlmspec.backends.megatron import spec_record as sr

    ckpt = tmp_path / "iter_0000100"
    ckpt.mkdir()
    (ckpt / "dlmspec.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(sr.ResumeRefused, match="nests"):
        sr.check_resume(str(ckpt), {}, content_hash=None)
