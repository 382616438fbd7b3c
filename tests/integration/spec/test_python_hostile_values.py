"""A Python spec's hostile values end in exit 2 with the file, line, key, why and a fix, never a
traceback: objects whose ``__repr__``/``__str__``/``items()`` raise, integers longer than Python
prints, a generator that never ends (the sweep is cut at MAX_SWEEP_MEMBERS), an exception that
cannot be printed. Attribute typos get the closest valid name. Loading every member of a sweep
copies each member once (linear, not quadratic)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from dlmspec.errors import SpecError
from dlmspec.spec.load import load
from dlmspec.spec.python_load import sweep_targets

CLI = [sys.executable, "-m", "dlmspec.cli"]
HEAD = 'from dlmspec.dsl import Spec\nbase = Spec.load("demo-dlm")\n'


def _write(tmp_path: Path, text: str, name: str = "spec.py") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "validate", str(path)], capture_output=True, text=True, cwd=path.parent, timeout=300)


def _issues(path: Path) -> list:
    with pytest.raises(SpecError) as info:
        load(path)
    return info.value.issues


CASES = {
    "repr-raises": (HEAD + "class Bad:\n    def __repr__(self):\n        raise RuntimeError('no repr')\n"
                    "    __str__ = __repr__\n"
                    "spec = base.model_dump(exclude_unset=True)\nspec['name'] = Bad()\n",
                    "name", "a Bad object"),
    "items-raises": ("class D(dict):\n    def items(self):\n        raise RuntimeError('no items')\n"
                     "    def __iter__(self):\n        raise RuntimeError('no iter')\n"
                     "spec = D(name='x', model=D(preset='qwen3-0.6b', hidden_size=D()))\n",
                     "model.hidden_size", None),
    "long-int-in-a-dict": (HEAD + "spec = base.model_dump(exclude_unset=True)\n"
                           "spec['train']['train_iters'] = 10 ** 5000\n", "train.train_iters", "4300"),
    "long-int-assigned": (HEAD + "base.train.train_iters = 10 ** 5000\nspec = base\n", "train.train_iters", "4300"),
    "list-subclass-len-raises": (HEAD + "class L(list):\n    def __len__(self):\n        raise RuntimeError('x')\n"
                                 "    def __iter__(self):\n        raise RuntimeError('x')\n"
                                 "spec = L([base.model_dump(exclude_unset=True) | {'train': 1}])\n", "train", None),
    "exception-str-raises": ("class E(Exception):\n    def __str__(self):\n        raise RuntimeError('x')\n"
                             "raise E()\n", "<python>", "cannot be printed"),
    "exit-code-repr-raises": ("import sys\nclass C:\n    def __repr__(self):\n        raise RuntimeError('x')\n"
                              "sys.exit(C())\n", "<python>", "sys.exit(<unprintable C>)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_python_values_exit_2_with_key_and_line(tmp_path: Path, case: str) -> None:
    text, key, why = CASES[case]
    path = _write(tmp_path, text)
    done = _validate(path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    issues = [i for i in _issues(path) if i.key == key]
    assert issues and issues[0].file and issues[0].line, [str(i) for i in _issues(path)]
    if why:
        assert why in issues[0].message + str(issues[0].value)


def test_a_generator_that_never_ends_is_cut_at_the_member_limit(tmp_path: Path) -> None:
    path = _write(tmp_path, HEAD + "def forever():\n    while True:\n        yield base\n\nspec = forever()\n")
    with pytest.raises(SpecError) as info:
        sweep_targets(path)
    issue = info.value.issues[0]
    assert (issue.key, issue.line) == ("spec", 7) and "more than 10,000 members" in issue.message, str(issue)
    assert "islice" in issue.hint


@pytest.mark.parametrize(("line", "key", "close"), [
    ("base.train.lrr = 1", "train.lrr", "lr"),
    ("base.trian = 1", "trian", "train"),
])
def test_an_attribute_typo_gets_the_closest_valid_name(tmp_path: Path, line: str, key: str, close: str) -> None:
    path = _write(tmp_path, HEAD + line + "\nspec = base\n")
    issue = _issues(path)[0]
    assert (issue.key, issue.line) == (key, 3) and f"did you mean '{close}'" in issue.hint


def _nodes(value: object) -> int:
    """How many dicts, lists, tuples, objects and scalars ``value`` holds (what a deep copy visits)."""
    count, stack, seen = 0, [value], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        count += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
        elif hasattr(node, "__dict__") and not isinstance(node, type):
            stack.extend(vars(node).values())
    return count


def _deepcopies(tmp_path: Path, members: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many objects the deep copies made while every member of a sweep of ``members`` loads
    visit (``copy.deepcopy``'s recursion binds the original function, so each top-level call is
    weighed by the size of what it copies)."""
    path = _write(tmp_path, HEAD + f"spec = {{f'm{{i}}': base.replace(train={{'lr': 1e-4 * (i + 1)}}) "
                  f"for i in range({members})}}\n", f"sweep{members}.py")
    targets = sweep_targets(path)
    visited = 0
    real = copy.deepcopy

    def counting(x, memo=None, _nil=[]):  # noqa: B006 (copy.deepcopy's own signature)
        nonlocal visited
        visited += _nodes(x)
        return real(x, memo, _nil)

    monkeypatch.setattr(copy, "deepcopy", counting)
    try:
        for target in targets:
            load(target, fast=True)
    finally:
        monkeypatch.setattr(copy, "deepcopy", real)
    return visited


def test_loading_each_sweep_member_costs_linear_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = _deepcopies(tmp_path, 10, monkeypatch)
    large = _deepcopies(tmp_path, 40, monkeypatch)
    assert large <= 5 * small, (small, large)  # linear: 4x; a copy of every member per load: 16x


def test_a_sweep_of_one_spec_is_that_spec(tmp_path: Path) -> None:
    path = _write(tmp_path, HEAD + "spec = [base.replace(name='only')]\n")
    assert load(path).spec.name == "only"
    done = _validate(path)
    assert done.returncode == 0 and done.stdout.startswith("ok: only:"), done.stderr
