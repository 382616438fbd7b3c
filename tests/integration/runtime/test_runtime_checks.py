"""train.py's checks before the first step and on resume, on CPU.

* the spec record: compiled train.py hands the runtime its lock (hash literal + the
  spec.lock.toml beside it); checkpoints keep the lock and a record of the run's values; a
  resume refuses a changed objective, model shape, tokenizer or seed (exit 2: key, old, new,
  what to do), allows and reports schedule / logging / evaluation changes, warns where a
  checkpoint has no record, and the learning-rate scheduler takes the new spec's values instead
  of megatron-core's ``AssertionError: OptimizerParamScheduler ... do not match``;
* the data: ``.bin`` and ``.idx`` belong together, are not truncated, and hold ids inside the
  vocabulary (exit 2 naming the file);
* no CUDA device: one line, exit 2, before megatron-core starts;
* a failed checkpoint save names the folder and the free space, and ``latest`` keeps naming the
  previous checkpoint (the partial folder is removed).

What needs a GPU (a real save, resume and failed save under megatron-core) is in
bench/devbox/gpu/runtime_checks.sh.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import os
import struct
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dlmspec.render.compile import compile_spec

from cpu_world_kit import megatron_cpu_world

from runtime_checks_kit import (  # noqa: F401 (fixtures among them)
    DEMO,
    MOCK,
    ROOT,
    _fake_checkpoint,
    _load,
    _meta_of,
    _parts,
    _record,
)





@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """demo-dlm (mock data) compiled as it is and with a few changes: name -> module."""
    variants = {
        "base": [],
        "longer": ["train.train_iters=600", "train.lr=5e-4", "train.lr_decay_style=\"linear\"",
                   "logging.log_interval=5", "train.eval_interval=25"],
        "shallower": ["model.num_layers=6"],
        "ar": ["objective.kind=\"ar\""],
        "options": ["objective.min_masked_tokens=1", "objective.variable_length=\"micro_batch\"",
                    "train.loss_normalization=\"micro_batch\""],
    }
    out = {}
    for name, overrides in variants.items():
        folder = tmp_path_factory.mktemp(name)
        compile_spec(DEMO, folder, force=True, overrides=MOCK + overrides)
        out[name] = (_load(folder, f"checks_{name}"), folder)
    return out










# ------------------------------------------------------------------------------------------
# 1. the spec record


def test_compiled_train_py_hands_the_runtime_its_lock(compiled) -> None:
    from dlmspec.backends.megatron import spec_record as sr

    module, folder = compiled["base"]
    run = module.build_run()
    lock_text = (folder / "spec.lock.toml").read_text()
    import tomllib

    assert run.spec_hash == tomllib.loads(lock_text)["lock"]["content_hash"]
    assert Path(run.spec_lock_file) == folder / "spec.lock.toml"
    lock = sr.read_spec_lock(run.spec_lock_file, run.spec_hash)
    assert lock.text == lock_text and lock.content_hash == run.spec_hash and lock.warnings == []
    assert lock.tokenizer["type"] == "NullTokenizer"


def test_a_missing_or_foreign_lock_is_a_warning_not_a_failure(tmp_path: Path, compiled) -> None:
    from dlmspec.backends.megatron import spec_record as sr

    module, folder = compiled["base"]
    run = module.build_run()
    missing = sr.read_spec_lock(str(tmp_path / "spec.lock.toml"), run.spec_hash)
    assert missing.text is None and missing.content_hash == run.spec_hash
    assert any("spec.lock.toml" in w and "not found" in w for w in missing.warnings)
    other = compiled["longer"][1] / "spec.lock.toml"
    foreign = sr.read_spec_lock(str(other), run.spec_hash)
    assert foreign.text is None and any("compile again" in w for w in foreign.warnings)


def test_the_record_is_json_and_names_spec_keys(compiled) -> None:
    lock, record = _record(compiled["base"][0])
    assert json.loads(json.dumps(record)) == record
    assert record["model.num_layers"] == 12 and record["objective.kind"] == "mdm"
    assert record["model.padded_vocab_size"] == 50304 and record["train.train_iters"] == 300
    assert record["data.tokenizer.type"] == "NullTokenizer" and record["train.seed"] == 1234


def test_resume_allows_and_reports_schedule_logging_and_eval_changes(tmp_path: Path, compiled) -> None:
    from dlmspec.backends.megatron import spec_record as sr

    ckpt = _fake_checkpoint(tmp_path, 100, _meta_of(compiled["base"][0]))
    lock, record = _record(compiled["longer"][0])
    check = sr.check_resume(str(ckpt), record, content_hash=lock.content_hash)
    changed = {key: (old, new) for key, old, new in check.changed}
    assert changed["train.train_iters"] == (300, 600)
    assert changed["train.lr"] == (0.001, 0.0005)
    assert changed["train.lr_decay_style"] == ("cosine", "linear")
    assert changed["logging.log_interval"] == (10, 5)
    assert changed["train.eval_interval"] == (50, 25)
    assert "model.num_layers" not in changed and check.warnings == []
    text = "\n".join(check.report_lines())
    assert "train.train_iters: 300 -> 600" in text


def test_resume_reports_changed_objective_options(tmp_path: Path, compiled) -> None:
    """the options are in the record: a resume that changes them is allowed and lists them."""
    from dlmspec.backends.megatron import spec_record as sr

    ckpt = _fake_checkpoint(tmp_path, 100, _meta_of(compiled["base"][0]))
    lock, record = _record(compiled["options"][0])
    changed = {key: (old, new) for key, old, new in sr.check_resume(str(ckpt), record,
                                                                     content_hash=lock.content_hash).changed}
    assert changed["objective.min_masked_tokens"] == (0, 1)
    assert changed["objective.variable_length"] == ("sequence", "micro_batch")
    assert changed["train.loss_normalization"] == ("global_token", "micro_batch")


def test_resume_with_the_same_spec_reports_nothing(tmp_path: Path, compiled) -> None:
    from dlmspec.backends.megatron import spec_record as sr

    ckpt = _fake_checkpoint(tmp_path, 100, _meta_of(compiled["base"][0]))
    lock, record = _record(compiled["base"][0])
    check = sr.check_resume(str(ckpt), record, content_hash=lock.content_hash)
    assert check.changed == [] and check.warnings == []


@pytest.mark.parametrize("variant, key, old, new", [
    ("shallower", "model.num_layers", "12", "6"),
    ("ar", "objective.kind", "'mdm'", "'ar'"),
])
def test_resume_refuses_a_changed_model_shape_or_objective(tmp_path, compiled, variant, key, old, new) -> None:
    from dlmspec.backends.megatron import spec_record as sr

    ckpt = _fake_checkpoint(tmp_path, 100, _meta_of(compiled["base"][0]))
    lock, record = _record(compiled[variant][0])
    with pytest.raises(sr.ResumeRefused) as err:
        sr.check_resume(str(ckpt), record, content_hash=lock.content_hash)
    message = str(err.value)
    assert str(ckpt) in message
    line = next(line for line in message.splitlines() if key in line)
    assert old in line and new in line, line
    assert "checkpoint.save" in message and "init_from" in message


def test_resume_refuses_a_changed_tokenizer_or_seed(tmp_path: Path, compiled) -> None:
    from dlmspec.backends.megatron import spec_record as sr

    meta = _meta_of(compiled["base"][0])
    meta["spec"]["record"]["data.tokenizer.type"] = "GPT2BPETokenizer"
    meta["seed"] = meta["spec"]["record"]["train.seed"] = 7
    ckpt = _fake_checkpoint(tmp_path, 100, meta)
    lock, record = _record(compiled["base"][0])
    with pytest.raises(sr.ResumeRefused) as err:
        sr.check_resume(str(ckpt), record, content_hash=lock.content_hash)
    message = str(err.value)
    assert "data.tokenizer.type" in message and "'GPT2BPETokenizer'" in message
    assert "train.seed" in message and "7" in message


def test_resume_without_a_record_warns_what_could_not_be_checked(tmp_path: Path, compiled) -> None:
    """A checkpoint of an older dlmspec (dlmspec.json with objective and layer_spec only)."""
    from dlmspec.backends.megatron import spec_record as sr

    module = compiled["base"][0]
    run = module.build_run()
    ckpt = _fake_checkpoint(tmp_path, 100, {"iteration": 100, "seed": run.seed, "layer_spec": "local+sdpa",
                                            "objective": dataclasses.asdict(run.objective)})
    lock, record = _record(module)
    check = sr.check_resume(str(ckpt), record, content_hash=lock.content_hash)
    warning = " ".join(check.warnings)
    assert "no spec record" in warning
    for what in ("model shape", "tokenizer", "data"):
        assert what in warning
    # what the old record has is still compared
    ar_lock, ar_record = _record(compiled["ar"][0])
    with pytest.raises(sr.ResumeRefused, match="objective.kind"):
        sr.check_resume(str(ckpt), ar_record, content_hash=ar_lock.content_hash)


def test_resume_from_a_folder_dlmspec_did_not_write_is_refused_cleanly(tmp_path: Path, compiled) -> None:
    from dlmspec.backends.megatron import spec_record as sr

    path = tmp_path / "iter_0000100"
    path.mkdir()
    (path / "metadata.json").write_text("{}")
    lock, record = _record(compiled["base"][0])
    with pytest.raises(sr.ResumeRefused) as err:
        sr.check_resume(str(path), record, content_hash=lock.content_hash)
    assert "dlmspec.json" in str(err.value) and "init_from" in str(err.value)
    (path / "dlmspec.json").write_text("{not json")
    with pytest.raises(sr.ResumeRefused, match="dlmspec.json"):
        sr.check_resume(str(path), record, content_hash=lock.content_hash)


def _no_megatron_start(monkeypatch):
    from dlmspec.backends.megatron import training

    def refuse(*args, **kwargs):
        raise AssertionError("megatron-core was started")

    monkeypatch.setattr(training, "initialize_distributed", refuse)
    return training


def _train(training, module, run):
    _, tc, model_kwargs, ddp, opt, layer = _parts(module)
    return training.train(run, transformer_config=tc, layer_spec=layer, model_kwargs=model_kwargs,
                          ddp_config=ddp, optimizer_config=opt, **module.PARALLEL_SIZES)


def test_train_refuses_a_changed_shape_with_exit_2_before_megatron_starts(tmp_path, compiled, monkeypatch,
                                                                         capsys) -> None:
    training = _no_megatron_start(monkeypatch)
    root = tmp_path / "ckpt"
    _fake_checkpoint(root, 100, _meta_of(compiled["base"][0]))
    module = compiled["shallower"][0]
    run = module.build_run()
    run.checkpoint.save_dir, run.checkpoint.load_dir = str(root), None
    with pytest.raises(SystemExit) as exit_:
        _train(training, module, run)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: ") and "model.num_layers" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------
# 1b. the learning-rate scheduler on resume


def _scheduler(train_iters, lr=1e-3, style="cosine"):
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    optimizer = SimpleNamespace(param_groups=[{"params": []}])
    return OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=lr, min_lr=1e-4, lr_warmup_steps=50, lr_decay_steps=train_iters,
        lr_decay_style=style, start_wd=0.1, end_wd=0.1, wd_incr_steps=train_iters, wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=False, override_opt_param_scheduler=False,
        wsd_decay_steps=None, lr_wsd_decay_style="exponential",
    )


def test_megatron_core_refuses_a_longer_schedule_by_itself() -> None:
    """What a resume with more train_iters met before: megatron-core's assertion."""
    old = _scheduler(300)
    old.step(100)
    with pytest.raises(AssertionError, match="do not match"):
        _scheduler(600).load_state_dict(old.state_dict())


def test_the_scheduler_takes_the_new_specs_values_and_says_which_changed() -> None:
    from dlmspec.backends.megatron.spec_record import load_scheduler_state

    old = _scheduler(300)
    old.step(100)
    new = _scheduler(600, lr=5e-4, style="linear")
    changes = load_scheduler_state(new, old.state_dict())
    named = {name: (a, b) for name, a, b in changes}
    assert named["train.lr_decay_iters"] == (300, 600)
    assert named["train.lr"] == (0.001, 0.0005)
    assert named["train.lr_decay_style"] == ("cosine", "linear")
    assert new.num_steps == 100 and new.lr_decay_steps == 600 and new.max_lr == 5e-4
    expected = _scheduler(600, lr=5e-4, style="linear")
    expected.step(100)
    assert new.optimizer.param_groups[0]["lr"] == pytest.approx(expected.optimizer.param_groups[0]["lr"])
    same = _scheduler(300)
    assert load_scheduler_state(same, old.state_dict()) == [] and same.num_steps == 100


def test_load_checkpoint_loads_a_changed_schedule(tmp_path_factory, monkeypatch) -> None:
    """load_checkpoint's wiring: the checkpoint's scheduler state goes through load_scheduler_state."""
    from dlmspec.backends.megatron import checkpointing

    old = _scheduler(300)
    old.step(100)
    path = tmp_path_factory.mktemp("ck") / "iter_0000100"
    path.mkdir()
    (path / "dlmspec.json").write_text(json.dumps({"seed": 1, "parallel_layout": None}))
    loaded = {"model": {}, "opt_param_scheduler": old.state_dict(), "iteration": 100,
              "consumed_train_samples": 3200, "seed": 1}
    monkeypatch.setattr(checkpointing, "_model_sharded_state_dict", lambda model: {"model": {}})
    monkeypatch.setattr(checkpointing, "dist_load", lambda state, p: dict(loaded))
    new = _scheduler(600)
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        result = checkpointing.load_checkpoint(str(path), model=[torch.nn.Module()], scheduler=new, seed=1)
    assert result.iteration == 100 and new.num_steps == 100 and new.lr_decay_steps == 600
    assert ("train.lr_decay_iters", 300, 600) in result.scheduler_changes


# ------------------------------------------------------------------------------------------
# 2. the data


VOCAB = 1000


def _dataset(prefix: Path, *, docs=40, dtype=np.uint16, top=VOCAB - 1, seed=0) -> Path:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=dtype)
    for i in range(docs):
        doc = rng.integers(0, top, int(rng.integers(5, 50)))
        if i == docs // 2:
            doc[0] = top  # the largest id sits in the middle
        builder.add_document(doc, [len(doc)])
    builder.finalize(str(prefix) + ".idx")
    return prefix


def _check(prefix, vocab=VOCAB):
    from dlmspec.backends.megatron.data import check_indexed_dataset

    return check_indexed_dataset(str(prefix), vocab)


def test_a_sound_dataset_passes_and_says_how_it_was_scanned(tmp_path: Path) -> None:
    result = _check(_dataset(tmp_path / "ok"))
    assert result.problems == []
    assert result.max_id == VOCAB - 1 and result.dtype == "uint16" and result.scan == "full"


def test_a_truncated_bin_is_named(tmp_path: Path) -> None:
    prefix = _dataset(tmp_path / "cut")
    data = (tmp_path / "cut.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[: len(data) // 2])
    (problem,) = _check(prefix).problems
    assert str(prefix) + ".bin" in problem and "truncated" in problem and str(len(data)) in problem


def test_a_truncated_or_foreign_idx_is_named(tmp_path: Path) -> None:
    prefix = _dataset(tmp_path / "ix")
    idx = (tmp_path / "ix.idx").read_bytes()
    (tmp_path / "ix.idx").write_bytes(idx[:-10])
    (problem,) = _check(prefix).problems
    assert str(prefix) + ".idx" in problem and "truncated" in problem
    (tmp_path / "ix.idx").write_bytes(idx[:20])
    assert "header" in _check(prefix).problems[0]
    (tmp_path / "ix.idx").write_bytes(b"NOTANIDX!" + idx[9:])
    assert "not a megatron-core index" in _check(prefix).problems[0]


def test_a_bin_of_another_idx_is_named(tmp_path: Path) -> None:
    a = _dataset(tmp_path / "a", docs=40, seed=1)
    _dataset(tmp_path / "b", docs=80, seed=2)
    os.replace(tmp_path / "b.bin", tmp_path / "a.bin")
    (problem,) = _check(a).problems
    assert str(a) + ".bin" in problem and "belong" in problem


def test_a_dtype_disagreement_is_named(tmp_path: Path) -> None:
    prefix = _dataset(tmp_path / "dt", dtype=np.int32)
    idx = bytearray((tmp_path / "dt.idx").read_bytes())
    assert idx[17] == 4  # int32's code, at byte 17 of the header
    idx[17] = 8  # uint16: the .idx now says 2-byte tokens, the .bin holds 4-byte ones
    # the pointers are in bytes: halve them so the .idx alone is consistent (a uint16 index)
    count = struct.unpack("<Q", idx[18:26])[0]
    start = 34 + 4 * count
    pointers = np.frombuffer(bytes(idx[start:start + 8 * count]), dtype=np.int64) // 2
    idx[start:start + 8 * count] = pointers.tobytes()
    (tmp_path / "dt.idx").write_bytes(bytes(idx))
    (problem,) = _check(prefix).problems
    assert "uint16" in problem and "dtype" in problem and str(prefix) + ".bin" in problem


def test_token_ids_outside_the_vocabulary_are_named(tmp_path: Path) -> None:
    prefix = _dataset(tmp_path / "big", top=VOCAB + 7)
    (problem,) = _check(prefix).problems
    assert str(prefix) + ".bin" in problem and str(VOCAB + 7) in problem and str(VOCAB) in problem
    assert "tokenizer" in problem


def test_large_files_are_sampled_not_read_whole(tmp_path: Path, monkeypatch) -> None:
    from dlmspec.backends.megatron import data

    prefix = _dataset(tmp_path / "large", docs=400, top=VOCAB + 3)
    monkeypatch.setattr(data, "FULL_SCAN_BYTES", 1024)
    monkeypatch.setattr(data, "SAMPLE_WINDOW_BYTES", 64)
    result = _check(prefix)
    assert result.scan.startswith("sampled")
    assert result.scanned_bytes < os.path.getsize(str(prefix) + ".bin")
    # the sampled windows always include the start and the end of the file
    tokens = np.memmap(str(prefix) + ".bin", dtype=np.uint16, mode="r")
    assert result.max_id >= max(int(tokens[:32].max()), int(tokens[-32:].max()))


def test_an_unsigned_dtype_below_the_vocabulary_needs_no_scan(tmp_path: Path) -> None:
    result = _check(_dataset(tmp_path / "u8", dtype=np.uint8, top=200), vocab=50257)
    assert result.problems == [] and result.scan == "none (uint8 ids are all < 50257)"


def test_train_refuses_bad_data_with_exit_2_naming_the_file(tmp_path, compiled, monkeypatch, capsys) -> None:
    training = _no_megatron_start(monkeypatch)
    prefix = _dataset(tmp_path / "corpus")
    data = (tmp_path / "corpus.bin").read_bytes()
    (tmp_path / "corpus.bin").write_bytes(data[:-6])
    module = compiled["base"][0]
    run = module.build_run()
    run.data = dataclasses.replace(run.data, mock=False, blend=[(str(prefix), 1.0)], valid_blend=None,
                                   vocab_size=VOCAB, eod_id=VOCAB - 1)
    with pytest.raises(SystemExit) as exit_:
        _train(training, module, run)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: ") and str(prefix) + ".bin" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------
# 3. no CUDA device


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_no_cuda_device_is_one_line() -> None:
    from dlmspec.backends.megatron.distributed import cuda_problem

    problem = cuda_problem()
    assert problem is not None and "\n" not in problem and "no CUDA device" in problem


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_train_without_cuda_exits_2_before_megatron_starts(compiled, monkeypatch, capsys) -> None:
    training = _no_megatron_start(monkeypatch)
    module = compiled["base"][0]
    run = module.build_run()
    run.checkpoint.save_dir = run.checkpoint.load_dir = None
    with pytest.raises(SystemExit) as exit_:
        _train(training, module, run)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train.py: ") and "no CUDA device" in err[0]


# ------------------------------------------------------------------------------------------
# 4. a checkpoint save that fails


ENFORCE = ("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
           "__0_0.distcp: file write failed")


def test_a_failed_save_names_the_folder_and_free_space_and_keeps_latest(tmp_path_factory, monkeypatch) -> None:
    from dlmspec.backends.megatron import checkpointing

    root = tmp_path_factory.mktemp("full") / "ckpt"
    previous = _fake_checkpoint(root, 100, {"seed": 1})
    (previous / "__0_0.distcp").write_bytes(b"\0" * 4096)

    def disk_full(state, path):
        with open(os.path.join(path, "__0_0.distcp"), "wb") as f:
            f.write(b"\0" * 1024)  # a partial file, then the writer fails
        raise RuntimeError(ENFORCE)

    monkeypatch.setattr(checkpointing, "_model_sharded_state_dict", lambda model: {})
    monkeypatch.setattr(checkpointing.dist_checkpointing, "save", disk_full)
    monkeypatch.setattr(checkpointing.shutil, "disk_usage",
                        lambda p: SimpleNamespace(total=100 * 2**30, used=100 * 2**30 - 2**29, free=2**29))
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        with pytest.raises(checkpointing.CheckpointSaveError) as err:
            checkpointing.save_checkpoint(str(root), iteration=200, model=[torch.nn.Module()],
                                     consumed_train_samples=6400, seed=1)
    message = str(err.value)
    assert str(root / "iter_0000200") in message and "inline_container.cc:672" in message
    assert "0.5 GiB free" in message and "100.0 GiB" in message
    assert "iter_0000100" in message  # the checkpoint a relaunch resumes from
    assert checkpointing.read_latest_checkpoint(str(root)) == str(previous)
    assert not (root / "iter_0000200").exists()
    assert sorted(os.listdir(root)) == ["iter_0000100", "latest"]


def test_a_failed_tracker_write_leaves_the_old_latest(tmp_path_factory, monkeypatch) -> None:
    from dlmspec.backends.megatron import checkpointing

    root = tmp_path_factory.mktemp("tracker") / "ckpt"
    previous = _fake_checkpoint(root, 100, {"seed": 1})
    monkeypatch.setattr(checkpointing, "_model_sharded_state_dict", lambda model: {})
    monkeypatch.setattr(checkpointing.dist_checkpointing, "save", lambda state, path: None)

    def no_space(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpointing.os, "replace", no_space)
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        with pytest.raises(checkpointing.CheckpointSaveError, match="No space left on device"):
            checkpointing.save_checkpoint(str(root), iteration=200, model=[torch.nn.Module()],
                                     consumed_train_samples=6400, seed=1)
    monkeypatch.undo()
    assert checkpointing.read_latest_checkpoint(str(root)) == str(previous)
    assert sorted(os.listdir(root)) == ["iter_0000100", "latest"]  # no temporary tracker left


def test_the_record_goes_into_every_checkpoint(tmp_path_factory, monkeypatch, compiled) -> None:
    from dlmspec.backends.megatron import spec_record as sr
    from dlmspec.backends.megatron import checkpointing

    lock, record = _record(compiled["base"][0])
    root = tmp_path_factory.mktemp("rec") / "ckpt"
    monkeypatch.setattr(checkpointing, "_model_sharded_state_dict", lambda model: {})
    monkeypatch.setattr(checkpointing.dist_checkpointing, "save", lambda state, path: None)
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        path = checkpointing.save_checkpoint(str(root), iteration=10, model=[torch.nn.Module()],
                                        consumed_train_samples=320, seed=1234,
                                        metadata={"spec": sr.spec_metadata(lock, record)},
                                        spec_lock_text=lock.text)
    assert (Path(path) / "spec.lock.toml").read_text() == lock.text
    meta = json.loads((Path(path) / "dlmspec.json").read_text())
    assert meta["spec"]["content_hash"] == lock.content_hash and meta["spec"]["record"] == record
    assert meta["spec"]["lock_file"] == "spec.lock.toml"


# ------------------------------------------------------------------------------------------
# 5. launch.sh runs the start checks in one process before torchrun
# torchrun reports a worker's exit code 2 as its own exit code 1 under a traceback of its agent
# (seen on the H200), so launch.sh asks train.py --check first: one message, exit code 2.


def test_train_py_check_runs_the_start_checks_in_one_process(compiled, monkeypatch, capsys) -> None:
    module = compiled["base"][0]
    _no_megatron_start(monkeypatch)
    monkeypatch.setattr("sys.argv", ["train.py", "--check"])
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(module, "GPUS_PER_NODE", 2)  # as compiled for two GPUs: --check is one process
    from dlmspec.backends.megatron import checks

    seen = {}

    def problem(local_rank=None, processes_per_node=None):
        seen["processes_per_node"] = processes_per_node
        return "no CUDA device: (test)"

    monkeypatch.setattr(checks, "cuda_problem", problem)
    with pytest.raises(SystemExit) as exit_, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core's own UserWarnings from the configs
        module.main()
    assert exit_.value.code == 2 and seen["processes_per_node"] == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["train.py: no CUDA device: (test)"]


def test_cuda_problem_counts_the_gpus_a_node_needs(monkeypatch) -> None:
    from dlmspec.backends.megatron.distributed import cuda_problem

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert cuda_problem(processes_per_node=1) is None
    problem = cuda_problem(processes_per_node=8)
    assert "8" in problem and "1 CUDA device" in problem and "\n" not in problem


def test_launch_sh_checks_before_torchrun(compiled) -> None:
    import subprocess

    folder = compiled["base"][1]
    text = (folder / "launch.sh").read_text()
    check = text.index('"$HERE/train.py" --check')
    assert check < text.index("-m torch.distributed.run")
    assert subprocess.run(["bash", "-n", str(folder / "launch.sh")]).returncode == 0


# ------------------------------------------------------------------------------------------
# 6. found on the H200 (bench/devbox/gpu/runtime_checks.sh): a full tmpfs makes torch's checkpoint writer
# raise CheckpointException, a BaseException; and the optimizer's param groups bring the
# checkpoint's max_lr back (the resumed lr at step 50 was 1.714e-4 with the old lr 1e-3, where
# the new lr 5e-4 gives 1.317e-4)


def test_a_failed_torch_dcp_write_is_caught_and_summarised(tmp_path_factory, monkeypatch) -> None:
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.utils import _wrap_exception

    from dlmspec.backends.megatron import checkpointing

    root = tmp_path_factory.mktemp("dcp") / "ckpt"
    previous = _fake_checkpoint(root, 40, {"seed": 1})

    def disk_full(state, path):
        try:
            raise RuntimeError("Worker failure: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        except RuntimeError as exc:
            raise CheckpointException("write", {0: _wrap_exception(exc)}) from None

    monkeypatch.setattr(checkpointing, "_model_sharded_state_dict", lambda model: {})
    monkeypatch.setattr(checkpointing.dist_checkpointing, "save", disk_full)
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        with pytest.raises(checkpointing.CheckpointSaveError) as err:
            checkpointing.save_checkpoint(str(root), iteration=60, model=[torch.nn.Module()],
                                     consumed_train_samples=1920, seed=1)
    first = str(err.value).splitlines()[0]
    assert "inline_container.cc:672" in first and "unexpected pos 704 vs 598" in first
    assert checkpointing.read_latest_checkpoint(str(root)) == str(previous)
    assert not (root / "iter_0000060").exists()


class _Optimizer:
    """What load_checkpoint touches of a megatron optimizer; load_state_dict restores the
    checkpoint's param-group values, as torch's does."""

    def __init__(self, max_lr, betas):
        self.param_groups = [{"params": [0], "max_lr": max_lr, "min_lr": 1e-4, "betas": betas, "lr": 0.0,
                              "weight_decay": 0.1}]

    def sharded_state_dict(self, state, is_loading=False, metadata=None):
        return {}

    def load_state_dict(self, state):
        for group, saved in zip(self.param_groups, state["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})


def test_load_checkpoint_keeps_this_specs_optimizer_hyperparameters(tmp_path_factory, monkeypatch) -> None:
    from dlmspec.backends.megatron import checkpointing

    old = _scheduler(300)
    old.step(100)
    saved = _Optimizer(1e-3, (0.9, 0.95)).param_groups
    path = tmp_path_factory.mktemp("opt") / "iter_0000100"
    path.mkdir()
    (path / "dlmspec.json").write_text(json.dumps({"seed": 1, "parallel_layout": None}))
    loaded = {"model": {}, "optimizer": {"param_groups": saved}, "opt_param_scheduler": old.state_dict(),
              "iteration": 100, "consumed_train_samples": 3200, "seed": 1}
    monkeypatch.setattr(checkpointing, "_model_sharded_state_dict", lambda model: {"model": {}})
    monkeypatch.setattr(checkpointing, "dist_load", lambda state, p: dict(loaded))
    optimizer = _Optimizer(5e-4, (0.9, 0.98))
    scheduler = _scheduler(600, lr=5e-4)
    scheduler.optimizer = optimizer
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        checkpointing.load_checkpoint(str(path), model=[torch.nn.Module()], optimizer=optimizer, scheduler=scheduler,
                                 seed=1)
    group = optimizer.param_groups[0]
    assert group["max_lr"] == 5e-4 and group["betas"] == (0.9, 0.98)
    expected = _scheduler(600, lr=5e-4)
    expected.step(100)
    assert group["lr"] == pytest.approx(expected.optimizer.param_groups[0]["lr"])


def test_sft_chat_token_ids_past_the_vocabulary_pass_the_start_check(tmp_path: Path) -> None:
    """An SFT dataset's chat tokens (ids past the tokenizer's vocabulary that `data prepare --sft`
    gave them, recorded in PREFIX.dlmspec.json) are data, not a foreign tokenizer's ids; without
    the record the same ids are refused."""
    from dlmspec.backends.megatron.data import DataConfig, data_problems
    from dlmspec.data.record import write_record

    prefix = _dataset(tmp_path / "sft", top=VOCAB + 2)  # holds VOCAB + 2
    data = DataConfig(seq_length=16, vocab_size=VOCAB, eod_id=0, blend=[(str(prefix), None)])
    [problem] = data_problems(data)
    assert f"token id {VOCAB + 2} is outside" in problem
    write_record(str(prefix), sft={"special_tokens": {"<|im_start|>": VOCAB + 1, "<|im_end|>": VOCAB + 2}})
    assert data_problems(data) == []
