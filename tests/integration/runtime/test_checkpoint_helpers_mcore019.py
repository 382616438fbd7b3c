"""The checkpoint-writer helper is started on megatron-core 0.16 (``_get_write_results_queue``) and on
0.19 (renamed ``get_write_results_queue``: the compiled demo stopped at start-up there on the H200,
bench/results/te_matrix_h200_runs/mc19-local-bf16.log)."""

from __future__ import annotations

import types

import pytest

from dlmspec.backends.megatron import checkpointing


@pytest.mark.parametrize("name", ["_get_write_results_queue", "get_write_results_queue"])
def test_the_write_results_queue_is_started_under_either_name(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    calls = []
    fake = types.SimpleNamespace(**{name: lambda: calls.append(name)})
    import megatron.core.dist_checkpointing.strategies as strategies

    monkeypatch.setattr(strategies, "filesystem_async", fake, raising=False)
    monkeypatch.setitem(__import__("sys").modules, "megatron.core.dist_checkpointing.strategies.filesystem_async", fake)
    checkpointing.prestart_checkpoint_helpers()
    assert calls == [name]


def test_a_megatron_core_without_either_name_starts_nothing_and_does_not_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.SimpleNamespace()
    import megatron.core.dist_checkpointing.strategies as strategies

    monkeypatch.setattr(strategies, "filesystem_async", fake, raising=False)
    monkeypatch.setitem(__import__("sys").modules, "megatron.core.dist_checkpointing.strategies.filesystem_async", fake)
    checkpointing.prestart_checkpoint_helpers()  # save() then starts its own helper on the first save
