"""The RL stage (backends/rl/stage.py) through the whole of ``train()`` on CPU: a tiny megatron-core
GPTModel samples rollouts through the stage seam's logits function, the policy loss runs through
the loop's step, the ``rl/...`` metrics reach metrics.jsonl, samples reach rollouts.jsonl, the
frozen reference comes from the model factory, and a resumed run draws the rollouts of an
uninterrupted one (the rollout RNG and prompt order in the checkpoint)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from dlmspec.backends.megatron.config import ObjectiveConfig
from dlmspec.backends.megatron.stages import STAGES, build_stage
from dlmspec.backends.rl.stage import RLConfig, RLStage

from rl_kit import ROWS, CharTokenizer, core
from rl_loop_kit import MASK, _events, _run, _train, cpu_train  # noqa: F401 (fixture)


def _rl_run(tmp_path: Path, **schedule):
    run = _run(tmp_path, **{**dict(micro_batch_size=2, global_batch_size=4, train_iters=4, eval_interval=None),
                            **schedule})
    return dataclasses.replace(run, objective=ObjectiveConfig(kind="mdm", mask_token_id=MASK))


def _options(**changes) -> RLConfig:
    base = dict(algorithm="diffu-grpo", grpo_group_size=2, grpo_prompts_per_step=2, grpo_kl_beta=0.04,
                ref_model_sync_steps=2, chat_template="plain", sample_log_interval=1,
                rewards=(("builtin:exact_match", 1.0), ("format.py:starts_with_digit", 0.5)),
                generate=dict(gen_length=8, steps=8, block_length=8, temperature=1.0))
    base.update(changes)
    return RLConfig(**base)


def _stage(run, **changes) -> RLStage:
    stage = RLStage(run, _options(**changes), core=core(), tokenizer=CharTokenizer())
    return stage


def _prompts(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")


def test_the_rl_kind_builds_the_rl_stage() -> None:
    stage = build_stage("rl", _rl_run(Path("unused")), _options())
    assert isinstance(stage, RLStage) and STAGES["rl"] is RLStage and stage.kind == "rl-diffu-grpo"


def test_train_runs_rl_steps_and_logs_rollout_metrics(tmp_path, cpu_train, monkeypatch) -> None:
    _prompts(tmp_path)
    monkeypatch.chdir(tmp_path)
    run = _rl_run(tmp_path)
    stage = _stage(run, prompts="p.jsonl")
    result = _train(run, stage)
    assert (result.iteration, result.exit_reason) == (4, "completed")
    events = _events(run)
    assert events[0]["objective"] == "rl-diffu-grpo"
    train = [e for e in events if e["event"] == "train"]
    assert train and all(math.isfinite(e["loss"]) for e in train)
    for key in ("rl/reward_mean", "rl/kl", "rl/clip_fraction", "rl/completion_length", "rl/eos_share",
                "rl/rollout_seconds", "rl/rollout_tokens_per_s", "rl/accuracy", "rl/reward/exact_match_mean",
                "rl/reward/starts_with_digit_mean", "rl/flat_group_share", "rl/update_seconds", "rl/reward_seconds"):
        assert key in train[-1], key
    assert stage.reference is not None and all(not p.requires_grad for p in stage.reference[0].parameters())
    samples = [json.loads(x) for x in (Path(run.logging.run_dir) / "rollouts.jsonl").read_text().splitlines()]
    assert len(samples) == 4 * 4 and {s["step"] for s in samples} == {0, 1, 2, 3}
    meta = json.loads((Path(run.checkpoint.save_dir) / "iter_0000004" / "dlmspec.json").read_text())
    assert meta["rl"]["algorithm"] == "diffu-grpo" and meta["rl"]["grpo_group_size"] == 2


def test_no_reference_is_built_without_a_kl_penalty(tmp_path, cpu_train, monkeypatch) -> None:
    _prompts(tmp_path)
    monkeypatch.chdir(tmp_path)
    run = _rl_run(tmp_path, train_iters=2)
    stage = _stage(run, prompts="p.jsonl", grpo_kl_beta=0.0)
    _train(run, stage)
    assert stage.reference is None


def test_a_resumed_run_draws_the_rollouts_of_an_uninterrupted_one(tmp_path, cpu_train, monkeypatch) -> None:
    _prompts(tmp_path)
    monkeypatch.chdir(tmp_path)
    straight = _rl_run(tmp_path / "straight")
    _train(straight, _stage(straight, prompts="p.jsonl", grpo_iterations=2))
    want = [json.loads(x) for x in (Path(straight.logging.run_dir) / "rollouts.jsonl").read_text().splitlines()]

    split = _rl_run(tmp_path / "split", stop_at_iteration=2)
    _train(split, _stage(split, prompts="p.jsonl", grpo_iterations=2))
    resumed = dataclasses.replace(split, schedule=dataclasses.replace(split.schedule, stop_at_iteration=None))
    result = _train(resumed, _stage(resumed, prompts="p.jsonl", grpo_iterations=2))
    assert result.resumed_from == 2 and result.iteration == 4
    got = [json.loads(x) for x in (Path(split.logging.run_dir) / "rollouts.jsonl").read_text().splitlines()]
    key = [(s["step"], s["prompt_id"], s["completion"]) for s in want]
    assert [(s["step"], s["prompt_id"], s["completion"]) for s in got] == key
    assert {s["step"] for s in want} == {0, 2}  # a rollout batch every grpo_iterations = 2 steps


def test_start_checks_refuse_a_missing_or_malformed_prompts_file(tmp_path, capsys) -> None:
    from dlmspec.backends.rl.rollout import default_core

    run = _rl_run(tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{"answer": "3"}\n')
    for name in ("none.jsonl", "bad.jsonl"):
        options = _options(prompts=str(tmp_path / name))
        with pytest.raises(SystemExit) as info:
            RLStage(run, options, core=default_core(options)).start_checks()
        err = capsys.readouterr().err
        assert info.value.code == 2 and name in err and "Traceback" not in err, err
    assert "bad.jsonl:2:" in err  # the malformed row, by file and line
