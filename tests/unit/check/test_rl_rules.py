"""The RL stage's rules (dlmspec/check/rl.py): each fires on a spec that breaks it, and its remedy,
applied, makes it pass; reward files are parsed, never imported; the prompts file is read through
dlmspec.files."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest

from dlmspec.check import RULES, find
from dlmspec.spec.models import Spec
from spec_kit import spec_dict

#: 8 GPUs (DP 8), 8 prompts x 8 completions = the global batch of 64.
BASE: dict[str, Any] = spec_dict({
    "model.num_layers": 8, "train.eval_interval": None,
    "checkpoint.init_from": "hf:m", "checkpoint.save": "runs/t/checkpoints",
    "stage.kind": "rl", "stage.rl": {"prompts": "p.jsonl", "grpo_group_size": 8, "grpo_prompts_per_step": 8},
    "generate.temperature": 0.9,
})
SCOPES = ("spec", "paths")


def spec(changes: dict[str, Any] | None = None, unset: tuple[str, ...] = ()) -> Spec:
    data = copy.deepcopy(BASE)
    for key, value in (changes or {}).items():
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    for key in unset:
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node.get(part, {})
        node.pop(last, None)
    return Spec.model_validate(data)


def rl_issues(s: Spec) -> list:
    return [i for i in find(SCOPES, s) if i.rule.startswith("rl-")]


def test_the_base_rl_spec_is_clean(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    assert rl_issues(spec()) == []


#: (rule, changes, the key it names). Each fix, applied to the changed spec, clears the rule.
CASES = [
    ("rl-objective", {"stage.rl.algorithm": "grpo"}, "stage.rl.algorithm"),
    ("rl-objective", {"stage.rl.estimator": "ar"}, "stage.rl.estimator"),
    ("rl-batch", {"stage.rl.grpo_group_size": 4}, "train.global_batch_size"),
    ("rl-prompts-per-rank", {"stage.rl.grpo_prompts_per_step": 4, "stage.rl.grpo_group_size": 16},
     "stage.rl.grpo_prompts_per_step"),
    ("rl-group-microbatch", {"stage.rl.loss_normalization": "group"}, "stage.rl.loss_normalization"),
    ("rl-pipeline", {"parallel.pipeline_model_parallel_size": 2}, "parallel.pipeline_model_parallel_size"),
    ("rl-reference-fsdp", {"parallel.fsdp": "megatron"}, "parallel.fsdp"),
    ("rl-rollout-sampling", {"generate.temperature": 0.0}, "generate.temperature"),
    ("rl-reference-sync", {"stage.rl.grpo_kl_beta": 0.0, "stage.rl.ref_model_sync_steps": 16},
     "stage.rl.ref_model_sync_steps"),
    ("rl-clip-iterations", {"stage.rl.grpo_clamp_eps_upper": 0.28}, "stage.rl.grpo_clamp_eps_upper"),
    ("rl-row-length", {"train.seq_length": 64, "generate.gen_length": 64, "generate.steps": 64,
                       "generate.block_length": 64}, "train.seq_length"),
    ("rl-reward-function", {"stage.rl.rewards": [{"function": "builtin:accuracy"}]}, "stage.rl.rewards.0.function"),
    ("rl-reward-function", {"stage.rl.rewards": [{"function": "no_colon"}]}, "stage.rl.rewards.0.function"),
]


def _apply(changes: dict[str, Any], fix) -> dict[str, Any]:
    out = dict(changes)
    for key, value in fix.set.items():
        if key.startswith("stage.rl.rewards."):
            out["stage.rl.rewards"] = [{"function": value}]
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("rule, changes, key", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_rule_fires_and_its_remedy_clears_it(rule: str, changes: dict[str, Any], key: str, tmp_path,
                                               monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    found = [i for i in rl_issues(spec(changes)) if i.rule == rule and i.key == key]
    assert found, rl_issues(spec(changes))
    issue = found[0]
    assert issue.severity == RULES[rule].severity and issue.message and issue.hint
    assert issue.fix is not None
    fixed = spec(_apply(changes, issue.fix), unset=tuple(issue.fix.unset))
    assert not [i for i in rl_issues(fixed) if i.rule == rule], rl_issues(fixed)


def test_an_rl_spec_without_prompts_is_refused_naming_the_key() -> None:
    (issue,) = [i for i in find(SCOPES, spec(unset=("stage.rl.prompts",))) if i.rule == "rl-table-missing"]
    assert issue.key == "stage.rl.prompts" and "prompts.jsonl" in issue.hint


def test_a_reward_file_is_parsed_never_imported(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    marker = tmp_path / "imported"
    (tmp_path / "rewards.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                         "def correct(prompt, completion, **row):\n    return 1.0\n")
    assert rl_issues(spec({"stage.rl.rewards": [{"function": "rewards.py:correct"}]})) == []
    (issue,) = rl_issues(spec({"stage.rl.rewards": [{"function": "rewards.py:accuracy"}]}))
    assert issue.rule == "rl-reward-function" and "defines no 'accuracy'" in issue.message
    assert "correct" in issue.hint
    assert not marker.exists()


def test_reward_files_that_cannot_be_used_are_named_with_why(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "broken.py").write_text("def correct(:\n")
    (tmp_path / "aio.py").write_text("async def correct(prompt, completion):\n    return 1.0\n")
    os.mkfifo(tmp_path / "fifo.py")  # never opened for reading: a pipe would block validate
    cases = {"broken.py:correct": "not valid Python (line 1", "aio.py:correct": "async def",
             "pkg.rewards:correct": "not a Python file", "fifo.py:correct": "not a regular file"}
    for function, why in cases.items():
        found = rl_issues(spec({"stage.rl.rewards": [{"function": function}]}))
        assert [i.rule for i in found] == ["rl-reward-function"] and why in found[0].message, (function, found)
        assert found[0].severity == "error"
    assert rl_issues(spec({"stage.rl.rewards": [{"function": "gone.py:correct"}]})) == []
    (missing,) = [i for i in find(SCOPES, spec({"stage.rl.rewards": [{"function": "gone.py:correct"}]}))
                  if i.key == "stage.rl.rewards.0.function"]
    assert (missing.rule, missing.severity) == ("path-not-found", "warning") and "gone.py" in missing.message


def test_the_prompts_file_is_checked_through_the_file_reader(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"question": "1+1="}\n')
    (tmp_path / "notjson.jsonl").write_text("prompt: 1+1\n")
    os.mkfifo(tmp_path / "fifo.jsonl")
    for path, why in {"bad.jsonl": 'string "prompt"', "notjson.jsonl": "not JSON", "fifo.jsonl": "not a regular file",
                      ".": "not a regular file"}.items():
        found = rl_issues(spec({"stage.rl.prompts": path}))
        assert [i.rule for i in found] == ["rl-prompts-file"] and why in found[0].message, (path, found)


def test_rl_is_no_longer_refused_by_the_runtime_rules(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    assert [i for i in find(("runtime",), spec()) if i.severity == "error"] == []
    assert "runtime-rl" not in RULES


@pytest.mark.parametrize("normalization, micro_batch", [("sequence", 3), ("group", 6)])
def test_the_batch_remedy_also_sets_a_micro_batch_that_splits_the_new_global_batch(normalization, micro_batch, tmp_path,
                                                                               monkeypatch) -> None:
    """A group size of 6 makes the rollout batch 48 = 6 per rank over DP 8, which a micro batch of 4 does not
    divide: the fix sets both, and the fixed spec has no batch error left (rl-batch, batch-divisible,
    rl-group-microbatch)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    changes = {"stage.rl.grpo_group_size": 6, "train.micro_batch_size": 4, "train.global_batch_size": 64,
               "stage.rl.loss_normalization": normalization}
    (issue,) = [i for i in find(SCOPES, spec(changes)) if i.rule == "rl-batch"]
    assert issue.fix.set == {"train.global_batch_size": 48, "train.micro_batch_size": micro_batch}
    assert "train.micro_batch_size = %d" % micro_batch in issue.hint
    fixed = spec({**changes, **issue.fix.set})
    batch_rules = {"rl-batch", "batch-divisible", "rl-group-microbatch"}
    assert not [i for i in find(SCOPES, fixed) if i.rule in batch_rules], find(SCOPES, fixed)


REWARDS = """\
def ok(prompt, completion, **row):
    return 1.0
ok_lambda = lambda prompt, completion, **row: 1.0
def ok_star(*args, **kwargs):
    return 1.0
def one_argument(text):
    return 1.0
def three_required(prompt, completion, answer, **row):
    return 1.0
def no_keywords(prompt, completion, answer=None):
    return 1.0
a_value = 3
class Scorer:
    pass
from math import isclose as imported
"""


@pytest.mark.parametrize("name, why", [
    ("ok", None), ("ok_lambda", None), ("ok_star", None), ("Scorer", None), ("imported", None),
    ("one_argument", "takes 1 positional argument"), ("three_required", "requires 3 positional arguments"),
    ("no_keywords", "takes no **keywords"), ("a_value", "is not a function"),
])
def test_a_reward_is_refused_when_its_definition_cannot_take_the_jobs_call(name, why, tmp_path, monkeypatch) -> None:
    """The job calls name(prompt, completion, **row) (backends/rl/reward_worker.py score_one), row holding
    prompt_id and the row's other fields: a def or lambda that cannot take it, or a name bound to a value,
    is refused at validate; what only the job can tell (a class, an import) passes."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "rewards.py").write_text(REWARDS)
    found = rl_issues(spec({"stage.rl.rewards": [{"function": f"rewards.py:{name}"}]}))
    if why is None:
        assert found == []
        return
    (issue,) = found
    assert issue.rule == "rl-reward-function" and why in issue.message, issue.message
    assert f"def {name}(prompt, completion, **row)" in issue.hint


def test_a_missing_reward_file_beside_a_close_name_is_answered_with_that_name(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "my").mkdir()
    (tmp_path / "my" / "rewards.py").write_text("def concise(prompt, completion, **row):\n    return 1.0\n")
    found = [i for i in find(SCOPES, spec({"stage.rl.rewards": [{"function": "my/reward.py:concise"}]}))
             if i.rule == "path-not-found" and i.key == "stage.rl.rewards.0.function"]
    (issue,) = found
    assert "did you mean 'my/rewards.py'?" in issue.message, issue.message
