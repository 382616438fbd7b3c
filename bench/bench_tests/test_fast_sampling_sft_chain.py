"""The fast-sampling suite trains the task model that learns: pre-training on the task text, then SFT in
LLaDA's layout from that checkpoint, scored on the held-out prompts rendered with its chat template.

The plan (``--dry``), the prompt rendering (``fast_measure.py render``), a training stopped by its
time limit (SIGTERM first, so the runtime saves a checkpoint) and the launcher's chain with stub
commands (the SFT data tokenised in the background and waited for before the SFT stage's compile; a
pre-training stopped by its limit with a checkpoint lets the chain go on) are checked on CPU.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from bench.bench_tests import fast_sampling_kit as kit
from bench.sampling import fast_measure, fast_sampling

ROOT = Path(__file__).resolve().parents[2]


def _lines(out: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.splitlines())


def test_the_default_run_pretrains_then_tunes_from_that_checkpoint_and_scores_the_tuned_model(tmp_path, capsys):
    rc = fast_sampling.main(["--dry", *kit.suite_inputs(tmp_path)], probe=lambda python: None)
    out, err = capsys.readouterr()
    assert rc == 0, err
    names = [line.split(":", 1)[0] for line in out.splitlines()]
    assert names == ["task", "data-sft-train", "data-sft-validation", "data-sft-canvas-train",
                     "data-sft-canvas-validation", "data-train", "data-validation", "render", "compile", "train",
                     "compile-sft", "train-sft", "compile-sft-canvas", "train-sft-canvas", "peer-install",
                     "measure-dlmspec", "measure-peers", "report", "result"]
    lines, work = _lines(out), tmp_path / "work"
    # the fixed-width task the CPU study found learnable, with its SFT pairs
    assert "task make addition-padded" in lines["task"] and "--digits 3" in lines["task"]
    for split in ("train", "validation"):
        sft = lines[f"data-sft-{split}"]
        assert "--sft --chat-template plain" in sft and f"sft-{split}.jsonl" in sft
        assert "--seq-length 24" in sft  # the SFT spec's rows (the RL chain's): the prompt, the answer and EODs
        canvas = lines[f"data-sft-canvas-{split}"]  # the same pairs in rows of the measured canvas: 24 - 8 + 32
        assert "--sft --chat-template plain" in canvas and f"sft-{split}.jsonl" in canvas and "--seq-length 48" in canvas
    assert f"render --template plain --task-dir {work}/task --out {work}/task-chat" in lines["render"]
    assert "train.train_iters=400" in lines["compile"] and "model.qk_layernorm=false" in lines["compile"]
    sft_compile = lines["compile-sft"]
    assert "specs/task-addition-dlm-sft.toml" in sft_compile
    assert f"checkpoint.init_from=\"mcore:{work}/run/checkpoints\"" in sft_compile
    assert "model.qk_layernorm=false" in sft_compile  # the same model as the pre-training (and LLaDA-exportable)
    assert "train.seq_length=24" in sft_compile and "train.train_iters=900" in sft_compile
    # scored every 100 iterations, saved three times: the canvas stage goes on from its last checkpoint
    assert "checkpoint.save_interval=300" in sft_compile and "train.eval_interval=100" in sft_compile
    assert f'eval.generation.prompts="{work}/task-chat/validation.jsonl"' in sft_compile
    # the second stage: from the first one's last checkpoint, on 48-token rows, scored on the measured canvas
    canvas_compile = lines["compile-sft-canvas"]
    assert f"checkpoint.init_from=\"mcore:{work}/run-sft/checkpoints\"" in canvas_compile
    assert f"task-sft-canvas-train_text_document" in canvas_compile and "train.seq_length=48" in canvas_compile
    assert "train.train_iters=300" in canvas_compile and "model.qk_layernorm=false" in canvas_compile
    assert all(f"generate.{k}" in canvas_compile for k in ("gen_length=32", "steps=32", "block_length=8"))
    assert "checkpoint.save_interval=100" in canvas_compile and "train.eval_interval=100" in canvas_compile
    assert f'eval.generation.prompts="{work}/task-chat/validation.jsonl"' in canvas_compile
    assert f"--ckpt {work}/run-sft-canvas/checkpoints" in lines["measure-dlmspec"]
    assert f"--task-dir {work}/task-chat" in lines["measure-dlmspec"]  # prompts in the SFT model's template
    assert lines["result"].endswith("-fast-task-addition-dlm-sft-gen32-b1-8-32.json")


def test_the_sft_rows_keep_the_spec_length_unless_given_and_a_missing_sft_spec_is_named(tmp_path, capsys):
    flags = kit.suite_inputs(tmp_path)
    assert fast_sampling.main(["--dry", "--gen-length", "64", "--steps", "64", *flags], probe=lambda p: None) == 0
    lines = _lines(capsys.readouterr().out)
    assert "--seq-length 24" in lines["data-sft-train"] and "train.seq_length=24" in lines["compile-sft"]
    assert "--seq-length 80" in lines["data-sft-canvas-train"] and "generate.gen_length=64" in lines["compile-sft-canvas"]
    assert fast_sampling.main(["--dry", "--sft-seq-length", "88", *flags], probe=lambda p: None) == 0
    lines = _lines(capsys.readouterr().out)
    assert "--seq-length 88" in lines["data-sft-train"] and "train.seq_length=88" in lines["compile-sft"]
    assert "train.seq_length=112" in lines["compile-sft-canvas"]  # the rows' prompt part (88 - 8) and 32
    # a canvas as long as the rows, or --sft-canvas-iters 0: one stage
    for extra in (["--gen-length", "8", "--steps", "8"], ["--sft-canvas-iters", "0"]):
        assert fast_sampling.main(["--dry", *extra, *flags], probe=lambda p: None) == 0
        lines = _lines(capsys.readouterr().out)
        assert "compile-sft-canvas" not in lines and "data-sft-canvas-train" not in lines
        assert f"--ckpt {tmp_path}/work/run-sft/checkpoints" in lines["measure-dlmspec"]
    rc = fast_sampling.main(["--dry", "--sft-spec", str(tmp_path / "absent-sft.toml"), *flags], probe=lambda p: None)
    err = capsys.readouterr().err
    assert rc == 2 and "absent-sft.toml" in err and "--stage pretrain" in err


def _task(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("test.jsonl", 3), ("validation.jsonl", 2)):
        rows = [{"id": f"{name}-{i}", "prompt": f" {i} 0 + 0 {i} =", "answer": f" 0 {i} {i}"} for i in range(n)]
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_render_puts_each_prompt_in_the_chat_template_with_the_generation_prompt(tmp_path):
    from dlmspec.data.chat import render, text_of

    task = _task(tmp_path / "task")
    assert fast_measure.main(["render", "--template", "plain", "--task-dir", str(task), "--out", str(tmp_path / "c")]) == 0
    for name in fast_measure.RENDERED:
        before = [json.loads(line) for line in (task / name).read_text().splitlines()]
        after = [json.loads(line) for line in (tmp_path / "c" / name).read_text().splitlines()]
        assert len(after) == len(before)
        for b, a in zip(before, after):
            assert a["prompt"] == text_of(render("plain", [{"role": "user", "content": b["prompt"]}],
                                                 add_generation_prompt=True))
            assert a["prompt"].startswith("User:") and a["prompt"].endswith("Assistant:\n")
            assert (a["answer"], a["id"]) == (b["answer"], b["id"])


@pytest.mark.parametrize("damage, why", [
    (lambda p: p.write_text('{"id": "x", "prompt": " 1 + 1 ="}\n[1, 2]\n'), "test.jsonl:2: needs a string key 'prompt'"),
    (lambda p: (p.unlink(), p.mkdir()), "test.jsonl"),  # not a regular file
])
def test_render_refuses_a_bad_task_file_with_its_name_and_exit_2(tmp_path, capsys, damage, why):
    task = _task(tmp_path / "task")
    damage(task / "test.jsonl")
    assert fast_measure.main(["render", "--template", "plain", "--task-dir", str(task), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err
    assert not (tmp_path / "c" / "test.jsonl").exists()


_TRAP = """
import signal, sys, time, pathlib
def stop(*_):
    pathlib.Path(sys.argv[1]).write_text("saved on SIGTERM")
    sys.exit(1)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_step_past_its_limit_gets_sigterm_before_sigkill(tmp_path):
    marker = tmp_path / "saved"
    start = time.time()
    with open(tmp_path / "log", "wb") as log:
        code, stopped = fast_sampling.run_step([sys.executable, "-c", _TRAP, str(marker)], tmp_path, dict(os.environ),
                                               log, limit=2.0, grace=20.0)
    assert stopped and code == 1
    assert marker.read_text() == "saved on SIGTERM"
    assert time.time() - start < 15  # it exited on the signal, not at the SIGKILL


def _stub(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_chain_waits_for_the_background_sft_data_and_goes_on_from_a_stopped_pretraining(tmp_path, monkeypatch,
                                                                                            capsys):
    work = tmp_path / "work"
    marker = work / "sft-data-done"
    checkpoint = "import pathlib; p = pathlib.Path('{run}/checkpoints/iter_0000001'); p.mkdir(parents=True); " \
                 "(p / 'dlmspec.json').write_text('{{}}')"
    steps = [
        ("task", _stub("pass"), {}),
        ("data-sft-train", _stub(f"import time, pathlib; time.sleep(2); pathlib.Path({str(marker)!r}).write_text('x')"), {}),
        ("data-sft-validation", _stub("pass"), {}),
        ("train", _stub(checkpoint.format(run=work / "run") + "\n" + _TRAP), {}),
        # the SFT stage's compile sees the background step's output, or fails
        ("compile-sft", _stub(f"import pathlib, sys; sys.exit(0 if pathlib.Path({str(marker)!r}).exists() else 3)"), {}),
        ("train-sft", _stub(checkpoint.format(run=work / "run-sft")), {}),
        ("measure-dlmspec", _stub("pass"), {}),
    ]
    monkeypatch.setattr(fast_sampling, "plan", lambda args, w, out: [(n, c + [str(tmp_path / "sigterm")], e)
                                                                     if n == "train" else (n, c, e) for n, c, e in steps])
    monkeypatch.setattr(fast_sampling, "STOP_GRACE_S", 10.0)
    flags = kit.suite_inputs(tmp_path)
    rc = fast_sampling.main([*flags, "--train-timeout-s", "3", "--budget-s", "300", "--measure-reserve-s", "20"],
                            probe=lambda p: None)
    out = capsys.readouterr().out
    assert rc == 1  # partial: the pre-training was stopped, nothing was measured
    result = json.loads(next((tmp_path / "results" / "sampling").glob("*.json")).read_text())
    record = result["values"]["steps"]
    assert record["data-sft-train"]["background"] and record["data-sft-train"]["returncode"] == 0
    assert record["train"]["returncode"] == 1 and record["train"]["stopped_at_s"] == 3
    assert "latest checkpoint is used" in record["train"]["note"]
    assert (tmp_path / "sigterm").read_text() == "saved on SIGTERM"
    assert record["compile-sft"]["returncode"] == 0 and record["train-sft"]["returncode"] == 0
    assert record["measure-dlmspec"]["returncode"] == 0
    assert result["values"]["settings"]["scored_model"].startswith("SFT")
    assert "stopped by its limit" in out
