"""The RL stage's frozen reference model after a resume equals an uninterrupted run's at the same
step (backends/rl/stage.py): after a refresh the checkpoint carries the reference's weights; with
``ref_model_sync_steps = 0`` the reference is ``checkpoint.init_from``'s weights again and the
checkpoint carries none. The whole of ``train()`` on CPU (tests/kits/rl_loop_kit.py), with an
optimizer that moves the weights (the kit's does not), so the policy at the stop differs from the
policy at the last refresh."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from megatron.core.utils import unwrap_model

from dlmspec.backends.megatron import training
from dlmspec.backends.megatron.config import ObjectiveConfig
from dlmspec.backends.rl.stage import RLConfig, RLStage

from rl_kit import ROWS, CharTokenizer, core
from rl_loop_kit import MASK, _Optimizer, _run, _train, cpu_train  # noqa: F401 (fixture)


class _MovingOptimizer(_Optimizer):
    """Each step maps every weight ``w -> 0.9 w + 0.01``: a function of the weights alone, so a
    resumed run moves them exactly as an uninterrupted one."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def step(self):
        with torch.no_grad():
            for chunk in self.model:
                for p in chunk.parameters():
                    p.mul_(0.9).add_(0.01)
        return super().step()


def _rl_run(root: Path, **changes):
    schedule = {**dict(micro_batch_size=2, global_batch_size=4, train_iters=4, eval_interval=None), **changes}
    init_from = schedule.pop("init_from", None)
    run = _run(root, **schedule)
    return dataclasses.replace(run, objective=ObjectiveConfig(kind="mdm", mask_token_id=MASK),
                               checkpoint=dataclasses.replace(run.checkpoint, init_from=init_from))


def _stage(run, sync: int) -> RLStage:
    options = RLConfig(algorithm="diffu-grpo", grpo_group_size=2, grpo_prompts_per_step=2, grpo_kl_beta=0.04,
                       ref_model_sync_steps=sync, chat_template="plain", prompts="p.jsonl",
                       rewards=(("builtin:exact_match", 1.0),),
                       generate=dict(gen_length=8, steps=8, block_length=8, temperature=1.0))
    return RLStage(run, options, core=core(), tokenizer=CharTokenizer())


def _weights(chunks):
    return {k: v.clone() for k, v in unwrap_model(chunks[0]).state_dict().items() if isinstance(v, torch.Tensor)}


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _setup(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(training, "get_megatron_optimizer", lambda config, model: _MovingOptimizer(model))


def _straight_and_resumed(tmp_path: Path, sync: int, stop: int, **changes):
    straight = _rl_run(tmp_path / "straight", **changes)
    uninterrupted = _stage(straight, sync)
    _train(straight, uninterrupted)
    split = _rl_run(tmp_path / "split", stop_at_iteration=stop, **changes)
    _train(split, _stage(split, sync))
    resumed_run = dataclasses.replace(split, schedule=dataclasses.replace(split.schedule, stop_at_iteration=None))
    resumed = _stage(resumed_run, sync)
    result = _train(resumed_run, resumed)
    assert result.resumed_from == stop and result.iteration == 4
    return uninterrupted, resumed


def test_a_resumed_reference_is_the_policy_of_the_last_refresh(tmp_path, cpu_train, monkeypatch) -> None:
    _setup(tmp_path, monkeypatch)
    # refreshed at step 2, stopped after step 3 moved the policy: the reference is the policy of step 2
    uninterrupted, resumed = _straight_and_resumed(tmp_path, sync=2, stop=3)
    want, got = _weights(uninterrupted.reference), _weights(resumed.reference)
    assert not _same(want, _weights(uninterrupted._model))  # the policy moved after the refresh
    assert _same(got, want)
    assert uninterrupted.reference_synced_at == resumed.reference_synced_at == 2


def test_a_never_refreshed_reference_is_reloaded_from_init_from(tmp_path, cpu_train, monkeypatch) -> None:
    _setup(tmp_path, monkeypatch)
    seed_run = _rl_run(tmp_path / "seed", train_iters=2)
    _train(seed_run, _stage(seed_run, 0))
    init_from = f"mcore:{seed_run.checkpoint.save_dir}"
    uninterrupted, resumed = _straight_and_resumed(tmp_path, sync=0, stop=3, init_from=init_from)
    want, got = _weights(uninterrupted.reference), _weights(resumed.reference)
    assert not _same(want, _weights(uninterrupted._model))
    assert _same(got, want)
    assert resumed.reference_synced_at == 0 and "reference" not in resumed.state_dict()  # no weights kept
