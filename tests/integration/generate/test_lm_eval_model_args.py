"""``dlmspec-lm-eval`` (backends/generate/lm_eval_model.py ``main``) on bad ``--model_args`` (an
unknown key, ``kind=zz``, ``mc_samples=abc``, no ``path``, a Python-only key, out-of-range numbers),
a damaged checkpoint and an unknown task: exit code 2 with one line on stderr naming the key, the
value, why and a fix, never a traceback; bad keys and values are refused before a checkpoint is read."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from dlmspec.backends.generate import lm_eval_model  # noqa: E402
from lm_eval_kit import _write_tasks, offline_lm_eval  # noqa: E402,F401 (a fixture)
from tiny_ckpt import tiny_runs  # noqa: E402,F401 (a fixture)

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)


@pytest.fixture
def task_folder(tmp_path: Path) -> Path:
    import yaml

    task = _write_tasks(tmp_path / "data")[0]
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tiny_mc.yaml").write_text(yaml.safe_dump(task))
    return tmp_path / "tasks"


def _exit(capsys, model_args: str, tasks: Path, task: str = "tiny_mc") -> str:
    import logging
    import sys

    capsys.readouterr()
    # lm-eval's log handler holds the stderr of the test that set it up (pytest's capture, closed
    # since): point it at this test's
    handlers = [h for h in logging.getLogger("lm_eval").handlers if isinstance(h, logging.StreamHandler)]
    saved = [h.stream for h in handlers]
    for h in handlers:
        h.stream = sys.stderr
    try:
        # and leave no handler bound to this test's stderr behind for the tests after it
        with pytest.MonkeyPatch.context() as mp, pytest.raises(SystemExit) as stop:
            mp.setattr("lm_eval.__main__.setup_logging", lambda *args, **kwargs: None)
            lm_eval_model.main(["--model", "dlmspec", "--model_args", model_args, "--tasks", task, "--include_path",
                                str(tasks), "--device", "cpu"])
    finally:
        for h, stream in zip(handlers, saved):
            h.stream = stream
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("dlmspec-lm-eval: error:")]
    return line


@pytest.mark.parametrize(("args", "said"), [
    ("PATH,mc_sample=4", "--model_args mc_sample: not a dlmspec model argument; did you mean mc_samples?"),
    ("PATH,kind=zz", "--model_args kind='zz': not a model kind; use kind=mdm, kind=ar or kind=bd3lm"),
    ("PATH,mc_samples=abc", "--model_args mc_samples='abc': not a whole number; e.g. mc_samples=4"),
    ("mc_samples=4", "--model_args path=...: give the run, checkpoint or Hugging Face folder"),
    ("PATH,logits_fn=abc", "--model_args logits_fn: not a dlmspec model argument"),
    ("PATH,mc_samples=0", "--model_args mc_samples=0: out of range 2..1048576; e.g. mc_samples=128"),
    ("PATH,eps=2.5", "--model_args eps=2.5: out of range"),
    ("PATH,seed=-1", "--model_args seed=-1: out of range"),
    ("PATH,gen_length=100000", "--model_args gen_length=100000: the model takes 128 positions"),
    ("PATH,remasking=best", "--model_args remasking='best': not a remasking rule"),
    ("PATH,mask_token_id=60000", "--model_args mask_token_id=60000: the model embeds token ids 0..50303"),
    (f"PATH,mask_token_id={10**30}", f"--model_args mask_token_id={10**30}: out of range"),
])
def test_bad_model_args_exit_2_with_one_line_naming_the_key_the_value_and_a_remedy(
        tiny_runs, task_folder, offline_lm_eval, capsys, args, said) -> None:
    import torch.distributed as dist

    line = _exit(capsys, args.replace("PATH", f"path={tiny_runs['mdm'][0]}"), task_folder)
    assert said in line, line
    assert not dist.is_initialized()  # a model loaded before the refusal was released


def test_a_damaged_checkpoint_exits_2_naming_the_file(tiny_runs, task_folder, offline_lm_eval, capsys,
                                                      tmp_path) -> None:
    from checkpoint_files_kit import linked_copy

    run, _ = linked_copy(tiny_runs["mdm"][0], tmp_path)
    (run / "checkpoints" / "latest").write_bytes(b"\xff\xfe\x00")
    line = _exit(capsys, f"path={run}", task_folder)
    assert "--model_args path=" in line and "latest" in line and "not UTF-8" in line and "Fix" not in line, line
    assert "iter_* folder" in line, line  # the fix


def test_an_unknown_task_exits_2_naming_it(tiny_runs, task_folder, offline_lm_eval, capsys) -> None:
    line = _exit(capsys, f"path={tiny_runs['mdm'][0]}", task_folder, task="no_such_task_zz")
    assert "Tasks not found" in line and "no_such_task_zz" in line and "fix:" in line, line


def test_model_args_are_refused_before_the_checkpoint_is_read(monkeypatch) -> None:
    """A bad key or number costs no checkpoint load (minutes for a large model)."""
    from dlmspec.backends.generate.lm_eval_model import DlmspecLM, ModelArgsError

    def no_load(*args, **kwargs):
        raise AssertionError("the checkpoint was read")

    monkeypatch.setattr(lm_eval_model, "from_path", no_load)
    for args in ({"path": "run", "kind": "zz"}, {"path": "run", "mc_samples": "abc"}, {"path": "run", "eps": -1},
                 {"path": "run", "progress": False}, {"path": "run", "mc_sample": 4}):
        with pytest.raises(ModelArgsError):
            DlmspecLM.create_from_arg_obj(args)
    with pytest.raises(ModelArgsError, match="tokenizer: not a dlmspec model argument"):
        DlmspecLM.create_from_arg_string("path=run,tokenizer=gpt2")
