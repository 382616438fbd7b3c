"""Checkpoints that keep the RL reference model per rank (the format of earlier dlmspec versions,
written here by tests/kits/rl_checkpoint_kit.py :class:`PerRankReferenceStage`): they resume in the
layout they were saved in with the reference restored; in another layout a refreshed reference
is refused with exit code 2 and a message naming the checkpoint and the fix, and one never
refreshed is read again from ``checkpoint.init_from``."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlmspec.backends.megatron import training

from rl_checkpoint_kit import (MovingOptimizer, resumed, rl_run, rl_stage, run_world, same, train_rl, weights,
                               write_prompts)
from rl_loop_kit import cpu_train  # noqa: F401 (fixture)


def _setup(tmp_path: Path, monkeypatch) -> None:
    write_prompts(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(training, "get_megatron_optimizer", lambda config, model: MovingOptimizer(model))


def test_a_per_rank_reference_checkpoint_resumes_in_its_own_layout(tmp_path, cpu_train, monkeypatch) -> None:
    _setup(tmp_path, monkeypatch)
    split = rl_run(tmp_path / "rl", stop_at_iteration=3)
    writer = rl_stage(split, 2, per_rank=True)
    train_rl(split, writer)
    again = resumed(split)
    stage = rl_stage(again, 2)
    result = train_rl(again, stage)
    assert result.resumed_from == 3 and stage.reference_synced_at == 2
    assert not same(weights(writer.reference), weights(writer._model))
    assert same(weights(stage.reference), weights(writer.reference))


def test_a_refreshed_per_rank_reference_in_another_layout_is_refused_with_exit_2(
        tmp_path, cpu_train, monkeypatch, capsys) -> None:
    _setup(tmp_path, monkeypatch)
    written = run_world(tmp_path, 2, tag="writer", root=tmp_path / "rl", sync=2, stop=3, per_rank=True)
    assert all(o["code"] == 0 for o in written)
    again = rl_run(tmp_path / "rl")
    with pytest.raises(SystemExit) as exc:
        train_rl(again, rl_stage(again, 2))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    folder = str(tmp_path / "rl" / "ckpt" / "iter_0000003")
    assert f"train.py: {folder}: this checkpoint keeps the RL reference model's weights per rank" in err
    assert "another parallel layout" in err and "refreshed at step 2" in err
    fix = f"Fix: resume it once with the parallel layout it was saved with (parallel_layout in {folder}/dlmspec.json)"
    assert fix in err
    assert "Traceback" not in err


def test_a_never_refreshed_per_rank_reference_in_another_layout_is_read_from_init_from(
        tmp_path, cpu_train, monkeypatch) -> None:
    _setup(tmp_path, monkeypatch)
    seed_run = rl_run(tmp_path / "seed", train_iters=2)
    seed = rl_stage(seed_run, 0)
    train_rl(seed_run, seed)
    init_from = f"mcore:{seed_run.checkpoint.save_dir}"
    written = run_world(tmp_path, 2, tag="writer", root=tmp_path / "rl", sync=0, stop=3, per_rank=True,
                        init_from=init_from)
    assert all(o["code"] == 0 and o["synced_at"] == 0 for o in written)
    again = rl_run(tmp_path / "rl", init_from=init_from)
    stage = rl_stage(again, 0)
    assert train_rl(again, stage).resumed_from == 3
    assert same(weights(stage.reference), weights(seed._model))  # init_from's weights
    assert same(weights(stage.reference), written[0]["reference"])
    assert not same(weights(stage.reference), weights(stage._model))
