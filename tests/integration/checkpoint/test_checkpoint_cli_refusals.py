"""The commands that open checkpoints (``dlmspec generate``, ``dlmspec eval``, ``dlmspec convert
mcore-to-hf``, ``dlmspec convert verify``) refuse a checkpoint whose ``.metadata``, stored byte
object or ``common.pt`` holds a pickle payload: exit code 2 naming the file and the refused
global, no traceback, and the payload's canary file is never created."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")


from hostile import (  # noqa: E402
    ExecPayload,
    SystemPayload,
    payloads,
    plant_byte_object,
    torch_saved,
    write_common_payload,
    write_metadata_payload,
)

from dlmspec.cli import main  # noqa: E402

pytestmark = pytest.mark.shared_data  # the tiny run's GPT-2 tokenizer (tests/kits/shared_kit.py)

#: name -> (how the checkpoint folder is made hostile, the file named, the global named)
HOSTILE = {
    "index-os.system": ("metadata", "os.system", ".metadata", "('posix', 'system')"),
    "index-exec": ("metadata", "exec", ".metadata", "('builtins', 'exec')"),
    "index-dotted-name": ("metadata", "dotted-name", ".metadata",
                          "('torch.distributed.checkpoint.filesystem', 'os.system')"),
    "stored-object": ("distcp", None, ".distcp", "('posix', 'system')"),
    "stored-object-exec": ("distcp-exec", None, ".distcp", "('builtins', 'exec')"),
    "common.pt": ("common", None, "common.pt", "('posix', 'system')"),
}


def make_hostile(ckpt: Path, kind: str, canary: Path) -> None:
    how, payload, _, _ = HOSTILE[kind]
    if how == "metadata":
        write_metadata_payload(ckpt, payloads(canary)[payload])
    elif how.startswith("distcp"):
        from dlmspec.backends import checkpoint_safety as cs

        obj = ExecPayload(canary) if how == "distcp-exec" else SystemPayload(canary)
        byte_keys = [k for k, v in cs.read_metadata(ckpt).state_dict_metadata.items()
                     if type(v).__name__ == "BytesStorageMetadata"]
        plant_byte_object(ckpt, next((k for k in byte_keys if k.startswith("rng_state")), "planted_object"),
                          torch_saved(obj))
    else:
        write_common_payload(ckpt, canary)


def assert_refused(code: int, output: str, kind: str, canary: Path) -> None:
    _, _, file_part, global_part = HOSTILE[kind]
    assert code == 2, output
    assert "Traceback" not in output, output
    assert file_part in output and global_part in output, output
    assert not canary.exists()


@pytest.fixture(scope="module")
def runtime_run(tmp_path_factory):
    """A tiny runtime run (``run/checkpoints/iter_0000010`` + ``latest``) and a dataset for eval."""
    from cpu_world_kit import megatron_cpu_world
    from tiny_ckpt import TEXTS, write_dataset, write_runtime_checkpoint

    root = tmp_path_factory.mktemp("runtime")
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        iter_dir = write_runtime_checkpoint(root / "run", "mdm")
    data = write_dataset(root / "valid_text_document", TEXTS)
    return root / "run", iter_dir.relative_to(root / "run"), data


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny Hugging Face Qwen3 folder and its ``dlmspec convert hf-to-mcore`` output."""
    from dlmspec.backends.convert.tiny import make_tiny_hf

    root = tmp_path_factory.mktemp("convert")
    hf, _ = make_tiny_hf("qwen3", root / "hf", seed=3)
    assert main(["convert", "hf-to-mcore", str(hf), str(root / "mcore")]) == 0
    return hf, root / "mcore"


def _mcore_dir(mcore: Path) -> Path:
    """The folder holding ``.metadata`` (the convert output or its one ``iter_*`` folder)."""
    return next(p.parent for p in sorted(mcore.rglob(".metadata")))


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_generate_refuses_a_hostile_runtime_checkpoint_with_exit_2(runtime_run, kind, tmp_path, capsys) -> None:
    run, iter_rel, _ = runtime_run
    shutil.copytree(run, tmp_path / "run")
    canary = tmp_path / "canary"
    make_hostile(tmp_path / "run" / iter_rel, kind, canary)
    capsys.readouterr()
    code = main(["generate", str(tmp_path / "run"), "--prompt", "The", "--device", "cpu", "--json"])
    out = capsys.readouterr()
    assert_refused(code, out.out + out.err, kind, canary)


@pytest.mark.parametrize("kind", ["index-os.system", "stored-object", "common.pt"])
def test_eval_refuses_a_hostile_runtime_checkpoint_with_exit_2(runtime_run, kind, tmp_path, capsys) -> None:
    run, iter_rel, data = runtime_run
    shutil.copytree(run, tmp_path / "run")
    canary = tmp_path / "canary"
    make_hostile(tmp_path / "run" / iter_rel, kind, canary)
    capsys.readouterr()
    code = main(["eval", str(tmp_path / "run"), "--data", str(data), "--device", "cpu", "--json"])
    out = capsys.readouterr()
    assert_refused(code, out.out + out.err, kind, canary)


def test_generate_still_loads_the_untouched_runtime_checkpoint(runtime_run, capsys) -> None:
    run, _, _ = runtime_run
    capsys.readouterr()
    code = main(["generate", str(run), "--prompt", "The", "--device", "cpu", "--json", "--gen-length", "8",
                 "--steps", "4", "--block-length", "8"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert json.loads(out.out[out.out.index("{"):])


@pytest.mark.parametrize("command", ["mcore-to-hf", "verify"])
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_convert_refuses_a_hostile_megatron_checkpoint_with_exit_2(converted, command, kind, tmp_path,
                                                                   capsys) -> None:
    hf, mcore = converted
    shutil.copytree(mcore, tmp_path / "mcore")
    canary = tmp_path / "canary"
    make_hostile(_mcore_dir(tmp_path / "mcore"), kind, canary)
    args = ([str(tmp_path / "mcore"), str(tmp_path / "out")] if command == "mcore-to-hf"
            else [str(hf), str(tmp_path / "mcore")])
    capsys.readouterr()
    code = main(["convert", command, *args])
    out = capsys.readouterr()
    assert_refused(code, out.out + out.err, kind, canary)
    assert not (tmp_path / "out").exists()


def test_convert_still_reads_the_untouched_megatron_checkpoint(converted, tmp_path, capsys) -> None:
    hf, mcore = converted
    assert main(["convert", "verify", str(hf), str(mcore)]) == 0
    assert main(["convert", "mcore-to-hf", str(mcore), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "config.json").is_file()
