"""`dlmspec convert` on bad input and on interruption.

Every broken checkpoint here gets exit code 2, no traceback, and a message naming the file and the
problem; an output that overlaps the input is refused; ``--force`` replaces only the files convert
writes; an interrupted conversion leaves no temporary folder, and a stale one left by a killed run
is removed (and said so) by the next run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from dlmspec.cli.commands import app  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    """A tiny Llama Hugging Face checkpoint and its megatron-core conversion (built once)."""
    from dlmspec.backends.convert import hf_to_mcore
    from dlmspec.backends.convert.tiny import make_tiny_hf

    root = tmp_path_factory.mktemp("pristine")
    hf, _ = make_tiny_hf("llama", root / "hf")
    hf_to_mcore(hf, root / "mcore")
    return {"hf": hf, "mcore": root / "mcore"}


@pytest.fixture()
def hf(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine["hf"], tmp_path / "hf"))


@pytest.fixture()
def mcore(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine["mcore"], tmp_path / "mcore"))


@contextmanager
def _deadline(seconds: int):
    """Fail (instead of hanging) when the body runs longer than ``seconds``."""
    def _expired(signum, frame):
        raise AssertionError(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _convert(*args: str):
    with _deadline(30):
        return CliRunner().invoke(app, ["convert", *map(str, args)])


def _refused(result, *needles: str) -> str:
    """Assert exit code 2, no traceback, and every needle in the message; return the message."""
    text = " ".join(result.output.split())
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    for needle in needles:
        assert needle in text, (needle, text)
    return text


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _edit_weights(folder: Path, fn) -> None:
    path = folder / "model.safetensors"
    state = load_file(str(path))
    fn(state)
    save_file(state, str(path), metadata={"format": "pt"})


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


# ------------------------------------------------------------------ 1. output overlapping the input
def test_force_refuses_an_output_equal_to_the_input(mcore):
    before = _tree(mcore)
    text = _refused(_convert("mcore-to-hf", mcore, mcore, "--force"), "DST", "SRC", str(mcore))
    assert "overwrite=" not in text
    assert _tree(mcore) == before


def test_force_refuses_an_output_that_contains_the_input(hf, tmp_path):
    before = _tree(tmp_path / "hf")
    _refused(_convert("hf-to-mcore", hf, tmp_path, "--force"), "DST", "SRC", "inside")
    assert _tree(tmp_path / "hf") == before


def test_refuses_an_output_inside_the_input(hf):
    before = _tree(hf)
    _refused(_convert("hf-to-mcore", hf, hf / "mcore"), "DST", "SRC", "inside")
    assert _tree(hf) == before


def test_force_refuses_an_output_that_is_a_link_to_the_input(mcore, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(mcore, target_is_directory=True)
    before = _tree(mcore)
    _refused(_convert("mcore-to-hf", mcore, link, "--force"), "DST", "SRC")
    assert _tree(mcore) == before


def test_force_refuses_a_run_root_holding_the_input(pristine, tmp_path):
    """``mcore-to-hf RUN/iter_N RUN --force`` would put the output over the run's checkpoints."""
    run = tmp_path / "run"
    shutil.copytree(pristine["mcore"], run / "iter_0000010")
    (run / "latest").write_text("iter_0000010\n")
    before = _tree(run)
    _refused(_convert("mcore-to-hf", run / "iter_0000010", run, "--force"), "DST", "SRC")
    assert _tree(run) == before


def test_existing_output_names_the_force_flag(mcore, tmp_path):
    (tmp_path / "out").mkdir()
    text = _refused(_convert("mcore-to-hf", mcore, tmp_path / "out"), "--force", str(tmp_path / "out"))
    assert "overwrite=" not in text


def test_force_keeps_files_convert_does_not_write(mcore, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("my notes\n")
    (out / "tokenizer.json").write_text("{}\n")
    (out / "extra").mkdir()
    (out / "extra" / "eval.txt").write_text("0.5\n")
    # what an earlier, sharded conversion left: convert's own files, replaced by this one
    (out / "model-00001-of-00002.safetensors").write_bytes(b"old")
    (out / "model-00002-of-00002.safetensors").write_bytes(b"old")
    (out / "model.safetensors.index.json").write_text("{}")
    (out / "config.json").write_text("{}")
    result = _convert("mcore-to-hf", mcore, out, "--force")
    assert result.exit_code == 0, result.output
    assert (out / "README.md").read_text() == "my notes\n"
    assert (out / "tokenizer.json").read_text() == "{}\n"
    assert (out / "extra" / "eval.txt").read_text() == "0.5\n"
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "config.json", "extra", "model.safetensors", "tokenizer.json"]
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    assert _temporaries(tmp_path) == []
    # the megatron-core side too: an unrelated file in a dist-checkpoint folder stays
    (mcore.parent / "again").mkdir()
    (mcore.parent / "again" / "NOTES").write_text("keep\n")
    result = _convert("hf-to-mcore", out, mcore.parent / "again", "--force")
    assert result.exit_code == 0, result.output
    assert (mcore.parent / "again" / "NOTES").read_text() == "keep\n"
    assert (mcore.parent / "again" / "metadata.json").is_file()
    result = _convert("mcore-to-hf", mcore.parent / "again", tmp_path / "back")
    assert result.exit_code == 0, result.output


# ------------------------------------------------------------------ 2. interrupted conversions
def test_sigterm_mid_write_removes_the_temporary_folder(tmp_path):
    """A process writing a checkpoint gets SIGTERM: it exits, and leaves no temporary folder."""
    from dlmspec.backends.convert._atomic import atomic_directory

    pid = os.fork()  # a real process to signal, without a second interpreter start-up
    if pid == 0:
        code = 0
        try:
            with atomic_directory(tmp_path / "out") as tmp:
                (tmp / "model.safetensors").write_bytes(b"x" * 1_000_000)
                os.kill(os.getpid(), signal.SIGTERM)
                signal.pause()  # not reached once SIGTERM interrupts the write
        except BaseException:
            code = 143
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) or os.WEXITSTATUS(status) == 143
    assert _temporaries(tmp_path) == []
    assert not (tmp_path / "out").exists()


def test_interrupt_during_the_write_exits_130_and_leaves_nothing(mcore, tmp_path, monkeypatch):
    from dlmspec.backends.convert import hf_io

    def interrupted(*args, **kwargs):
        Path(args[1]).write_bytes(b"half a shard")
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_io, "save_file", interrupted)
    result = _convert("mcore-to-hf", mcore, tmp_path / "out")
    assert result.exit_code == 130, result.output
    assert "Traceback" not in result.output and "interrupted" in result.output
    assert not (tmp_path / "out").exists()
    assert _temporaries(tmp_path) == []


def test_a_signal_during_megatron_save_waits_for_its_writers(hf, tmp_path, monkeypatch):
    """SIGTERM while megatron-core saves takes effect when the save returns (its forked writers
    are not killed mid-write); then the temporary folder is removed and the exit code is 143."""
    import time

    from megatron.core import dist_checkpointing

    real_save, finished = dist_checkpointing.save, []

    def save(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # Python runs a signal handler between these lines
        result = real_save(*args, **kwargs)
        finished.append(True)
        return result

    monkeypatch.setattr(dist_checkpointing, "save", save)
    result = _convert("hf-to-mcore", hf, tmp_path / "out")
    assert result.exit_code == 143, result.output
    assert finished == [True]
    assert not (tmp_path / "out").exists() and _temporaries(tmp_path) == []


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_of_dead_processes_are_removed_and_reported(mcore, tmp_path):
    host = socket.gethostname()
    dead = tmp_path / f".out.tmp-{_dead_pid()}@{host}.0123abcd"
    alive = tmp_path / f".out.tmp-{os.getpid()}@{host}.4567cdef"
    elsewhere = tmp_path / f".out.tmp-{_dead_pid()}@another-host.89abcdef"
    for folder in (dead, alive, elsewhere):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x" * 1000)
    result = _convert("mcore-to-hf", mcore, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert not dead.exists()
    assert alive.exists() and elsewhere.exists()  # owned by a running process / another machine
    lines = [line for line in result.output.splitlines() if "stale temporary" in line]
    assert len(lines) == 1 and dead.name in lines[0], result.output


# ------------------------------------------------------------------ 3. broken Hugging Face input
def _write_bytes(name: str, data) -> object:
    def edit(folder: Path) -> None:
        path = folder / name
        path.write_bytes(data(path.read_bytes()) if callable(data) else data)
    return edit


HF_BROKEN = {
    "empty safetensors": (_write_bytes("model.safetensors", b""), ["model.safetensors", "empty"]),
    "truncated safetensors": (_write_bytes("model.safetensors", lambda b: b[: len(b) // 2]),
                              ["model.safetensors", "truncated"]),
    "garbage safetensors": (_write_bytes("model.safetensors", b"\x00" * 100), ["model.safetensors", "safetensors"]),
    "config is a list": (lambda f: (f / "config.json").write_text("[1, 2]"), ["config.json", "JSON object", "list"]),
    "config is not JSON": (lambda f: (f / "config.json").write_text("{oops"), ["config.json", "JSON"]),
    "hidden_size a string": (lambda f: _edit_config(f, hidden_size="big"), ["config.json", "hidden_size", "'big'"]),
    "hidden_size null": (lambda f: _edit_config(f, hidden_size=None), ["config.json", "hidden_size", "None"]),
    "no heads": (lambda f: _edit_config(f, num_attention_heads=0), ["config.json", "num_attention_heads", "0"]),
    "layers a float": (lambda f: _edit_config(f, num_hidden_layers=1e9), ["config.json", "num_hidden_layers",
                                                                         "integer"]),
    "a billion layers": (lambda f: _edit_config(f, num_hidden_layers=10**9), ["config.json", "num_hidden_layers",
                                                                             "1000000000", "2 layers"]),
    "head_dim 0": (lambda f: _edit_config(f, head_dim=0), ["config.json", "head_dim", "0"]),
    "negative positions": (lambda f: _edit_config(f, max_position_embeddings=-5),
                           ["config.json", "max_position_embeddings", "-5"]),
    "heads not divisible": (lambda f: _edit_config(f, num_key_value_heads=3),
                            ["config.json", "num_key_value_heads", "num_attention_heads"]),
    "eps a string": (lambda f: _edit_config(f, rms_norm_eps="tiny"), ["config.json", "rms_norm_eps", "'tiny'"]),
    "int8 weights": (lambda f: _edit_weights(f, lambda s: s.__setitem__(
        "model.layers.0.mlp.up_proj.weight", s["model.layers.0.mlp.up_proj.weight"].to(torch.int8))),
        ["model.safetensors", "model.layers.0.mlp.up_proj.weight", "int8", "floating"]),
    "NaN weights": (lambda f: _edit_weights(f, lambda s: s["model.layers.1.mlp.up_proj.weight"].__setitem__(
        (3, 4), float("nan"))), ["model.safetensors", "model.layers.1.mlp.up_proj.weight", "NaN"]),
    "Inf weights": (lambda f: _edit_weights(f, lambda s: s["model.norm.weight"].__setitem__(0, float("inf"))),
                    ["model.safetensors", "model.norm.weight", "Inf"]),
    "index not JSON": (lambda f: (f / "model.safetensors.index.json").write_text("{oops"),
                       ["model.safetensors.index.json", "JSON"]),
    "index weight_map a list": (lambda f: (f / "model.safetensors.index.json").write_text('{"weight_map": []}'),
                                ["model.safetensors.index.json", "weight_map"]),
}


@pytest.mark.parametrize("case", list(HF_BROKEN))
def test_broken_hugging_face_checkpoint_is_refused(case, hf, tmp_path):
    edit, needles = HF_BROKEN[case]
    edit(hf)
    _refused(_convert("hf-to-mcore", hf, tmp_path / "out"), *needles)
    assert not (tmp_path / "out").exists()
    assert _temporaries(tmp_path) == []


@pytest.mark.parametrize("config, needles", [
    ({"model_type": "llada", "d_model": 64, "n_layers": 2, "vocab_size": 100}, ["config.json", "n_heads"]),
    ({"model_type": "llada", "d_model": 64, "n_heads": 0, "n_layers": 2, "vocab_size": 100},
     ["config.json", "n_heads", "0"]),
    ({"model_type": "Dream", "hidden_size": "x", "num_attention_heads": 4, "num_hidden_layers": 2,
      "intermediate_size": 96, "vocab_size": 100}, ["config.json", "hidden_size", "'x'"]),
])
def test_broken_remote_code_configs_are_refused(config, needles, tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    _refused(_convert("hf-to-mcore", tmp_path / "hf", tmp_path / "out"), *needles)


def test_config_that_is_a_list_is_refused_with_spec(hf, tmp_path):
    (hf / "config.json").write_text("[]")
    _refused(_convert("hf-to-mcore", hf, tmp_path / "out", "--spec", REPO / "specs" / "demo-ar.toml"),
             "config.json", "JSON object")


def test_verify_refuses_a_truncated_safetensors(hf, mcore):
    path = hf / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    _refused(_convert("verify", hf, mcore), "model.safetensors", "truncated")


# ------------------------------------------------------------------ 3. broken megatron-core input
def _edit_sidecar(fn):
    def edit(folder: Path) -> None:
        path = folder / "dlmspec_convert.json"
        path.write_text(json.dumps(fn(json.loads(path.read_text()))))
    return edit


def _dims(**changes):
    return _edit_sidecar(lambda s: {**s, "dims": {**s["dims"], **changes}})


MCORE_BROKEN = {
    "truncated distcp": (_write_bytes("__0_0.distcp", lambda b: b[:1000]), ["__0_0.distcp", "truncated"]),
    "empty distcp": (_write_bytes("__0_1.distcp", b""), ["__0_1.distcp", "truncated"]),
    "truncated .metadata": (_write_bytes(".metadata", lambda b: b[:100]), ["/.metadata"]),
    "corrupt common.pt": (_write_bytes("common.pt", lambda b: b[:100]), ["common.pt"]),
    "metadata.json not JSON": (lambda f: (f / "metadata.json").write_text("{oops"), ["metadata.json", "JSON"]),
    "sidecar not JSON": (lambda f: (f / "dlmspec_convert.json").write_text("{oops"),
                         ["dlmspec_convert.json", "JSON"]),
    "sidecar a list": (lambda f: (f / "dlmspec_convert.json").write_text("[]"),
                       ["dlmspec_convert.json", "JSON object"]),
    "sidecar without dims": (_edit_sidecar(lambda s: {k: v for k, v in s.items() if k != "dims"}),
                             ["dlmspec_convert.json", "dims"]),
    "sidecar dims a list": (_edit_sidecar(lambda s: {**s, "dims": [1]}), ["dlmspec_convert.json", "dims"]),
    "hidden_size a string": (_dims(hidden_size="big"), ["dlmspec_convert.json", "hidden_size", "'big'"]),
    "a billion layers": (_dims(num_layers=10**9), ["dlmspec_convert.json", "num_layers", "1000000000"]),
    "a billion wide": (_dims(hidden_size=10**9), ["dlmspec_convert.json", "1000000000"]),
    "hf_config a list": (_edit_sidecar(lambda s: {**s, "hf_config": [1]}), ["dlmspec_convert.json", "hf_config"]),
}


@pytest.mark.parametrize("case", list(MCORE_BROKEN))
def test_broken_megatron_checkpoint_is_refused(case, mcore, tmp_path):
    edit, needles = MCORE_BROKEN[case]
    edit(mcore)
    _refused(_convert("mcore-to-hf", mcore, tmp_path / "out"), *needles)
    assert not (tmp_path / "out").exists()
    assert _temporaries(tmp_path) == []


def test_garbage_iteration_tracker_is_refused(pristine, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(pristine["mcore"], run / "iter_0000010")
    (run / "latest_checkpointed_iteration.txt").write_text("ten\n")
    _refused(_convert("mcore-to-hf", run, tmp_path / "out"), "latest_checkpointed_iteration.txt", "'ten'")


@pytest.mark.parametrize("poison, needles", [
    (lambda t: t.view(-1).__setitem__(0, float("nan")), ["NaN"]),
    (lambda t: t.to(torch.int8), ["int8", "floating"]),
])
def test_megatron_checkpoint_with_bad_values_is_refused(poison, needles, pristine, tmp_path):
    from dlmspec.backends.convert import mcore_io, state_dict
    from dlmspec.backends.convert.hf_io import SafetensorsReader

    dims = mcore_io.load_mcore_checkpoint(pristine["mcore"])[1]
    state = state_dict.hf_to_mcore_state_dict(dict(SafetensorsReader(pristine["hf"]).items()), dims)
    name = "decoder.final_layernorm.weight"  # not stacked: one layer's dtype may differ from another's
    tensor = state[name].clone()
    poisoned = poison(tensor)
    state[name] = tensor if poisoned is None else poisoned
    mcore_io.save_mcore_checkpoint(tmp_path / "bad", state, dims)
    _refused(_convert("mcore-to-hf", tmp_path / "bad", tmp_path / "out"), "final_layernorm.weight", *needles)
    assert not (tmp_path / "out").exists()
