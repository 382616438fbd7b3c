"""A resume from a checkpoint another spec ``name`` wrote is refused, on CPU: the spec
record in every checkpoint holds the run's name; ``train.py --check`` (and train()) exit 2 naming
both names, the checkpoint folder and the key to set, unless ``checkpoint.resume_from_run`` names
the run the checkpoint belongs to (a SLURM job has no one to ask)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from dlmspec.render.compile import compile_spec

from runtime_checks_kit import DEMO, MOCK, _fake_checkpoint, _load, _meta_of, _record

#: demo-dlm renamed, saving into (and so resuming from) demo-dlm's folder.
RENAMED = MOCK + ['name="other-run"', 'checkpoint.save="runs/demo-dlm/checkpoints"']


def _compiled(tmp_path: Path, label: str, overrides: list[str]):
    folder = tmp_path / label
    compile_spec(DEMO, folder, force=True, overrides=overrides)
    return _load(folder, f"resume_name_{label}"), folder


def test_the_record_holds_the_run_name(tmp_path: Path) -> None:
    module, _ = _compiled(tmp_path, "base", MOCK)
    assert _record(module)[1]["name"] == "demo-dlm"


def test_a_checkpoint_of_another_name_is_refused_naming_both_and_the_key(tmp_path: Path) -> None:
    from dlmspec.backends.megatron import spec_record as sr

    base, _ = _compiled(tmp_path, "base", MOCK)
    renamed, _ = _compiled(tmp_path, "renamed", RENAMED)
    ckpt = _fake_checkpoint(tmp_path / "ckpt", 100, _meta_of(base))
    lock, record = _record(renamed)
    with pytest.raises(sr.ResumeRefused) as err:
        sr.check_resume(str(ckpt), record, content_hash=lock.content_hash)
    message = str(err.value)
    assert str(ckpt) in message and "'demo-dlm'" in message and "'other-run'" in message
    assert 'checkpoint.resume_from_run = "demo-dlm"' in message and "checkpoint.save" in message
    # the key lets it through, and the change of name is reported like any allowed change
    check = sr.check_resume(str(ckpt), record, content_hash=lock.content_hash, resume_from_run="demo-dlm")
    assert ("name", "demo-dlm", "other-run") in check.changed
    # another run's name in the key does not
    with pytest.raises(sr.ResumeRefused):
        sr.check_resume(str(ckpt), record, content_hash=lock.content_hash, resume_from_run="third-run")
    # a checkpoint of an older dlmspec, whose record has no name, is not refused for it
    meta = _meta_of(base)
    del meta["spec"]["record"]["name"]
    older = _fake_checkpoint(tmp_path / "older", 100, meta)
    assert sr.check_resume(str(older), record, content_hash=lock.content_hash).changed != []


def _check(module, monkeypatch) -> None:
    """``train.py --check`` of ``module`` on a machine that passes the CUDA check."""
    from dlmspec.backends.megatron import checks, training

    def refuse(*args, **kwargs):
        raise AssertionError("megatron-core was started")

    monkeypatch.setattr(training, "initialize_distributed", refuse)
    monkeypatch.setattr(checks, "cuda_problem", lambda **kwargs: None)
    # the fake checkpoint holds only its record (dlmspec.json): the name check is under test here,
    # the index check of a real checkpoint has tests of its own (tests/checkpoint)
    monkeypatch.setattr(checks, "check_checkpoint", lambda folder: None)
    monkeypatch.setattr("sys.argv", ["train.py", "--check"])
    monkeypatch.setenv("WORLD_SIZE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core's own UserWarnings from the configs
        module.main()


def test_train_py_check_exits_2_unless_the_spec_says_it_is_meant(tmp_path: Path, monkeypatch, capsys) -> None:
    base, _ = _compiled(tmp_path, "base", MOCK)
    renamed, _ = _compiled(tmp_path, "renamed", RENAMED)
    meant, folder = _compiled(tmp_path, "meant", RENAMED + ['checkpoint.resume_from_run="demo-dlm"'])
    monkeypatch.chdir(tmp_path)
    ckpt = _fake_checkpoint(tmp_path / "runs" / "demo-dlm" / "checkpoints", 100, _meta_of(base))
    with pytest.raises(SystemExit) as exit_:
        _check(renamed, monkeypatch)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("train.py: ") and "Traceback" not in err
    assert "'demo-dlm'" in err and "'other-run'" in err and str(Path("runs/demo-dlm/checkpoints")) in err
    assert "checkpoint.resume_from_run" in err
    # the key travels spec -> train.py -> CheckpointConfig, and the check passes
    assert meant.build_run().checkpoint.resume_from_run == "demo-dlm"
    assert 'resume_from_run="demo-dlm"' in (folder / "train.py").read_text() or \
        "resume_from_run='demo-dlm'" in (folder / "train.py").read_text()
    _check(meant, monkeypatch)
    assert ckpt.exists()


def test_train_py_without_the_key_names_none(tmp_path: Path) -> None:
    """Compiled files stay byte-identical for specs that do not set it: no line for the default."""
    module, folder = _compiled(tmp_path, "base", MOCK)
    assert "resume_from_run" not in (folder / "train.py").read_text()
    assert module.build_run().checkpoint.resume_from_run is None
