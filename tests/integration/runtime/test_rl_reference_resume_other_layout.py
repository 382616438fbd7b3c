"""A checkpoint's RL reference model resumes in another parallel layout (backends/rl/stage.py:
megatron-core's distributed checkpointing reshards it): two data-parallel ranks to one, one to
two, and tensor parallelism 1 to 2. Each run is a spawned gloo world of CPU processes
(tests/kits/rl_checkpoint_kit.py :func:`run_world`): the writer is refreshed at step 2 and stops
after step 3, so its reference (the policy of step 2) differs from its policy; the resumed run
trains step 4, which refreshes nothing, so its reference must equal the writer's. The one-rank
writer runs once for the two tests that resume it (each in a copy of its folder)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rl_checkpoint_kit import run_world, same, write_prompts


def _writer(tmp_path: Path, ranks: int):
    write_prompts(tmp_path)
    out = run_world(tmp_path, ranks, tag="writer", root=tmp_path / "rl", sync=2, stop=3)
    assert all(o["code"] == 0 and o["synced_at"] == 2 for o in out)
    return out


@pytest.fixture(scope="module")
def one_rank_written(tmp_path_factory) -> tuple[Path, dict]:
    """The one-rank writer's folder (prompts, ``rl/`` with its checkpoint of step 3) and outcome,
    run once for the tests that resume it in another layout (each resumes a copy)."""
    folder = tmp_path_factory.mktemp("one-rank-writer")
    (writer,) = _writer(folder, 1)
    return folder, writer


def _copy_of(written: tuple[Path, dict], tmp_path: Path) -> dict:
    """The one-rank writer's folder copied into ``tmp_path``; returns its outcome."""
    folder, writer = written
    shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
    return writer


def test_a_two_rank_checkpoint_resumes_its_reference_on_one_rank(tmp_path) -> None:
    writer = _writer(tmp_path, 2)
    assert same(writer[0]["reference"], writer[1]["reference"])  # data-parallel replicas
    (got,) = run_world(tmp_path, 1, tag="resumed", root=tmp_path / "rl", sync=2)
    assert (got["code"], got["resumed_from"], got["synced_at"]) == (0, 3, 2)
    assert same(got["reference"], writer[0]["reference"])


def test_a_one_rank_checkpoint_resumes_its_reference_on_two_ranks(tmp_path, one_rank_written) -> None:
    writer = _copy_of(one_rank_written, tmp_path)
    got = run_world(tmp_path, 2, tag="resumed", root=tmp_path / "rl", sync=2)
    for rank in got:
        assert (rank["code"], rank["resumed_from"], rank["synced_at"]) == (0, 3, 2)
        assert same(rank["reference"], writer["reference"])


def _plain(folder: Path, prefix: str) -> dict:
    """The tensors of a checkpoint whose keys start with ``prefix`` (whole, unsharded)."""
    from megatron.core.dist_checkpointing import load_plain_tensors

    return {k: v for k, v in load_plain_tensors(str(folder)).items()
            if k.startswith(prefix) and isinstance(v, torch.Tensor)}


def test_a_tensor_parallel_resume_reshards_the_reference(tmp_path, gloo_world, one_rank_written) -> None:
    # written at TP = 1, resumed at TP = 2 (each rank loads its slices), which trains step 4 and
    # saves it: the reference that TP = 2 run writes back equals the one it read, bit for bit
    _copy_of(one_rank_written, tmp_path)
    got = run_world(tmp_path, 2, tag="resumed", root=tmp_path / "rl", sync=2, tp=2)
    assert all((r["code"], r["resumed_from"], r["synced_at"]) == (0, 3, 2) for r in got)
    q = "decoder.layers.self_attention.linear_qkv.weight"
    assert got[0]["reference"]["decoder.layers.0.self_attention.linear_qkv.weight"].shape[0] * 2 == \
        _plain(tmp_path / "rl" / "ckpt" / "iter_0000003", "rl_reference." + q)["rl_reference." + q].shape[1]
    before = _plain(tmp_path / "rl" / "ckpt" / "iter_0000003", "rl_reference.")
    after = _plain(tmp_path / "rl" / "ckpt" / "iter_0000004", "rl_reference.")
    assert before and same(after, before)
    policy = _plain(tmp_path / "rl" / "ckpt" / "iter_0000004", "decoder.")
    assert not torch.equal(policy[q], after["rl_reference." + q])  # not a copy of the policy
