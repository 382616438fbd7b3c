"""The RL stage's frozen reference model in checkpoints (backends/rl/stage.py, backends/megatron/
checkpointing.py): saved with megatron-core's distributed checkpointing beside the policy, its
tensors under the ``rl_reference.`` key prefix, and restored on resume, so that a resumed run
holds the reference, draws the rollouts and logs the losses of an uninterrupted run. The whole of
``train()`` on CPU, one process (tests/kits/rl_checkpoint_kit.py). A checkpoint that records
the reference's weights without holding them is refused with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlmspec.backends.checkpoint_safety import check_common_file, dist_load_tensors_metadata
from dlmspec.backends.megatron import training
from dlmspec.backends.rl.stage import RLStage

from rl_checkpoint_kit import (MovingOptimizer, resumed, rl_options, rl_run, rl_stage, same, train_rl, weights,
                               write_prompts)
from rl_kit import CharTokenizer, core
from rl_loop_kit import _events, cpu_train  # noqa: F401 (fixture)


def _setup(tmp_path: Path, monkeypatch) -> None:
    write_prompts(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(training, "get_megatron_optimizer", lambda config, model: MovingOptimizer(model))


def _records(run, event: str):
    return [e for e in _events(run) if e["event"] == event]


def _samples(run):
    lines = (Path(run.logging.run_dir) / "rollouts.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_resumed_run_holds_the_refreshed_reference_and_repeats_the_uninterrupted_losses_and_rollouts(
        tmp_path, cpu_train, monkeypatch) -> None:
    _setup(tmp_path, monkeypatch)
    straight = rl_run(tmp_path / "straight")
    uninterrupted = rl_stage(straight, 2)
    train_rl(straight, uninterrupted)
    split = rl_run(tmp_path / "split", stop_at_iteration=3)  # refreshed at step 2, stopped after step 3
    train_rl(split, rl_stage(split, 2))
    again = resumed(split)
    stage = rl_stage(again, 2)
    result = train_rl(again, stage)
    assert (result.resumed_from, result.iteration) == (3, 4)

    want, got = weights(uninterrupted.reference), weights(stage.reference)
    assert not same(want, weights(uninterrupted._model))  # the policy moved after the refresh
    assert same(got, want)  # bit for bit
    assert stage.reference_synced_at == uninterrupted.reference_synced_at == 2
    # the step after the resume: the same rollouts, rewards, KL to the reference and loss
    assert [(s["step"], s["prompt_id"], s["completion"], s["rewards"]) for s in _samples(split)] == \
        [(s["step"], s["prompt_id"], s["completion"], s["rewards"]) for s in _samples(straight)]
    last_want, last_got = _records(straight, "train")[-1], _records(again, "train")[-1]
    assert last_got["iteration"] == last_want["iteration"] == 4
    for key in ("loss", "rl/kl", "rl/reward_mean", "rl/clip_fraction", "rl/ratio_mean"):
        assert last_got[key] == last_want[key], key


def test_the_reference_is_saved_under_its_own_keys_beside_the_policy(tmp_path, cpu_train, monkeypatch) -> None:
    _setup(tmp_path, monkeypatch)
    run = rl_run(tmp_path / "run", stop_at_iteration=3)
    stage = rl_stage(run, 2)
    train_rl(run, stage)
    meta = dist_load_tensors_metadata(Path(run.checkpoint.save_dir) / "iter_0000003")
    reference = {k[len("rl_reference."):]: v for k, v in meta.items() if k.startswith("rl_reference.")}
    policy = {k: v for k, v in meta.items() if k.startswith(("embedding.", "decoder.", "output_layer."))}
    assert reference and reference.keys() == policy.keys()
    assert all(tuple(reference[k].global_shape) == tuple(policy[k].global_shape) for k in policy)
    common = check_common_file(Path(run.checkpoint.save_dir) / "iter_0000003")["stage"]
    assert (common["reference_synced_at"], common["reference_saved"]) == (2, True)
    # the weights are no longer in each rank's state (kept with its RNG states)
    assert set(stage.state_dict()) == {"engine", "rollout"}


def test_a_never_refreshed_reference_adds_no_tensors_and_comes_back_from_init_from(
        tmp_path, cpu_train, monkeypatch) -> None:
    _setup(tmp_path, monkeypatch)
    seed_run = rl_run(tmp_path / "seed", train_iters=2)
    train_rl(seed_run, rl_stage(seed_run, 0))
    init_from = f"mcore:{seed_run.checkpoint.save_dir}"
    straight = rl_run(tmp_path / "straight", init_from=init_from)
    uninterrupted = rl_stage(straight, 0)
    train_rl(straight, uninterrupted)
    split = rl_run(tmp_path / "split", init_from=init_from, stop_at_iteration=3)
    train_rl(split, rl_stage(split, 0))
    meta = dist_load_tensors_metadata(Path(split.checkpoint.save_dir) / "iter_0000003")
    assert not [k for k in meta if k.startswith("rl_reference.")]
    again = resumed(split)
    stage = rl_stage(again, 0)
    train_rl(again, stage)
    assert stage.reference_synced_at == 0
    assert same(weights(stage.reference), weights(uninterrupted.reference))
    assert not same(weights(stage.reference), weights(stage._model))


class _RecordWithoutWeights(RLStage):
    """Records reference weights in ``common.pt`` but writes none (a damaged checkpoint)."""

    def sharded_state_dict(self):
        state = super().sharded_state_dict()
        state.pop("reference", None)
        return state


def test_a_checkpoint_missing_the_recorded_reference_weights_is_refused_with_exit_2(
        tmp_path, cpu_train, monkeypatch, capsys) -> None:
    _setup(tmp_path, monkeypatch)
    split = rl_run(tmp_path / "rl", stop_at_iteration=3)
    train_rl(split, _RecordWithoutWeights(split, rl_options(2), core=core(), tokenizer=CharTokenizer()))
    again = resumed(split)
    with pytest.raises(SystemExit) as exc:
        train_rl(again, rl_stage(again, 2))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    folder = str(tmp_path / "rl" / "ckpt" / "iter_0000003")
    assert f"train.py: {folder}: the checkpoint records the RL reference model's weights" in err
    assert "cannot be read" in err and "rl_reference.decoder" in err  # the missing tensor named
    save_dir = tmp_path / "rl" / "ckpt"
    assert f"Fix: resume from the checkpoint before it (write that folder's name into {save_dir}/latest)" in err
    assert "Traceback" not in err


def test_a_reference_kept_as_init_from_without_init_from_on_resume_is_refused_with_exit_2(
        tmp_path, cpu_train, monkeypatch, capsys) -> None:
    _setup(tmp_path, monkeypatch)
    seed_run = rl_run(tmp_path / "seed", train_iters=2)
    train_rl(seed_run, rl_stage(seed_run, 0))
    split = rl_run(tmp_path / "rl", init_from=f"mcore:{seed_run.checkpoint.save_dir}", stop_at_iteration=3)
    train_rl(split, rl_stage(split, 0))
    again = rl_run(tmp_path / "rl")  # the relaunch dropped checkpoint.init_from
    with pytest.raises(SystemExit) as exc:
        train_rl(again, rl_stage(again, 0))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    folder = str(tmp_path / "rl" / "ckpt" / "iter_0000003")
    assert f"train.py: {folder}: its RL reference model is checkpoint.init_from's weights" in err
    assert "Fix: set checkpoint.init_from to the value the run started with" in err and "Traceback" not in err
