"""Spec.isoflop: each (budget, size) member trains for the whole steps whose FLOPs, as the planner
counts them, are nearest the budget; members are named by size, budget and tokens; the schedule
follows the steps; a budget below half a step is refused at the user's line."""

from __future__ import annotations

import pytest

from dlmspec.dsl import Spec
from dlmspec.errors import SpecError
from dlmspec.params import count_parameters
from dlmspec.plan import make_plan
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from dlmspec.spec.python_load import sweep_targets

BUDGETS = [3e13, 1e14]
SIZES = [5e5, 2e6, 8e6]


@pytest.mark.parametrize("base_name", ["demo-dlm", "demo-ar"])
def test_each_member_spends_its_budget_within_half_a_step(base_name):
    base = Spec.load(base_name)
    members = Spec.isoflop(base, BUDGETS, SIZES)
    assert len(members) == len(BUDGETS) * len(SIZES)
    for (budget, size), (name, spec) in zip([(c, n) for c in BUDGETS for n in SIZES], members.items()):
        resolved = resolve(spec)
        per_step = make_plan(resolved).to_dict()["flops"]["model_per_step"]
        spent = resolved.train_iters * per_step
        assert abs(spent - budget) <= per_step / 2, name
        assert spec.train.train_iters == resolved.train_iters and spec.train.train_tokens is None
        n = count_parameters(spec.model).non_embedding
        assert abs(n - size) <= 0.02 * size
        tokens = resolved.train_iters * spec.train.global_batch_size * spec.train.seq_length
        assert spec.description.endswith(f"{tokens:,} tokens = {spent:.4g} training FLOPs "
                                         f"(isoFLOP budget {budget:.4g}, planner's count)")


def test_larger_models_get_fewer_tokens_of_the_same_budget():
    members = Spec.isoflop(Spec.load("demo-dlm"), [1e14], SIZES)
    steps = [spec.train.train_iters for spec in members.values()]
    assert steps == sorted(steps, reverse=True) and len(set(steps)) == len(steps)


def test_member_names_are_unique_and_say_size_budget_and_tokens():
    members = Spec.isoflop(Spec.load("demo-dlm"), [3e13, 1.2e14], [5e5, 1.5e6])
    assert list(members) == [
        "demo-dlm-c3e13-n500k-d" + _tokens(members, 0), "demo-dlm-c3e13-n1.5m-d" + _tokens(members, 1),
        "demo-dlm-c1.2e14-n500k-d" + _tokens(members, 2), "demo-dlm-c1.2e14-n1.5m-d" + _tokens(members, 3)]
    assert all(spec.name == name for name, spec in members.items())
    assert all(spec.checkpoint.save == f"runs/{name}/checkpoints" for name, spec in members.items())


def _tokens(members, index):
    from dlmspec.dsl import count_label

    spec = list(members.values())[index]
    return count_label(spec.train.train_iters * spec.train.global_batch_size * spec.train.seq_length)


def test_the_schedule_follows_the_steps(spec_dict):
    base = Spec.model_validate(spec_dict({"train.train_iters": 1000, "train.lr_warmup_iters": 100,
                                          "train.lr_decay_iters": 800, "train.eval_interval": 500}))
    (spec,) = Spec.isoflop(base, [5e13], [1e6]).values()
    iters = spec.train.train_iters
    assert 1 < iters < 500
    assert spec.train.lr_warmup_iters == max(1, round(100 * iters / 1000))
    assert spec.train.lr_decay_iters == max(2, round(800 * iters / 1000))
    assert spec.train.eval_interval == iters  # evaluated at its end at least
    by_tokens = Spec.model_validate(spec_dict({"train.train_iters": None, "train.train_tokens": 64 * 512 * 1000}))
    (spec,) = Spec.isoflop(by_tokens, [5e13], [1e6]).values()
    assert spec.train.train_tokens is None and spec.train.train_iters == iters


def test_a_budget_below_half_a_step_is_refused_at_the_users_line(tmp_path):
    path = tmp_path / "small.py"
    path.write_text('from dlmspec.dsl import Spec\n'
                    'base = Spec.load("demo-dlm")\n'
                    '\n'
                    'spec = Spec.isoflop(base, [1e9], [1e6])\n', encoding="utf-8")
    with pytest.raises(SpecError) as info:
        sweep_targets(path)
    (issue,) = info.value.issues
    assert issue.key == "budgets" and "less than half a training step of the n1m model" in issue.message
    assert (issue.file, issue.line) == (str(path), 4) and "give budgets of at least" in issue.hint


def test_bad_budgets_are_refused_naming_the_argument():
    base = Spec.load("demo-dlm")
    for bad in ([], [0], [1e14, 1e14], "1e14", [True]):
        with pytest.raises(SpecError) as info:
            Spec.isoflop(base, bad, [1e6])
        assert info.value.issues[0].key == "budgets", bad


def test_an_isoflop_sweep_file_gives_one_member_per_budget_and_size_that_loads(tmp_path):
    path = tmp_path / "iso.py"
    path.write_text('from dlmspec.dsl import Spec\n'
                    'spec = Spec.isoflop(Spec.load("demo-dlm"), [3e13, 1e14], [5e5, 2e6])\n', encoding="utf-8")
    targets = sweep_targets(path)
    assert len(targets) == 4
    names = [load(t).spec.name for t in targets]
    assert len(set(names)) == 4 and all(t.endswith("::" + n) for t, n in zip(targets, names))


def test_step_counted_schedules_are_scaled_with_the_steps(spec_dict):
    wsd = Spec.model_validate(spec_dict({"train.train_iters": 1000, "train.lr_decay_style": "WSD",
                                         "train.lr_wsd_decay_iters": 200, "train.lr_warmup_iters": 0}))
    (spec,) = Spec.isoflop(wsd, [5e13], [1e6]).values()
    iters = spec.train.train_iters
    assert spec.train.lr_wsd_decay_iters == round(200 * iters / 1000)
    piecewise = Spec.model_validate(spec_dict({"train.train_iters": 1000, "train.lr_decay_style": "piecewise",
                                               "train.lr_warmup_iters": 0, "train.lr": 1e-3,
                                               "train.lr_points": [[0, 1e-3], [800, 1e-3], [1000, 1e-4]]}))
    (spec,) = Spec.isoflop(piecewise, [5e13], [1e6]).values()
    assert spec.train.lr_points == [(0, 1e-3), (round(800 * iters / 1000), 1e-3), (iters, 1e-4)]
    from dlmspec.check import issues_for

    assert [str(i) for i in issues_for("validate", spec, resolve(spec)) if i.severity == "error"] == []


def test_numpy_budgets_and_sizes_give_the_same_members_as_floats():
    np = pytest.importorskip("numpy")
    base = Spec.load("demo-dlm")
    from_numpy = Spec.isoflop(base, np.array([3e13, 1e14]), np.array([500_000, 2_000_000], dtype=np.int64))
    assert list(from_numpy) == list(Spec.isoflop(base, [3e13, 1e14], [5e5, 2e6]))


def test_budgets_that_would_share_a_member_name_are_refused():
    with pytest.raises(SpecError) as info:
        Spec.isoflop(Spec.load("demo-dlm"), [1.0001e14, 1.0002e14], [1e6])
    (issue,) = info.value.issues
    assert issue.key == "budgets" and "one member name" in issue.message
