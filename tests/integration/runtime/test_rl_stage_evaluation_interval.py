"""An RL stage with an evaluation interval: it has no validation data (its prompts are its data), so
an evaluation gives no validation loss; the run goes on, writes no ``valid`` record and saves its
checkpoint. The whole of ``train()`` on CPU, one process (tests/kits/rl_checkpoint_kit.py)."""

from __future__ import annotations

from dlmspec.backends.megatron import training

from rl_checkpoint_kit import MovingOptimizer, rl_run, rl_stage, train_rl, write_prompts
from rl_loop_kit import _events, cpu_train  # noqa: F401 (fixture)


def test_an_rl_run_evaluating_every_two_steps_finishes_without_a_validation_record(
        tmp_path, cpu_train, monkeypatch) -> None:
    write_prompts(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(training, "get_megatron_optimizer", lambda config, model: MovingOptimizer(model))
    run = rl_run(tmp_path / "rl", eval_interval=2)
    train_rl(run, rl_stage(run, 2))
    events = _events(run)
    kinds = [e["event"] for e in events]
    assert "valid" not in kinds
    assert [e["iteration"] for e in events if e["event"] == "train"][-1] == 4
    assert kinds[-1] == "exit" and events[-1]["iteration"] == 4
    assert [p.name for p in (tmp_path / "rl").rglob("iter_0000004") if p.is_dir()]
