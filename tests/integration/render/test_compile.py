"""Tests of ``dlmspec compile`` without megatron-core: deterministic output, the output
directory rules, refused runtime gaps, the lock file, quoting, the shell scripts and the CLI.

The megatron-core side (keywords, executing ``build_configs()``) is in
``tests/unit/render/test_compile_megatron.py``.
"""

from __future__ import annotations

import ast
import json
import os
import py_compile
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from dlmspec.check import RULES
from dlmspec.cli import main as cli_main
from dlmspec.render.compile import (
    GENERATED_FILES,
    compile_spec,
    content_hash,
    py_literal,
    render,
    write_outputs,
)
from dlmspec.errors import SpecError
from dlmspec.spec.load import load
from dlmspec.resolve import eod_choice, resolve
from spec_kit import spec_file

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "specs" / "demo-dlm.toml"

#: A small valid spec: 8 GPUs, data parallel 8, vocab 1000 (padded 1024, [MASK] 1000), NullTokenizer:
#: what it changes in spec_kit.DEFAULT (``spec_file(tmp_path, SMALL, changes)`` writes it with ``changes``).
SMALL: dict[str, Any] = {
    "data": {"tokenizer": {"type": "NullTokenizer", "vocab_size": 999}, "train": ["data/x_text_document"]},
    "logging": {"tensorboard_dir": "runs/t/tensorboard"},
}


def read_all(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# ------------------------------------------------------------------------------------------
# Determinism


def test_two_compiles_are_byte_identical(tmp_path: Path) -> None:
    a = compile_spec(DEMO, tmp_path / "a")
    b = compile_spec(DEMO, tmp_path / "b")
    first, second = read_all(tmp_path / "a"), read_all(tmp_path / "b")
    assert first == second
    assert a.content_hash == b.content_hash
    assert {"train.py", "launch.sh", "launch.sbatch", "spec.lock.toml"} <= set(first)


def test_output_does_not_depend_on_the_process(tmp_path: Path) -> None:
    """Two processes with different hash seeds (set and dict order of str keys) and working
    directories write the same bytes."""
    for seed, name in (("1", "a"), ("2", "b")):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        run = subprocess.run([sys.executable, "-m", "dlmspec.cli", "compile", str(DEMO), "-o", str(tmp_path / name)],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
        assert run.returncode == 0, run.stderr
    assert read_all(tmp_path / "a") == read_all(tmp_path / "b")


def test_compile_with_force_over_itself_changes_nothing(tmp_path: Path) -> None:
    compile_spec(DEMO, tmp_path / "a")
    before = read_all(tmp_path / "a")
    compile_spec(DEMO, tmp_path / "a", force=True)
    assert read_all(tmp_path / "a") == before


def test_scripts_are_executable_and_the_rest_not(tmp_path: Path) -> None:
    compile_spec(DEMO, tmp_path / "a")
    for path in (tmp_path / "a").iterdir():
        executable = bool(path.stat().st_mode & 0o111)
        assert executable == (path.name in ("launch.sh", "launch.sbatch")), path.name


def test_a_new_output_directory_gets_the_usual_mode(tmp_path: Path) -> None:
    """The set is written into a temporary directory (mode 0700) that becomes the output."""
    umask = os.umask(0o022)
    os.umask(umask)
    compile_spec(DEMO, tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o777 & ~umask


def test_content_hash_ignores_how_a_value_is_written(tmp_path: Path) -> None:
    """Writing a default explicitly, or the value resolve() derives, is the same run."""
    plain = resolve(load(spec_file(tmp_path, SMALL)).spec)
    explicit = resolve(load(spec_file(tmp_path, SMALL, {"model.num_query_groups": 4, "model.kv_channels": 32,
                                                 "parallel.tensor_model_parallel_size": 1,
                                                 "objective.mask_token_id": 1000}, file_name="b.toml")).spec)
    changed = resolve(load(spec_file(tmp_path, SMALL, {"train.lr": 1e-3}, file_name="c.toml")).spec)
    assert content_hash(plain) == content_hash(explicit)
    assert content_hash(plain) != content_hash(changed)


def test_lock_file_compiles_to_the_same_run(tmp_path: Path) -> None:
    first = compile_spec(DEMO, tmp_path / "a")
    lock = tmp_path / "a" / "spec.lock.toml"
    second = compile_spec(lock, tmp_path / "b")
    assert second.content_hash == first.content_hash
    a, b = read_all(tmp_path / "a"), read_all(tmp_path / "b")
    assert a["spec.lock.toml"] == b["spec.lock.toml"]
    # Only the header line naming the spec file differs.
    lines_a = a["train.py"].decode().splitlines()
    lines_b = b["train.py"].decode().splitlines()
    assert lines_a[1:] == lines_b[1:]
    assert "specs/demo-dlm.toml" in lines_a[0] and "spec.lock.toml" in lines_b[0]


def test_lock_table_holds_hash_version_and_derived_values(tmp_path: Path) -> None:
    result = compile_spec(DEMO, tmp_path / "a")
    data = tomllib.loads((tmp_path / "a" / "spec.lock.toml").read_text())
    lock = data["lock"]
    assert lock["content_hash"] == result.content_hash
    assert lock["content_hash"].startswith("sha256:") and len(lock["content_hash"]) == 7 + 64
    assert lock["dlmspec_version"]
    derived = lock["derived"]
    assert derived["padded_vocab_size"] == 50304
    assert derived["eod_id"] == 50256
    assert derived["data_parallel_size"] == 1
    # Every default is written: keys the demo spec leaves out are present.
    assert data["model"]["num_query_groups"] == 4 and data["model"]["kv_channels"] == 64
    assert data["objective"]["mask_token_id"] == 50257
    assert data["logging"]["run_dir"] == "runs/demo-dlm"
    assert data["checkpoint"]["load"] == "runs/demo-dlm/checkpoints"


# ------------------------------------------------------------------------------------------
# The output directory


def test_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SpecError) as info:
        compile_spec(DEMO, out)
    issue = info.value.issues[0]
    assert issue.key == "--output" and "not empty" in issue.message and "--force" in issue.hint
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_force_replaces_generated_files_and_keeps_the_users(tmp_path: Path) -> None:
    out = tmp_path / "out"
    compile_spec(spec_file(tmp_path, SMALL, {"train.lr": 1e-3}), out)  # an earlier compile
    (out / "notes.txt").write_text("mine")
    compile_spec(DEMO, out, force=True)
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "train.py").read_text().startswith("# Generated by dlmspec") and "demo-dlm" in (out / "train.py").read_text()
    assert sorted(p.name for p in out.iterdir()) == sorted([*GENERATED_FILES, "notes.txt"])


def test_force_removes_a_generated_name_this_compile_does_not_produce(tmp_path: Path) -> None:
    out = tmp_path / "out"
    compile_spec(DEMO, out)
    (out / "notes.txt").write_text("mine")
    write_outputs({"train.py": "# Generated by dlmspec\nx = 1\n"}, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "train.py"]
    # A file of a generated name that dlmspec did not write is not its to remove.
    (out / "plan.json").write_text("{}")
    write_outputs({"train.py": "# Generated by dlmspec\nx = 2\n"}, out, force=True)
    assert (out / "plan.json").read_text() == "{}"


@pytest.mark.parametrize("name", ["train.py", "launch.sh", "launch.sbatch", "spec.lock.toml", "plan.json"])
def test_force_never_replaces_a_file_dlmspec_did_not_write(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("my own work\n")
    with pytest.raises(SpecError) as info:
        compile_spec(DEMO, out, force=True)
    (issue,) = info.value.issues
    assert issue.key == "--output" and name in issue.message and "not written by dlmspec" in issue.message
    assert "move" in issue.hint
    assert [p.name for p in out.iterdir()] == [name] and (out / name).read_text() == "my own work\n"


def test_force_accepts_a_generated_file_the_user_edited(tmp_path: Path) -> None:
    """The header says: do not edit, compile again. An edit below it is replaced."""
    out = tmp_path / "out"
    compile_spec(DEMO, out)
    train = out / "train.py"
    train.write_text(train.read_text() + "\n# my edit\n")
    compile_spec(DEMO, out, force=True)
    assert "# my edit" not in train.read_text()


@pytest.mark.parametrize("dangling", [False, True])
def test_force_never_writes_through_a_link(tmp_path: Path, dangling: bool) -> None:
    out = tmp_path / "out"
    compile_spec(DEMO, out)
    elsewhere = tmp_path / "elsewhere.py"
    if not dangling:
        elsewhere.write_text("precious\n")
    (out / "train.py").unlink()
    (out / "train.py").symlink_to(elsewhere)
    with pytest.raises(SpecError) as info:
        compile_spec(DEMO, out, force=True)
    (issue,) = info.value.issues
    assert issue.key == "--output" and "train.py" in issue.message and "link" in issue.message
    assert (out / "train.py").is_symlink()
    assert elsewhere.read_text() == "precious\n" if not dangling else not elsewhere.exists()


def test_refuses_an_output_directory_that_is_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(SpecError) as info:
        compile_spec(DEMO, link)
    (issue,) = info.value.issues
    assert issue.key == "--output" and "link" in issue.message and str(real) in issue.hint
    assert not list(real.iterdir())


def test_cli_force_over_a_hand_written_file_exits_2_naming_the_flag(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.py").write_text("print('mine')\n")
    assert cli_main(["compile", str(DEMO), "-o", str(out), "--force"]) == 2
    err = capsys.readouterr().err
    assert "--output" in err and "train.py" in err and "Traceback" not in err
    assert (out / "train.py").read_text() == "print('mine')\n"


def test_refuses_a_file_as_output_and_a_directory_in_place_of_a_generated_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(SpecError, match="not a directory"):
        compile_spec(DEMO, target)
    out = tmp_path / "out"
    (out / "train.py").mkdir(parents=True)
    with pytest.raises(SpecError, match="is a directory"):
        compile_spec(DEMO, out, force=True)


@pytest.mark.parametrize("existing", [True, False], ids=["over-an-earlier-compile", "into-a-new-directory"])
def test_a_full_disk_mid_write_leaves_the_old_file_set(tmp_path: Path, existing: bool) -> None:
    """The two largest files cannot be written (RLIMIT_FSIZE in a subprocess: the write fails
    with EFBIG, as it would with ENOSPC on a full disk): the directory keeps the previous
    compile's files, byte for byte (or is not created), and no temporary file or directory is
    left anywhere."""
    import resource
    import signal

    out = tmp_path / "out"
    if existing:
        compile_spec(spec_file(tmp_path, SMALL, {"train.lr": 1e-3}, file_name="old.toml"), out)
        (out / "notes.txt").write_text("mine")
    before = read_all(out) if existing else None
    new_spec = spec_file(tmp_path, SMALL, {"train.lr": 2e-3}, file_name="new.toml")
    sizes = sorted(len(t.encode()) for t in render(resolve(load(new_spec).spec), str(new_spec)).values())
    limit = sizes[-2] - 1

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run([sys.executable, "-m", "dlmspec.cli", "compile", str(new_spec), "-o", str(out), "--force"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, preexec_fn=limited, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--output" in run.stderr and "Traceback" not in run.stderr
    if existing:
        assert read_all(out) == before
    else:
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["new.toml", "old.toml", "out"] if existing
                                                                else ["new.toml"])


def _fail_on_call(monkeypatch: pytest.MonkeyPatch, owner: Any, attr: str, call: int, err: int) -> None:
    """Make ``owner.attr`` raise OSError(err) on its ``call``-th call (counting from 1)."""
    real, calls = getattr(owner, attr), []

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == call:
            raise OSError(err, os.strerror(err))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, failing)


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".dlmspec-compile-" in p.name or p.name.endswith(".tmp")]


def test_no_space_on_the_third_file_keeps_the_old_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from dlmspec.render import compile as compile_module

    out = tmp_path / "out"
    compile_spec(spec_file(tmp_path, SMALL, {"train.lr": 1e-3}, file_name="old.toml"), out)
    (out / "notes.txt").write_text("mine")
    before = read_all(out)
    _fail_on_call(monkeypatch, compile_module, "_write_file", 3, errno.ENOSPC)
    with pytest.raises(SpecError) as info:
        compile_spec(spec_file(tmp_path, SMALL, {"train.lr": 2e-3}, file_name="new.toml"), out, force=True)
    (issue,) = info.value.issues
    assert issue.key == "--output" and "No space left on device" in issue.message and "nothing was changed" in issue.message
    assert read_all(out) == before and not _leftovers(tmp_path)
    monkeypatch.undo()
    compile_spec(tmp_path / "new.toml", out, force=True)  # and the next compile goes through
    assert "lr=0.002," in (out / "train.py").read_text() and not _leftovers(tmp_path)


@pytest.mark.parametrize("call", [2, 5, 9])
def test_a_rename_that_fails_puts_the_old_files_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: int) -> None:
    import errno

    out = tmp_path / "out"
    compile_spec(spec_file(tmp_path, SMALL, {"train.lr": 1e-3}, file_name="old.toml"), out)
    before = read_all(out)
    _fail_on_call(monkeypatch, os, "rename", call, errno.EIO)
    with pytest.raises(SpecError):
        compile_spec(spec_file(tmp_path, SMALL, {"train.lr": 2e-3}, file_name="new.toml"), out, force=True)
    monkeypatch.undo()
    assert read_all(out) == before and not _leftovers(tmp_path)


def test_invalid_spec_writes_nothing(tmp_path: Path) -> None:
    path = spec_file(tmp_path, SMALL, {"parallel.tensor_model_parallel_size": 3})
    with pytest.raises(SpecError) as info:
        compile_spec(path, tmp_path / "out")
    assert any(i.key == "parallel.tensor_model_parallel_size" for i in info.value.errors)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------
# What the runtime cannot run


#: (changes, the runtime rule that refuses them, the key it names)
RUNTIME_GAPS: list[tuple[dict[str, Any], str, str]] = [
    ({"stage.kind": "sft", "stage.sft": {"packed_sequence": True}, "model.transformer_impl": "transformer_engine"},
     "sft-attention-mask", "model.transformer_impl"),
    ({"checkpoint.async_save": True}, "runtime-async-save", "checkpoint.async_save"),
    ({"parallel.fsdp": "torch"}, "runtime-torch-fsdp", "parallel.fsdp"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron",
      "parallel.use_distributed_optimizer": False}, "runtime-fsdp-distributed-optimizer",
     "parallel.use_distributed_optimizer"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron",
      "parallel.pipeline_model_parallel_size": 2}, "runtime-fsdp-pipeline", "parallel.pipeline_model_parallel_size"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "fused_linear"}, "runtime-fsdp-fused-ce",
     "kernels.cross_entropy"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron",
      "checkpoint.init_from": "mcore:runs/base/checkpoints"}, "runtime-fsdp-init-from", "checkpoint.init_from"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron", "precision.fp8": "hybrid",
      "model.transformer_impl": "transformer_engine"}, "runtime-fsdp-fp8", "precision.fp8"),
    ({"model.num_experts": 8, "model.moe_grouped_gemm": True, "model.transformer_impl": "local"},
     "runtime-grouped-gemm-local", "model.moe_grouped_gemm"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron", "parallel.data_parallel_sharding_strategy": "optim",
      "train.use_precision_aware_optimizer": True}, "optimizer-state-fsdp", "parallel.fsdp"),
    ({"kernels.gradient_accumulation_fusion": True, "model.transformer_impl": "local"},
     "runtime-gradient-accumulation-fusion", "kernels.gradient_accumulation_fusion"),
    ({"objective.attention_mask": "block_causal", "objective.block_size": 32,
      "model.transformer_impl": "transformer_engine"}, "runtime-block-causal-te", "objective.attention_mask"),
    ({"data.reset_attention_mask": True, "model.transformer_impl": "transformer_engine"},
     "runtime-document-mask-te", "data.reset_attention_mask"),
    ({"model.attention_backend": "flex", "model.attention_dropout": 0.1}, "attention-backend-masks",
     "model.attention_dropout"),
    ({"objective.variable_length_prob": 0.01, "objective.variable_length": "micro_batch",
      "parallel.pipeline_model_parallel_size": 2}, "runtime-variable-length-pipeline", "objective.variable_length"),
    ({"logging.tensorboard_dir": "tb"}, "runtime-tensorboard-dir", "logging.tensorboard_dir"),
    # a text tokenizer (NullTokenizer is the rule's other finding) and two pipeline stages
    ({"eval.generation": {"prompts": "task/test.jsonl"}, "parallel.pipeline_model_parallel_size": 2,
      "data.tokenizer": {"type": "HuggingFaceTokenizer", "model": "org/name", "eod_id": 0}},
     "eval-generation-layout", "parallel.pipeline_model_parallel_size"),
]


@pytest.mark.parametrize("changes, rule, key", RUNTIME_GAPS, ids=[r for _, r, _ in RUNTIME_GAPS])
def test_runtime_gaps_are_refused_naming_the_key(tmp_path: Path, changes: dict[str, Any], rule: str,
                                                 key: str) -> None:
    with pytest.raises(SpecError) as info:
        compile_spec(spec_file(tmp_path, SMALL, changes), tmp_path / "out")
    found = [i for i in info.value.errors if RULES[i.rule].scope == "runtime"]
    assert [(i.rule, i.key) for i in found] == [(rule, key)]
    assert found[0].hint and found[0].file and found[0].file.endswith("spec.toml")
    # the rule's fix, or (where the value depends on the spec) the finding's own, in words and as keys
    assert found[0].fix is not None and found[0].source == RULES[rule].source
    assert found[0].hint == RULES[rule].fix or found[0].hint.startswith(found[0].fix.text())
    assert not (tmp_path / "out").exists()


def test_fsdp_with_default_cross_entropy_compiles_with_megatrons(tmp_path: Path) -> None:
    """``cross_entropy = "auto"`` under Megatron-FSDP takes megatron's vocab-parallel cross
    entropy (resolve.effective_cross_entropy), so a spec that only sets fsdp compiles."""
    out = tmp_path / "out"
    compile_spec(spec_file(tmp_path, SMALL, {"parallel.fsdp": "megatron"}), out)
    text = (out / "train.py").read_text()
    assert "use_megatron_fsdp=True" in text and "cross_entropy='megatron'" in text


def test_every_runtime_rule_is_exercised() -> None:
    """RUNTIME_GAPS has a case for each runtime rule (eod-id-unknown is tested below)."""
    assert {r for _, r, _ in RUNTIME_GAPS} == {r.id for r in RULES.values() if r.scope == "runtime"} - {"eod-id-unknown"}


def _checkpoint_call(train_py: str) -> dict[str, Any]:
    """The keyword arguments of the ``CheckpointConfig(...)`` call in a rendered train.py."""
    call = next(n for n in ast.walk(ast.parse(train_py))
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "CheckpointConfig")
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


@pytest.mark.parametrize(
    "changes, init_from, cache_dir",
    [
        ({"checkpoint.init_from": "hf:models/Qwen3-1.7B", "checkpoint.save": "runs/t/ckpt"},
         "hf:models/Qwen3-1.7B", "runs/t/ckpt/init_from_hf"),
        ({"checkpoint.init_from": "hf:/abs/model"}, "hf:/abs/model", "runs/t/init_from_hf"),  # nothing saved
        ({"checkpoint.init_from": "mcore:runs/base/checkpoints"}, "mcore:runs/base/checkpoints", None),
        ({}, None, None),
    ],
)
def test_init_from_is_rendered_as_plain_python(tmp_path: Path, changes: dict[str, Any], init_from: str | None,
                                               cache_dir: str | None) -> None:
    """checkpoint.init_from compiles: train.py passes it to the runtime's
    CheckpointConfig as a literal, with the directory hf: weights are converted into."""
    compile_spec(spec_file(tmp_path, SMALL, changes), tmp_path / "a")
    text = (tmp_path / "a" / "train.py").read_text()
    kwargs = _checkpoint_call(text)
    assert kwargs["init_from"] == init_from and kwargs["init_cache_dir"] == cache_dir
    if init_from is not None:
        assert f"init_from={init_from!r}," in text  # visible as written in the spec
    compile_spec(spec_file(tmp_path, SMALL, changes, file_name="b.toml"), tmp_path / "b")
    assert read_all(tmp_path / "a")["train.py"].splitlines()[1:] == read_all(tmp_path / "b")["train.py"].splitlines()[1:]


def test_a_malformed_init_from_is_refused_with_file_line_and_remedy(tmp_path: Path) -> None:
    path = spec_file(tmp_path, SMALL, {"checkpoint.init_from": "/models/qwen"})
    with pytest.raises(SpecError) as info:
        compile_spec(path, tmp_path / "out")
    issue = next(i for i in info.value.errors if i.key == "checkpoint.init_from")
    assert issue.rule == "init-from-format" and issue.severity == "error" and issue.value == "/models/qwen"
    assert issue.file == str(path) or issue.file.endswith("spec.toml")
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("init_from"))
    assert issue.line == line
    assert "hf:/models/qwen" in issue.hint
    assert not (tmp_path / "out").exists()


def test_block_causal_on_the_local_path_compiles(tmp_path: Path) -> None:
    compile_spec(spec_file(tmp_path, SMALL, {"objective.attention_mask": "block_causal", "objective.block_size": 32,
                                      "model.transformer_impl": "local"}), tmp_path / "out")
    text = (tmp_path / "out" / "train.py").read_text()
    assert "attention='block_causal'" in text and "block_size=32" in text


# ------------------------------------------------------------------------------------------
# End-of-document id


def test_eod_of_gpt2_null_and_explicit(tmp_path: Path) -> None:
    demo = load(DEMO).spec
    assert eod_choice(demo).value == 50256 and eod_choice(demo).known
    null = load(spec_file(tmp_path, SMALL)).spec
    assert eod_choice(null).value == 999
    explicit = load(spec_file(tmp_path, SMALL, {"data.tokenizer.eod_id": 7}, file_name="b.toml")).spec
    assert eod_choice(explicit).value == 7


def test_eod_read_from_a_local_hugging_face_folder(tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "</s>"}}))
    (folder / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"id": 2, "content": "</s>"}],
                                                       "model": {"vocab": {"a": 0}}}))
    spec = load(spec_file(tmp_path, SMALL, {"data.tokenizer": {"type": "HuggingFaceTokenizer", "model": str(folder)}})).spec
    choice = eod_choice(spec)
    assert (choice.value, choice.known) == (2, True)


def test_unknown_eod_is_a_warning_when_unused_and_an_error_when_used(tmp_path: Path) -> None:
    hub = {"data.tokenizer": {"type": "HuggingFaceTokenizer", "model": "org/name"}}
    result = compile_spec(spec_file(tmp_path, SMALL, hub), tmp_path / "a")
    assert [w.rule for w in result.warnings if w.rule != "path-not-found"] == ["eod-id-unknown"]
    assert "eod_id=999,  # unknown at compile time" in (tmp_path / "a" / "train.py").read_text()
    with pytest.raises(SpecError) as info:
        compile_spec(spec_file(tmp_path, SMALL, {**hub, "data.reset_attention_mask": True}, file_name="b.toml"), tmp_path / "b")
    assert [i.key for i in info.value.errors] == ["data.tokenizer.eod_id"]
    assert "data.reset_attention_mask" in info.value.errors[0].message


# ------------------------------------------------------------------------------------------
# Quoting: no spec value escapes its literal


HOSTILE = "x'\"; $(touch pwned) `id` \\\n#"


def test_hostile_strings_stay_inside_their_literals(tmp_path: Path) -> None:
    name = HOSTILE.replace("\n", " ")  # launch.sbatch refuses control characters in the job name
    path = spec_file(tmp_path, SMALL, {"name": name, "description": HOSTILE, "logging": {},
                                "data.train": [HOSTILE + "_text_document"],
                                "checkpoint.save": HOSTILE}, file_name="hostile\n$(x).toml")
    compile_spec(path, tmp_path / "out")
    out = tmp_path / "out"
    train = (out / "train.py").read_text()
    tree = ast.parse(train)
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert {HOSTILE + "_text_document", HOSTILE, name, f"runs/{name}"} <= strings
    for text in (train, (out / "launch.sh").read_text()):  # the header comments stay comments
        assert all(line.startswith("#") for line in text.splitlines()[:4])
    for name in ("launch.sh", "launch.sbatch"):
        subprocess.run(["bash", "-n", str(out / name)], check=True)
    assert not (tmp_path / "pwned").exists()


def test_py_literal_round_trips() -> None:
    values = [None, True, 0, -3, 1e-05, 0.1, "a'b\"c\n", [1, [2.5, "x"]], ("p", 1.0), ("one",), {"b": 1, "a": [None]}]
    for value in values:
        assert ast.literal_eval(py_literal(value)) == value
    with pytest.raises(ValueError):
        py_literal(float("nan"))
    with pytest.raises(ValueError):
        py_literal(object())


# ------------------------------------------------------------------------------------------
# The generated files


# Bundled specs whose header says "`dlmspec compile` refuses it" (the runtime cannot run them yet)
# are left out; tests/unit/specs/test_specs.py checks that exactly those are refused, with what message.
@pytest.mark.parametrize("spec", sorted(p for p in (ROOT / "specs").glob("*.toml")
                                        if "`dlmspec compile` refuses it" not in p.read_text()), ids=lambda p: p.stem)
def test_every_spec_compiles_to_valid_python_and_shell(tmp_path: Path, spec: Path) -> None:
    result = compile_spec(spec, tmp_path / "out")
    out = tmp_path / "out"
    py_compile.compile(str(out / "train.py"), cfile=str(tmp_path / "train.pyc"), doraise=True)
    for name in ("launch.sh", "launch.sbatch"):
        subprocess.run(["bash", "-n", str(out / name)], check=True)
    text = (out / "train.py").read_text()
    assert result.content_hash in text and "if __name__ == \"__main__\":" in text
    tree = ast.parse(text)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"os", "sys", "torch", "megatron", "dlmspec"}, imported


def test_launch_sh_is_single_node_torchrun_with_the_spec_gpu_count(tmp_path: Path) -> None:
    compile_spec(spec_file(tmp_path, SMALL, {"parallel.tensor_model_parallel_size": 2,
                                      "parallel.sequence_parallel": True}), tmp_path / "out")
    text = (tmp_path / "out" / "launch.sh").read_text()
    assert "set -euo pipefail" in text
    assert "-m torch.distributed.run" in text and "--nproc_per_node=8" in text and "--nnodes=1" in text
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    compile_spec(spec_file(tmp_path, SMALL, {}, file_name="b.toml"), tmp_path / "dp")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in (tmp_path / "dp" / "launch.sh").read_text()


def test_launch_sh_refuses_a_multi_node_job(tmp_path: Path) -> None:
    compile_spec(spec_file(tmp_path, SMALL, {"cluster.nodes": 2, "train.global_batch_size": 128}), tmp_path / "out")
    run = subprocess.run(["bash", str(tmp_path / "out" / "launch.sh")], capture_output=True, text=True)
    assert run.returncode == 2 and "launch.sbatch" in run.stderr
    assert "torch.distributed.run" not in (tmp_path / "out" / "launch.sh").read_text()


SHELLCHECK = shutil.which("shellcheck")


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed")
@pytest.mark.parametrize("changes", [{}, {"cluster.nodes": 2, "train.global_batch_size": 128},
                                     {"parallel.tensor_model_parallel_size": 2, "parallel.sequence_parallel": True}],
                         ids=["dp8", "two-nodes", "tp2-sp"])
def test_launch_sh_passes_shellcheck(tmp_path: Path, changes: dict[str, Any]) -> None:
    compile_spec(spec_file(tmp_path, SMALL, changes), tmp_path / "out")
    run = subprocess.run([SHELLCHECK, "--norc", "--shell=bash", str(tmp_path / "out" / "launch.sh")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


def test_launch_sh_stops_early_when_the_runtime_is_not_importable(tmp_path: Path) -> None:
    compile_spec(spec_file(tmp_path, SMALL), tmp_path / "out")
    # A Python without site-packages (-S), started outside the checkout: no dlmspec.backends.megatron.
    python = tmp_path / "python-without-site"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    run = subprocess.run(["bash", str(tmp_path / "out" / "launch.sh")], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "DLMSPEC_PYTHON": str(python), "PYTHONPATH": ""})
    assert run.returncode == 2 and "cannot import torch" in run.stderr


def test_launch_sh_says_when_the_interpreter_does_not_exist(tmp_path: Path) -> None:
    """DLMSPEC_PYTHON naming no file is said as such, not as 'cannot import torch' (the
    new-user trial)."""
    compile_spec(spec_file(tmp_path, SMALL), tmp_path / "out")
    run = subprocess.run(["bash", str(tmp_path / "out" / "launch.sh")], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "DLMSPEC_PYTHON": str(tmp_path / "no-such-python")})
    assert run.returncode == 2 and "no interpreter" in run.stderr and "DLMSPEC_PYTHON" in run.stderr
    assert "cannot import" not in run.stderr


def test_train_py_carries_the_resolved_values(tmp_path: Path) -> None:
    resolved = resolve(load(DEMO).spec)
    files = render(resolved, "specs/demo-dlm.toml")
    text = files["train.py"]
    for snippet in ("num_query_groups=4,", "kv_channels=64,", "vocab_size=50304,", "mask_token_id=50257,",
                    "activation_func=F.silu,", "gated_linear_unit=True,", "params_dtype=torch.bfloat16,",
                    "peak_tflops_per_gpu=989.0,", f"lr_decay_iters={resolved.train_iters},", "signal_exit_code=85,",
                    "use_transformer_engine=False,  # auto: objective.variable_length_prob = 0.01 keeps the local layers",
                    "Run path: transformer_impl = 'auto' -> local (auto: objective.variable_length_prob",
                    "overlap_grad_reduce=False,",  # one GPU: no gradient reduction to overlap
                    "blend=[('.data/demo-train_text_document', 1.0)],"):
        assert snippet in text, snippet


# ------------------------------------------------------------------------------------------
# The command line


def test_cli_compile_and_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert cli_main(["compile", str(DEMO), "-o", str(out)]) == 0
    assert "compiled demo-dlm" in capsys.readouterr().out
    assert cli_main(["compile", str(DEMO), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "not empty" in err and "--force" in err and "Traceback" not in err
    assert cli_main(["compile", str(DEMO), "-o", str(out), "--force", "--set", "train.lr=0.002"]) == 0
    assert "lr=0.002," in (out / "train.py").read_text()


def test_cli_invalid_spec_exits_2_with_file_line_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = spec_file(tmp_path, SMALL, {"stage.kind": "bogus"})
    assert cli_main(["compile", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "stage.kind" in err and "spec.toml" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_generated_names_are_the_known_set(tmp_path: Path) -> None:
    compile_spec(DEMO, tmp_path / "out")
    assert set(p.name for p in (tmp_path / "out").iterdir()) <= set(GENERATED_FILES)


# ------------------------------------------------------------------------------------------
# The interpreter of launch.sh / launch.sbatch (`dlmspec compile --python`)


def _interpreter_without_torch(path: Path) -> Path:
    """A Python without site-packages (-S): it lacks torch, as a user's bare python3 does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -S \"$@\"\n")
    path.chmod(0o755)
    return path


def _assigned(script: str, name: str) -> str:
    """The value bash gives ``name`` by the script's one line ``name=...``."""
    (line,) = [line for line in script.splitlines() if line.startswith(f"{name}=")]
    return subprocess.run(["bash", "-c", f'{line}\nprintf %s "${name}"'], capture_output=True, text=True,
                          check=True).stdout


def test_python_option_writes_the_interpreter_into_both_scripts_and_nothing_else(tmp_path: Path) -> None:
    resolved = resolve(load(spec_file(tmp_path, SMALL)).spec)
    plain = render(resolved, "spec.toml")
    hostile = "/opt/my env/bin/py'thon $HOME"
    chosen = render(resolved, "spec.toml", python=hostile)
    assert {n for n in plain if plain[n] != chosen[n]} == {"launch.sh", "launch.sbatch"}  # lock, hash, plan: same
    assert render(resolved, "spec.toml", python=None) == plain  # no --python: today's bytes
    assert 'PYTHON="${DLMSPEC_PYTHON:-python3}"' in plain["launch.sh"]
    assert "DLMSPEC_PYTHON:-" not in chosen["launch.sh"] and "DLMSPEC_PYTHON:-" not in chosen["launch.sbatch"]
    assert _assigned(chosen["launch.sh"], "PYTHON") == hostile == _assigned(chosen["launch.sbatch"], "python")
    assert "dlmspec compile --python" in chosen["launch.sh"] and "dlmspec compile --python" in chosen["launch.sbatch"]
    for name in ("launch.sh", "launch.sbatch"):
        script = tmp_path / name
        script.write_text(chosen[name])
        subprocess.run(["bash", "-n", str(script)], check=True)


def test_launch_sh_names_the_compiled_interpreter_and_the_remedy(tmp_path: Path) -> None:
    python = _interpreter_without_torch(tmp_path / "my env" / "bin" / "python")
    other = _interpreter_without_torch(tmp_path / "other" / "python")
    compile_spec(spec_file(tmp_path, SMALL), tmp_path / "out", python=str(python))
    run = subprocess.run(["bash", str(tmp_path / "out" / "launch.sh")], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "DLMSPEC_PYTHON": str(other), "PYTHONPATH": ""})
    # --python wins over DLMSPEC_PYTHON; the message names it and says how to choose another.
    assert run.returncode == 2, run.stderr
    assert f"{python} cannot import torch" in run.stderr and str(other) not in run.stderr
    assert "dlmspec compile --python" in run.stderr and "dlmspec[runtime]" in run.stderr


def test_launch_sh_without_python_option_takes_dlmspec_python_else_python3(tmp_path: Path) -> None:
    compile_spec(spec_file(tmp_path, SMALL), tmp_path / "out")
    fake_bin = tmp_path / "bin"
    _interpreter_without_torch(fake_bin / "python3")
    env = {**os.environ, "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": ""}
    env.pop("DLMSPEC_PYTHON", None)
    run = subprocess.run(["bash", str(tmp_path / "out" / "launch.sh")], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert run.returncode == 2 and "python3 cannot import torch" in run.stderr and "DLMSPEC_PYTHON" in run.stderr
    chosen = _interpreter_without_torch(tmp_path / "env" / "python")
    run = subprocess.run(["bash", str(tmp_path / "out" / "launch.sh")], capture_output=True, text=True,
                         cwd=tmp_path, env={**env, "DLMSPEC_PYTHON": str(chosen)})
    assert run.returncode == 2 and f"{chosen} cannot import torch" in run.stderr


def test_python_option_keeps_a_bare_name_and_makes_a_relative_path_absolute(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    resolved = resolve(load(spec_file(tmp_path, SMALL)).spec)
    assert _assigned(render(resolved, "spec.toml", python="python3.11")["launch.sh"], "PYTHON") == "python3.11"
    text = render(resolved, "spec.toml", python=".venv/bin/python")["launch.sh"]
    assert _assigned(text, "PYTHON") == str(tmp_path / ".venv/bin/python")


@pytest.mark.parametrize("bad", ["", "python\n3"])
def test_python_option_refuses_an_empty_or_multi_line_value(tmp_path: Path, bad: str) -> None:
    with pytest.raises(SpecError) as caught:
        compile_spec(spec_file(tmp_path, SMALL), tmp_path / "out", python=bad)
    assert caught.value.issues[0].key == "--python" and caught.value.issues[0].hint
    assert not (tmp_path / "out").exists()


def test_cli_compile_and_submit_take_python(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    python = str(tmp_path / "env" / "bin" / "python")
    assert cli_main(["compile", str(DEMO), "-o", str(tmp_path / "out"), "--python", python]) == 0
    assert _assigned((tmp_path / "out" / "launch.sh").read_text(), "PYTHON") == python
    capsys.readouterr()
    assert cli_main(["compile", str(DEMO), "-o", str(tmp_path / "out"), "--python", python, "--force"]) == 0
    capsys.readouterr()
    assert cli_main(["submit", str(DEMO), "-o", str(tmp_path / "sub"), "--python", python, "--dry-run"]) == 0
    assert f"--python {python}" in capsys.readouterr().out


def test_python_option_warns_when_the_path_is_not_executable_here(tmp_path: Path) -> None:
    missing = compile_spec(spec_file(tmp_path, SMALL), tmp_path / "a", python=str(tmp_path / "nowhere" / "python"))
    assert [(w.key, w.rule, w.severity) for w in missing.warnings if w.key == "--python"] == [
        ("--python", "python-path", "warning")]
    present = _interpreter_without_torch(tmp_path / "env" / "python")
    assert not [w for w in compile_spec(spec_file(tmp_path, SMALL), tmp_path / "b", python=str(present)).warnings
                if w.key == "--python"]
    assert not [w for w in compile_spec(spec_file(tmp_path, SMALL), tmp_path / "c", python="python3.11").warnings
                if w.key == "--python"]  # a bare name is looked up where the job runs
