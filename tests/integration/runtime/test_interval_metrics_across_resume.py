"""A ``train`` record whose log interval spans a resume: the stage's metrics (the RL stage's
``rl/...`` values, masked diffusion's scalars) average the same steps as an uninterrupted run's,
because the checkpoint keeps the interval's report sums beside its loss sums
(backends/megatron/checkpointing.py: ``interval_sums``). The whole of ``train()`` on CPU, one
process (tests/kits/rl_checkpoint_kit.py)."""

from __future__ import annotations

import dataclasses

import torch

from dlmspec.backends.megatron import training
from dlmspec.backends.megatron.checkpointing import interval_sums_state, restore_interval_sums

from rl_checkpoint_kit import MovingOptimizer, resumed, rl_run, rl_stage, train_rl, write_prompts
from rl_loop_kit import _events, cpu_train  # noqa: F401 (fixture)


def _every_two_steps(run):
    return dataclasses.replace(run, logging=dataclasses.replace(run.logging, log_interval=2))


def test_a_record_spanning_a_resume_averages_the_stages_metrics_over_the_whole_interval(
        tmp_path, cpu_train, monkeypatch) -> None:
    write_prompts(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(training, "get_megatron_optimizer", lambda config, model: MovingOptimizer(model))
    straight = _every_two_steps(rl_run(tmp_path / "straight"))
    train_rl(straight, rl_stage(straight, 2))
    split = _every_two_steps(rl_run(tmp_path / "split", stop_at_iteration=3))  # the interval 3-4 is cut after 3
    train_rl(split, rl_stage(split, 2))
    again = resumed(split)
    train_rl(again, rl_stage(again, 2))

    def last(run):
        return [e for e in _events(run) if e["event"] == "train"][-1]

    want, got = last(straight), last(again)
    assert got["iteration"] == want["iteration"] == 4
    for key in ("loss", "rl/kl", "rl/clip_fraction", "rl/ratio_mean", "rl/rows_trained"):
        assert got[key] == want[key], (key, got[key], want[key])


def test_interval_sums_come_back_exactly_in_their_dtype_and_shape() -> None:
    sums = {"a": torch.tensor([1.0 / 3.0, 2.5], dtype=torch.float32),
            "b": torch.tensor([[1e-300, 3.0], [0.1, 7.0]], dtype=torch.float64)}
    back = restore_interval_sums(interval_sums_state(sums), torch.device("cpu"))
    assert back.keys() == sums.keys()
    for key, value in sums.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape
        assert torch.equal(back[key], value)
    assert restore_interval_sums({"x": {"dtype": "no_such_dtype", "values": [1.0]}, "y": 3}, torch.device("cpu")) == {}
    assert restore_interval_sums(None, torch.device("cpu")) == {}
