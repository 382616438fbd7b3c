"""The RL job's start line on its rollout rows (backends/rl/stage.py row_length_line): the longest
rendered prompt plus gen_length beside train.seq_length, the row length the plan priced, and what to
set when a row is longer."""

from __future__ import annotations

from types import SimpleNamespace

from dlmspec.backends.rl.stage import row_length_line


def _engine(prompts, gen_length):
    return SimpleNamespace(prompt_ids=prompts, config=SimpleNamespace(generate={"gen_length": gen_length}))


def test_rows_within_seq_length_are_stated_without_a_warning():
    line = row_length_line(_engine([[1] * 16, [1] * 12], 8), 32)
    assert line == "rl: longest rollout row 24 positions (prompt 16 + gen_length 8), train.seq_length 32"


def test_a_row_longer_than_seq_length_says_what_to_set():
    line = row_length_line(_engine([[1] * 16, [1] * 20], 64), 32)
    assert "longest rollout row 84 positions (prompt 20 + gen_length 64)" in line
    assert line.endswith("set train.seq_length = 84")
