"""Reward functions that raise, hang, return a non-number or crash their worker are contained:
each failure is reported with its prompt id and kind, the other calls are scored, and the pool
keeps working. Plus the builtins and the refusal of functions that do not load."""

from __future__ import annotations

import math
import textwrap
import time

import pytest

from dlmspec.backends.rl.rewards import RewardFunction, RewardPool, RewardPoolError

pytestmark = pytest.mark.xdist_group("subprocess")

REWARDS = textwrap.dedent('''
    import os, time

    def length(prompt, completion, **row):
        return float(len(completion))

    def raising(prompt, completion, prompt_id, **row):
        if prompt_id == "p1":
            raise ZeroDivisionError("no reward for p1")
        return 1.0

    def hanging(prompt, completion, prompt_id, **row):
        if prompt_id == "p2":
            time.sleep(60)
        return 2.0

    def wordy(prompt, completion, prompt_id, **row):
        return "high" if prompt_id == "p0" else 3

    def crashing(prompt, completion, prompt_id, **row):
        if prompt_id == "p3":
            os._exit(7)
        return 4.0

    def uses_extra(prompt, completion, answer, level, **row):
        return float(completion == answer) + level

    def greedy(prompt, completion, **row):
        return float(len(bytearray(4 << 30)))

    def heavy_modules_loaded(prompt, completion, **row):
        import sys
        return float(sum(name in sys.modules for name in ("torch", "megatron", "numpy")))
''')

ROWS = [{"prompt": f"q{i}", "completion": "x" * (i + 1), "prompt_id": f"p{i}", "answer": "xx", "level": 10}
        for i in range(5)]


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rewards") / "my_rewards.py"
    path.write_text(REWARDS)
    return path


def test_raising_hanging_non_numeric_and_crashing_rewards_are_contained(reward_file):
    names = ["length", "raising", "hanging", "wordy", "crashing"]
    functions = [RewardFunction(f"{reward_file}:{n}", weight=w) for n, w in zip(names, [1.0, 1.0, 0.5, 1.0, 2.0])]
    with RewardPool(functions, workers=2, timeout_s=1.0) as pool:
        started = time.monotonic()
        scores = pool.score(ROWS)
        elapsed = time.monotonic() - started
        found = {(f.prompt_id, f.function.rsplit(":", 1)[1]): f for f in scores.failures}
        assert set(found) == {("p1", "raising"), ("p2", "hanging"), ("p0", "wordy"), ("p3", "crashing")}
        assert found["p1", "raising"].kind == "raised" and "ZeroDivisionError: no reward for p1" in found["p1", "raising"].message
        assert found["p2", "hanging"].kind == "timeout"
        assert found["p0", "wordy"].kind == "not_a_number" and "'high'" in found["p0", "wordy"].message
        assert found["p3", "crashing"].kind == "crashed" and "exit code 7" in found["p3", "crashing"].message
        assert scores.failure_counts() == {"raised": 1, "timeout": 1, "not_a_number": 1, "crashed": 1}
        # Every other call is scored.
        assert scores.values[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
        failed = {(int(p[1]), names.index(n)) for p, n in found}
        for r in range(5):
            for f in range(5):
                assert math.isnan(scores.values[r, f]) == ((r, f) in failed)
        # The total is the weighted sum, nan where a call failed: only p4 has every call.
        assert scores.total[4].item() == pytest.approx(5.0 + 1.0 + 0.5 * 2.0 + 3.0 + 2.0 * 4.0)
        assert all(math.isnan(scores.total[r].item()) for r in range(4))
        assert elapsed < 20, f"one 1 s timeout took the batch {elapsed:.1f} s"
        assert pool.replaced == 2  # the hung worker and the crashed one
        # The pool keeps working: a second batch is scored in full by the replaced workers.
        clean = [dict(row, prompt_id="p4") for row in ROWS[:2]]
        again = pool.score(clean)
        assert again.failures == [] and again.values[:, 0].tolist() == [1.0, 2.0]


def test_extra_row_fields_reach_the_function_as_keywords(reward_file):
    with RewardPool([RewardFunction(f"{reward_file}:uses_extra")], workers=1, timeout_s=5.0) as pool:
        scores = pool.score(ROWS[:3])
    assert scores.values[:, 0].tolist() == [10.0, 11.0, 10.0]


def test_builtin_format_reward_recognises_final_answer_formats():
    rows = [{"prompt": "q", "completion": c, "prompt_id": i} for i, c in
            enumerate(["so #### 72", "the answer is \\boxed{7}", "\\boxed{}", "\\boxed{7", "it is 72", "####"])]
    with RewardPool([RewardFunction("builtin:format")], workers=1, timeout_s=5.0) as pool:
        scores = pool.score(rows)
    assert scores.values[:, 0].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("spec,message", [
    ("{dir}/missing.py:f", "no such file"),
    ("{dir}/my_rewards.py:nope", "defines no 'nope'"),
    ("builtin:accuracy", "no builtin reward 'accuracy'"),
    ("{dir}/my_rewards.py", "not 'path/to/file.py:function'"),
    ("{dir}/broken.py:f", "executing it raised SyntaxError"),
])
def test_a_reward_function_that_does_not_load_is_refused_by_name(reward_file, spec, message):
    (reward_file.parent / "broken.py").write_text("def f(:\n")
    spec = spec.format(dir=reward_file.parent)
    with pytest.raises(RewardPoolError, match=message) as info:
        RewardPool([RewardFunction(spec)], workers=1, timeout_s=1.0)
    assert "Fix:" in str(info.value)


def test_bad_pool_arguments_are_refused():
    with pytest.raises(ValueError, match="at least one reward"):
        RewardPool([])
    with pytest.raises(ValueError, match="weight = 'x'"):
        RewardPool([RewardFunction("builtin:format", weight="x")])
    with pytest.raises(ValueError, match="workers = 0"):
        RewardPool([RewardFunction("builtin:format")], workers=0)
    with pytest.raises(ValueError, match="memory_limit_mb = 10"):
        RewardPool([RewardFunction("builtin:format")], memory_limit_mb=10)
    with pytest.raises(ValueError, match="timeout_s = 0"):
        RewardPool([RewardFunction("builtin:format")], timeout_s=0)


def test_builtin_exact_match_reward_compares_final_answers_and_reports_a_row_without_answer():
    rows = [{"prompt": "q", "completion": c, "prompt_id": i, "answer": "#### 1,234"} for i, c in
            enumerate(["so #### 1234", "\\boxed{1,234}", "1234.", "#### 123", "nothing"])]
    rows.append({"prompt": "q", "completion": "#### 5", "prompt_id": "no-answer"})
    with RewardPool([RewardFunction("builtin:exact_match")], workers=1, timeout_s=5.0) as pool:
        scores = pool.score(rows)
    assert scores.values[:5, 0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert len(scores.failures) == 1
    failure = scores.failures[0]
    assert (failure.prompt_id, failure.kind) == ("no-answer", "raised") and "no 'answer' field" in failure.message


def test_reward_workers_are_fresh_interpreters_without_torch(reward_file):
    import torch  # noqa: F401 - the parent has it loaded

    with RewardPool([RewardFunction(f"{reward_file}:heavy_modules_loaded")], workers=1, timeout_s=5.0) as pool:
        scores = pool.score(ROWS[:1])
    assert scores.values[0, 0].item() == 0.0


def test_a_reward_allocating_past_the_memory_cap_is_a_reported_failure(reward_file):
    functions = [RewardFunction(f"{reward_file}:greedy"), RewardFunction(f"{reward_file}:length")]
    with RewardPool(functions, workers=1, timeout_s=5.0, memory_limit_mb=1024) as pool:
        scores = pool.score(ROWS[:2])
    assert [(f.prompt_id, f.kind) for f in scores.failures] == [("p0", "raised"), ("p1", "raised")]
    assert "MemoryError" in scores.failures[0].message
    assert scores.values[:, 1].tolist() == [1.0, 2.0]
