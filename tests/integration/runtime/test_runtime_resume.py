"""Exact resume on CPU: what a resumed run carries into step k+1 is what an
uninterrupted one carries.

The whole of ``train()`` runs twice with the pre-training stage on megatron's mock data (the
one-process gloo world and fakes of :mod:`test_runtime_loop`): once for 6 steps, and once
stopped after step 3 (its checkpoint, written by the runtime's own ``save_checkpoint``
through megatron-core's ``dist_checkpointing``) and launched again to 6. The optimizer is a
fake that never changes the weights, so the logged losses depend only on the data and the mask
draws. For every step after the stop the two runs must agree exactly on the Python, numpy and
torch RNG states at the step's start, the sample tokens of its microbatches, the objective's
draws (noise levels, masks, truncated lengths), megatron-core's ``OptimizerParamScheduler``
state and learning rate, and the logged training and validation losses.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from dlmspec.backends.megatron import checkpointing, training
from dlmspec.backends.megatron.stage import PretrainStage

from runtime_loop_kit import _Optimizer, _run, _train, cpu_train_world

TRAIN_ITERS, STOP = 6, 3


class RecordingStage(PretrainStage):
    """The pre-training stage, recording each step's RNG states, sample tokens and draws."""

    def __init__(self, run) -> None:
        super().__init__(run)
        self.steps = {}

    def before_step(self, iteration, model) -> None:
        self.steps[iteration] = {
            "rng": (random.getstate(), np.random.get_state(), torch.get_rng_state()),
            "tokens": [], "draws": [],
        }
        super().before_step(iteration, model)

    def forward_step(self, data_iterator, model):
        item = next(data_iterator)
        if item.stream == 0:  # training microbatches (validation ones are compared by their loss)
            ob, _, _ = self._forward_step.prepare(item)
            record = self.steps[item.iteration]
            record["tokens"].append(item.batch["tokens"].clone())
            record["draws"].append((ob.mask_ratio, ob.masked, ob.lengths, ob.input_ids))
        return super().forward_step(iter([item]), model)


class RecordingOptimizer(_Optimizer):
    """The fake optimizer, recording the learning rate, weight decay and scheduler state each
    ``step()`` sees (the scheduler is the runtime's real ``OptimizerParamScheduler``)."""

    def __init__(self) -> None:
        super().__init__()
        self.param_groups = [{"params": [], "lr": 0.0, "weight_decay": 0.0}]
        self.seen = []
        self.scheduler = None

    def step(self):
        group = self.param_groups[0]
        self.seen.append((group["lr"], group["weight_decay"], dict(self.scheduler.state_dict())))
        return super().step()


def _launch(tmp_path, monkeypatch, **schedule):
    """One ``train()`` of the pre-training stage; returns (stage, optimizer, metrics events)."""
    optimizer = RecordingOptimizer()
    build = training.build_scheduler

    def build_scheduler(*args, **kwargs):
        optimizer.scheduler = build(*args, **kwargs)
        return optimizer.scheduler

    monkeypatch.setattr(training, "get_megatron_optimizer", lambda config, model: optimizer)
    monkeypatch.setattr(training, "build_scheduler", build_scheduler)
    run = _run(tmp_path, train_iters=TRAIN_ITERS, eval_interval=STOP, eval_iters=1, lr_warmup_iters=2, **schedule)
    run.checkpoint.save_interval = STOP
    run.logging.log_interval = 2  # the stop (3) falls inside a log interval (3-4)
    stage = RecordingStage(run)
    _train(run, stage)
    events = [json.loads(line) for line in (Path(run.logging.run_dir) / "metrics.jsonl").read_text().splitlines()]
    return stage, optimizer, events


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(uninterrupted, resumed): each a (stage, optimizer, events) of 6 steps; the resumed run
    is the second launch after a first one stopped at step 3 (made once for the module)."""
    tmp_path = tmp_path_factory.mktemp("resume")
    with pytest.MonkeyPatch.context() as monkeypatch:
        with cpu_train_world(tmp_path_factory, monkeypatch):
            yield _launch_all(tmp_path, monkeypatch)


def _launch_all(tmp_path, monkeypatch):
    whole = _launch(tmp_path / "whole", monkeypatch)
    load = checkpointing.dist_checkpointing.load
    # the fake optimizer's empty state is dropped by megatron's loader: hand it back
    monkeypatch.setattr(checkpointing.dist_checkpointing, "load", lambda *a, **k: {**load(*a, **k), "optimizer": {}})
    first = _launch(tmp_path / "stopped", monkeypatch, stop_at_iteration=STOP)
    assert sorted(first[0].steps) == list(range(STOP))
    resumed = _launch(tmp_path / "stopped", monkeypatch)
    assert sorted(resumed[0].steps) == list(range(STOP, TRAIN_ITERS))
    assert [e["iteration"] for e in resumed[2] if e["event"] == "resume"] == [STOP]
    return whole, resumed


def test_rng_states_after_the_stop_are_the_uninterrupted_runs(runs) -> None:
    (whole, _, _), (resumed, _, _) = runs
    for it in range(STOP, TRAIN_ITERS):
        (pw, nw, tw), (pr, nr, tr) = whole.steps[it]["rng"], resumed.steps[it]["rng"]
        assert pw == pr, f"python random state differs at step {it + 1}"
        assert nw[0] == nr[0] and np.array_equal(nw[1], nr[1]) and nw[2:] == nr[2:], f"numpy differs at {it + 1}"
        assert torch.equal(tw, tr), f"torch CPU RNG state differs at step {it + 1}"


def test_data_order_and_draws_after_the_stop_are_the_uninterrupted_runs(runs) -> None:
    (whole, _, _), (resumed, _, _) = runs
    for it in range(STOP, TRAIN_ITERS):
        w, r = whole.steps[it], resumed.steps[it]
        assert len(w["tokens"]) == len(r["tokens"]) == 2  # 4 samples = 2 microbatches of 2
        for tw, tr in zip(w["tokens"], r["tokens"]):
            assert torch.equal(tw, tr), f"step {it + 1} reads other samples after the resume"
        for dw, dr in zip(w["draws"], r["draws"]):
            assert all(torch.equal(x, y) for x, y in zip(dw, dr)), f"step {it + 1} draws other masks"
    # not vacuous: the steps read different samples and draw different masks
    assert not torch.equal(whole.steps[STOP]["tokens"][0], whole.steps[STOP + 1]["tokens"][0])
    assert not torch.equal(whole.steps[STOP]["draws"][0][1], whole.steps[STOP + 1]["draws"][0][1])


def test_scheduler_state_after_the_stop_is_the_uninterrupted_runs(runs) -> None:
    (_, whole, _), (_, resumed, _) = runs
    assert len(whole.seen) == TRAIN_ITERS and len(resumed.seen) == TRAIN_ITERS - STOP
    assert resumed.seen == whole.seen[STOP:]
    assert [s[2]["num_steps"] for s in resumed.seen] == list(range(STOP, TRAIN_ITERS))
    assert len({s[0] for s in whole.seen}) == TRAIN_ITERS  # warm-up then cosine: every lr differs


def test_logged_losses_after_the_stop_are_the_uninterrupted_runs(runs) -> None:
    (_, _, whole), (_, _, resumed) = runs

    def losses(events, kind):
        return {e["iteration"]: e["loss"] for e in events if e["event"] == kind and e["iteration"] > STOP}

    assert losses(whole, "valid") == losses(resumed, "valid") != {}
    # the record at step 4 is the mean of steps 3 and 4 in both: the stopped run's step 3 is
    # carried through the checkpoint
    assert losses(whole, "train") == losses(resumed, "train")
    assert sorted(losses(whole, "train")) == [4, 6]
