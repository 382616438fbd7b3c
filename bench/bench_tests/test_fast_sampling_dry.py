"""The fast-sampling launcher's ``--dry``: the plan of commands, exit 0 only when everything the GPU
run needs is present, else exit 2 naming each missing piece and the command that gets it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from utc_dates_kit import call_with_dates

from bench.bench_tests import fast_sampling_kit as kit
from bench.sampling import fast_sampling

ROOT = Path(__file__).resolve().parents[2]


def _present(tmp: Path) -> list[str]:
    """Flags pointing at a complete set of the run's inputs made in ``tmp``, with the demo spec."""
    spec = tmp / "task-addition-dlm.toml"
    shutil.copyfile(ROOT / "specs" / "demo-dlm.toml", spec)
    return kit.suite_inputs(tmp, spec)


def test_dry_prints_every_step_in_order_and_exits_0_when_everything_is_present(tmp_path, capsys):
    rc, dates = call_with_dates(lambda: fast_sampling.main(
        ["--dry", "--stage", "pretrain", "--train-iters", "300", *_present(tmp_path)], probe=lambda python: None))
    out, err = capsys.readouterr()
    assert rc == 0, err
    names = [line.split(":", 1)[0] for line in out.splitlines()]
    assert names == ["task", "data-train", "data-validation", "compile", "train", "peer-install", "measure-dlmspec",
                     "measure-peers", "report", "result"]
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert "task make addition-padded" in lines["task"] and "--test 512" in lines["task"]
    assert "--append-eod" in lines["data-train"] and "pretrain-train.jsonl" in lines["data-train"]
    assert "--workers 8" in lines["data-train"] and "--workers 1" in lines["data-validation"]
    # LLaDA's modelling code (which Fast-dLLM runs) has no q/k norm: the task model is trained without it
    assert "model.qk_layernorm=false" in lines["compile"] and "train.train_iters=300" in lines["compile"]
    assert "checkpoint.save_interval=150" in lines["compile"]  # a half-way checkpoint survives a stopped training
    assert "launch.sh" in lines["train"] and "DLMSPEC_PYTHON=" in lines["train"]
    assert "transformers==4.49.0" in lines["peer-install"] and "--no-index" in lines["peer-install"]
    for side in ("measure-dlmspec", "measure-peers"):
        assert "--batches 1,8,32" in lines[side] and "--eval-prompts 512" in lines[side]
    assert "--llada-out" in lines["measure-dlmspec"] and "--fast-dllm" in lines["measure-peers"]
    assert lines["result"] in {str(tmp_path / "results" / "sampling" / f"{day}-cpu-fast-task-addition-dlm-gen32-b1-8-32.json")
                               for day in dates}
    assert not (tmp_path / "results").exists() and not (tmp_path / "work").exists()  # --dry writes nothing


def test_dry_exits_2_naming_each_missing_piece_and_the_command_that_gets_it(tmp_path, capsys):
    flags = ["--fast-dllm", str(tmp_path / "none"), "--peer-wheels", str(tmp_path / "none"), "--tokenizer-dir",
             str(tmp_path / "none"), "--spec", str(tmp_path / "absent.toml"), "--work-dir", str(tmp_path / "work")]
    rc = fast_sampling.main(["--dry", *flags], probe=lambda python: "this dlmspec has no `dlmspec task make`")
    out, err = capsys.readouterr()
    assert rc == 2
    assert "measure-peers:" in out  # the plan is still printed
    missing = [line for line in err.splitlines() if line.startswith("missing: ")]
    for piece in ("llada/generate.py", "llada/model/modeling_llada.py", "COMMIT", "transformers-4.49.0-*",
                  "tokenizers-0.21.*", "vocab.json", "absent.toml", "dlmspec task make"):
        assert any(piece in line for line in missing), piece
    assert all("get it with: " in line for line in missing)
    assert sum("bash bench/devbox/fetch_fast_dllm.sh" in line for line in missing) >= 8


def test_a_measured_checkpoint_skips_training_and_needs_only_the_peers_files(tmp_path, capsys):
    flags = _present(tmp_path)
    task = tmp_path / "task"
    task.mkdir()
    (task / "test.jsonl").write_text('{"id": "a", "prompt": " 1 + 2 =", "answer": " 3"}\n')
    rc = fast_sampling.main(["--dry", "--ckpt", str(tmp_path / "ckpt"), "--task-dir", str(task), *flags],
                            probe=lambda python: pytest.fail("the task generator is not needed with --ckpt"))
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert [line.split(":", 1)[0] for line in out.splitlines()] == ["peer-install", "measure-dlmspec", "measure-peers",
                                                                   "report", "result"]


@pytest.mark.parametrize("argv, why", [
    (["--test", "100"], "at least 500 held-out prompts"),
    (["--gen-length", "60", "--block-length", "16"], "multiple of --block-length"),
    (["--only", "dlmspec/none/bogus"], "unknown configuration"),
    (["--ckpt", "x"], "--ckpt needs --task-dir"),
])
def test_settings_that_cannot_run_exit_2_with_the_flag_and_a_value_that_works(argv, why, capsys):
    with pytest.raises(SystemExit) as exc:
        fast_sampling.main(["--dry", *argv])
    assert exc.value.code == 2
    assert why in capsys.readouterr().err


def test_a_spec_with_generation_eval_is_scored_on_the_validation_split_not_the_held_out_one(tmp_path, capsys):
    flags = _present(tmp_path)
    spec = Path(flags[flags.index("--spec") + 1])
    spec.write_text(spec.read_text() + '\n[eval.generation]\nprompts = ".data/task-addition/test.jsonl"\n')
    assert fast_sampling.main(["--dry", "--stage", "pretrain", *flags], probe=lambda python: None) == 0
    compile_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("compile: "))
    work = tmp_path / "work"
    assert f'eval.generation.prompts="{work}/task/validation.jsonl"' in compile_line


def test_what_a_configuration_did_not_measure_is_listed_so_the_run_is_marked_partial():
    complete = {"timing": {"1": {}, "8": {}}, "accuracy": {"accuracy": 0.5}}
    assert fast_sampling._missing_parts(complete, [1, 8]) == []
    cut = {"timing": {"1": {}}, "cut": ["accuracy: deadline"]}
    assert fast_sampling._missing_parts(cut, [1, 8]) == ["timing b8", "accuracy", "accuracy: deadline"]
    assert fast_sampling._missing_parts({"skipped": "no cache key"}, [1]) == ["skipped: no cache key"]
    assert fast_sampling._missing_parts(None, [1]) == ["not run"]
