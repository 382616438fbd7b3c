"""Every rule's fix validates: one failing example of every rule of
:data:`dlmspec.check.RULES` (the examples of test_validate_compile_agree.py), its findings'
structured fixes (:class:`dlmspec.errors.Fix`) applied to the spec, and the spec validated again:
the rule no longer fires, no error appears that was not there before, and a spec whose only
errors were the rule's validates clean (exit 0). A rule whose fix is not a change of spec keys (a
missing file, a shell setting) has an action here instead, with the reason. Each fix's hint
names its keys and values, and no fix writes back the value the rule rejected."""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import tomli_w

import blend_examples
import eval_generation_examples
import sft_examples
import validate_kit
import agree_kit as agree
import rule_cases_kit
from dlmspec.check import RULES, load_for
from dlmspec.cli import main
from dlmspec.errors import Fix, SpecError, SpecIssue, toml_text
from spec_kit import write_toml

MISSING = object()


@dataclass
class Example:
    """A failing example as spec data: ``data`` written as ``kind`` ("py" or "toml") to
    ``spec.<kind>``, validated with ``args``; ``files`` relative paths (under the test's folder)
    created before, with their text."""

    data: dict[str, Any]
    kind: str = "py"
    args: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)


def _base(changes: dict[str, Any]) -> dict[str, Any]:
    return agree.merged(agree.BASE, changes)


def examples() -> dict[str, Example]:
    """One example per rule: the compile-agree tests' (FAILING, SPEC_EXAMPLES) and, for the
    loader's rules, the same problems written into BASE (a --set value becomes the spec's)."""
    found: dict[str, Example] = {}
    for changes, rule, _ in agree.FAILING:
        found.setdefault(rule, Example(_base(changes)))
    for rule, (data, _) in agree.SPEC_EXAMPLES.items():
        found.setdefault(rule, Example(copy.deepcopy(data)))
    found["int64"] = Example(_base({"train.seed": 2**70}))
    found["schema"] = Example(_base({"train.lr": "fast"}))
    found["unknown-preset"] = Example(_base({"model.preset": "qwen3-0.6"}))
    found["extends"] = Example({**agree.BASE, "extends": "spec.toml"}, kind="toml")
    found["set"] = Example(copy.deepcopy(agree.BASE), args=["--set", "train.lr"])
    # loader rules whose fix is not a key: the file itself (the actions below)
    found["file"] = Example(copy.deepcopy(agree.BASE), kind="missing")
    found["toml"] = Example(copy.deepcopy(agree.BASE), kind="broken-toml")
    found["python"] = Example(copy.deepcopy(agree.BASE), kind="raising-py")
    found["nesting"] = Example(copy.deepcopy(agree.BASE), kind="deep-toml")
    found["name-placeholder"] = Example(_base({"checkpoint.save": "runs/{nmae}/checkpoints"}))
    # a spec that renames the run of the spec it extends (base.toml, written for the run "t")
    parent = tomli_w.dumps(_base({"checkpoint.save": "runs/t/checkpoints"}))
    found["checkpoint-inherited"] = Example({"extends": "base.toml", "name": "other",
                                             "logging": {"tensorboard_dir": "runs/other/tensorboard"}},
                                            kind="toml", files={"base.toml": parent})
    for rule, (changes, files, _) in {**sft_examples.FILE_EXAMPLES, **blend_examples.FILE_EXAMPLES,
                                      **eval_generation_examples.FILE_EXAMPLES}.items():
        found[rule] = Example(_base(changes), files=dict(files))
    return found


EXAMPLES = examples()


def _action_mkfiles(example: Example, issues: list[SpecIssue]) -> None:
    """Create what path-not-found names (the data prefixes' .bin/.idx, tokenizer files)."""
    for issue in issues:
        values = issue.value if isinstance(issue.value, list) else [issue.value]
        for value in values:
            if issue.key in ("data.train", "data.valid"):
                example.files[value + ".bin"] = ""
                example.files[value + ".idx"] = ""
            else:
                example.files[value] = "{}"


def _action_rl_prompts(example: Example, issues: list[SpecIssue]) -> None:
    """Write the prompts file RL rolls out (JSON lines of prompt and answer) and name it."""
    example.files["prompts.jsonl"] = '{"prompt": "1 + 1 =", "answer": "2"}\n'
    example.data.setdefault("stage", {}).setdefault("rl", {})["prompts"] = "prompts.jsonl"


def _action_plain(example: Example, issues: list[SpecIssue]) -> None:
    """Write the spec as a plain, readable file (it was missing, broken, raising or too deep)."""
    example.kind = "py"


def _action_finetune_from(example: Example, issues: list[SpecIssue]) -> None:
    """Start from a checkpoint (the user's weights; here a folder of this test)."""
    example.data.setdefault("checkpoint", {})["init_from"] = "mcore:ckpt"
    example.files["ckpt/latest"] = ""


def _action_sft_response(example: Example, issues: list[SpecIssue]) -> None:
    """Write the response masks beside the data (what `dlmspec data prepare --sft` writes)."""
    for issue in issues:
        for suffix in (".bin", ".idx"):
            example.files[str(issue.value) + "_response" + suffix] = ""


def _action_tokenizer_model(example: Example, issues: list[SpecIssue]) -> None:
    """Name the tokenizer (a hub id; the user's tokenizer in practice)."""
    example.data["data"]["tokenizer"]["model"] = "org/name"


def _action_eod_id(example: Example, issues: list[SpecIssue]) -> None:
    """Write the end-of-document id (the tokenizer's, read from its files by the user)."""
    example.data["data"]["tokenizer"]["eod_id"] = 0


def _action_slurm_partition(example: Example, issues: list[SpecIssue]) -> None:
    """Name a partition of the cluster."""
    example.data["cluster"]["slurm"]["partition"] = "gpu"


def _action_drop_set(example: Example, issues: list[SpecIssue]) -> None:
    """Write the --set flag whole (``train.lr=0.001``): the flag is not a spec key."""
    example.args = ["--set", "train.lr=0.001"]


def _action_blend_files(example: Example, issues: list[SpecIssue]) -> None:
    """Name datasets that are there: each blend the rule names becomes one prefix whose files
    exist (what `dlmspec data prepare` writes; the user's data in practice)."""
    for issue in issues:
        section, _, key = issue.key.partition(".")
        example.data[section][key] = ["data/ok_text_document"]
    example.files["data/ok_text_document.bin"] = ""
    example.files["data/ok_text_document.idx"] = ""


#: Rules whose fix is not a change of spec keys: rule -> (the action this test takes, why).
ACTIONS: dict[str, tuple[Callable[[Example, list[SpecIssue]], None], str]] = {
    "file": (_action_plain, "the spec file is missing: the fix is to write it, not a key"),
    "toml": (_action_plain, "a TOML syntax error: the file does not parse into keys to change"),
    "python": (_action_plain, "a Python spec that raises: the fix is its code, not a key"),
    "nesting": (_action_plain, "nesting too deep to parse: the loader stops before reading keys"),
    "set": (_action_drop_set, "a malformed --set flag: the fix is the command line, not the spec"),
    "path-not-found": (_action_mkfiles, "the files are missing on this machine: the fix is to create them"),
    "finetune-from-scratch": (_action_finetune_from, "the weights to start from are the user's checkpoint"),
    "sft-response-missing": (_action_sft_response, "the response masks are files `dlmspec data prepare --sft` writes"),
    "rl-table-missing": (_action_rl_prompts, "the prompts RL rolls out are the user's file"),
    "rl-prompts-file": (_action_rl_prompts, "the prompts RL rolls out are the user's file"),
    "tokenizer-files": (_action_tokenizer_model, "the tokenizer's files are the user's to name"),
    "eod-id-unknown": (_action_eod_id, "the id is in the tokenizer's files, which validate cannot read"),
    "slurm-value": (_action_slurm_partition, "partition, account, QOS and host names are the cluster's"),
    "eval-generation-prompts": (eval_generation_examples.rewrite_prompts, "the prompts file is the user's to fix"),
    **{rule: (_action_blend_files, "the shards, their records and manifests are files `dlmspec data prepare` writes")
       for rule in blend_examples.FILE_EXAMPLES},
}

#: Rules this test cannot apply a fix to, with the reason (only the planner's own failure, which no spec reaches).
NOT_COVERED: dict[str, str] = {
    "plan": "no spec reaches it (the planner raises only for GPUs the memory rules skip); "
            "test_validate_compile_agree.test_plan_example fakes the failure",
}


#: (rule, key) of findings whose fix is a file only the user can name: they may carry no fix of
#: keys (a blank path the tokenizer reads, a data.train with no entry left).
USER_FILES = {("blank-value", "data.tokenizer.model"), ("blank-value", "data.tokenizer.vocab_file"),
              ("blank-value", "data.train")}


def all_cases() -> list[tuple[str, dict[str, Any], str]]:
    """Every case of the rule tests (test_validate, test_validate_rule_cases, the compile-agree
    FAILING list) as (rule, spec data, key): every branch those tests reach, not just the first."""
    cases = [(rule, agree.merged(validate_kit.BASE, changes), key) for rule, changes, key in validate_kit.CASES]
    cases += [(rule, agree.merged(rule_cases_kit.BASE, changes), key)
              for rule, changes, key, *_ in rule_cases_kit.CASES]
    cases += [(rule, _base(changes), key) for changes, rule, key in agree.FAILING]
    # branches with a fix of keys in rules whose first example needs an action
    cases += [("slurm-value", _base({"cluster.slurm": {"job_name": "x\ny"}}), "cluster.slurm.job_name"),
              ("slurm-value", _base({"cluster.slurm": {"constraint": "a\tb"}}), "cluster.slurm.constraint"),
              ("slurm-value", _base({"name": "a/b"}), "name")]
    return [c for c in cases if c[0] not in ACTIONS or c[0] == "slurm-value" and c[2] != "cluster.slurm.partition"]


ALL_CASES = all_cases()


def write(folder: Path, example: Example) -> Path:
    """Write the example's spec (and files) into ``folder``; the path to validate."""
    for name, text in example.files.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    if example.kind == "toml":
        path = write_toml(folder / "spec.toml", example.data)
    elif example.kind == "missing":
        path = folder / "spec.toml"
        path.unlink(missing_ok=True)
    elif example.kind == "broken-toml":  # the spec's TOML, then an unclosed array
        path = write_toml(folder / "spec.toml", example.data)
        path.write_text(path.read_text(encoding="utf-8") + "name = [\n", encoding="utf-8")
    elif example.kind == "raising-py":
        path = folder / "spec.py"
        path.write_text(f"spec = {example.data!r}\nraise RuntimeError('no spec here')\n", encoding="utf-8")
    elif example.kind == "deep-toml":  # an array nested 40 deep, then the spec's TOML
        path = write_toml(folder / "spec.toml", example.data)
        path.write_text("x = " + "[" * 40 + "]" * 40 + "\n" + path.read_text(encoding="utf-8"), encoding="utf-8")
    else:
        path = folder / "spec.py"
        path.write_text(f"spec = {example.data!r}\n", encoding="utf-8")
    return path


def validate(path: Path, args: list[str]) -> list[SpecIssue]:
    """What ``dlmspec validate PATH ARGS`` reports (every issue, errors and warnings)."""
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    try:
        return load_for("validate", path, sets)[2]
    except SpecError as exc:
        return exc.issues


def get(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def apply(data: dict[str, Any], fix: Fix) -> None:
    """Apply ``fix`` to spec data in place: remove ``unset``, then write ``set``."""
    for key in fix.unset:
        *parents, last = key.split(".")
        node: Any = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    for key, value in fix.set.items():
        *parents, last = key.split(".")
        node = data
        for part in parents:  # a digit indexes a list (stage.rl.rewards.0.function)
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[last] = copy.deepcopy(value)


def names_fix(hint: str, fix: Fix) -> bool:
    """Whether ``hint`` names every key of ``fix`` (the full key or its last parts) and, for each
    set key, its value right after ``=`` (strings in double or single quotes, or bare as a
    ``--set key=value`` of the planner's advice writes them)."""
    def spellings(key: str) -> list[str]:
        parts = key.split(".")
        return [".".join(parts[i:]) for i in range(len(parts))]

    for key in fix.unset:
        if not any(s in hint for s in spellings(key)):
            return False
    for key, value in fix.set.items():
        texts = {toml_text(value)}
        if isinstance(value, str):
            texts |= {repr(value), value}
        if not any(f"{s}{eq}{t}" in hint for s in spellings(key) for t in texts for eq in (" = ", "=")):
            return False
    return True


def errors(issues: list[SpecIssue]) -> set[tuple[str, str]]:
    return {(i.rule, i.key) for i in issues if i.severity == "error"}


#: Rules of NOT_COVERED that another branch adds (absent where that branch is not merged).
PENDING: set[str] = set()


def test_every_rule_is_covered() -> None:
    """Every rule has an example here, and its fix is structured, an action, or listed in NOT_COVERED."""
    listed = set(NOT_COVERED) - (PENDING - set(RULES))
    assert set(EXAMPLES) | listed == set(RULES), sorted(set(RULES) ^ (set(EXAMPLES) | listed))
    assert not set(ACTIONS) & set(NOT_COVERED) and not set(EXAMPLES) & set(NOT_COVERED)


@pytest.mark.parametrize("rule", sorted(EXAMPLES))
def test_remedy_validates(rule: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths of the spec (data, tokenizer files) live here
    example = copy.deepcopy(EXAMPLES[rule])
    before = validate(write(tmp_path, example), example.args)
    target = [i for i in before if i.rule == rule]
    assert target, f"the example does not fire {rule}: {[(i.rule, i.key) for i in before]}"
    if rule in ACTIONS:
        ACTIONS[rule][0](example, target)
    else:
        for issue in target:
            assert issue.fix is not None, f"{rule} at {issue.key} has no structured fix (hint: {issue.hint!r})"
            assert issue.fix.set or issue.fix.unset
            assert issue.hint and names_fix(issue.hint, issue.fix), (issue.hint, issue.fix)
            for key, value in issue.fix.set.items():  # never the rejected value
                assert get(example.data, key) != value, f"{rule}'s fix writes back {key} = {value!r}"
                assert not (key == issue.key and value == issue.value), f"{rule}'s fix repeats {issue.value!r}"
            assert issue.to_dict()["fix"] == {"set": issue.fix.set, "unset": list(issue.fix.unset)}
            apply(example.data, issue.fix)
    path = write(tmp_path, example)
    after = validate(path, example.args)
    assert not [i for i in after if i.rule == rule], [(i.key, i.hint) for i in after if i.rule == rule]
    new = errors(after) - errors(before)
    assert not new, f"the fix of {rule} brings new errors: {sorted(new)}"
    if errors(before) <= {(i.rule, i.key) for i in target}:
        assert main(["validate", str(path), *example.args]) == 0


@pytest.mark.parametrize("rule, data, key", ALL_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(ALL_CASES)])
def test_every_case_remedy_validates(rule: str, data: dict[str, Any], key: str, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case's findings of its rule, fixed by their structured fixes: the rule is quiet and no
    new error appears (a user's file, :data:`USER_FILES`, is the one fix that is not keys)."""
    monkeypatch.chdir(tmp_path)
    example = Example(copy.deepcopy(data))
    before = validate(write(tmp_path, example), [])
    target = [i for i in before if i.rule == rule]
    assert target and key in {i.key for i in target}
    left = {i.key for i in target if i.fix is None and (rule, i.key) in USER_FILES}
    for issue in target:
        if issue.key in left:
            continue
        assert issue.fix is not None and names_fix(issue.hint, issue.fix), (issue.key, issue.hint, issue.fix)
        assert all(get(example.data, k) != v for k, v in issue.fix.set.items()), issue.fix
        apply(example.data, issue.fix)
    after = validate(write(tmp_path, example), [])
    assert {i.key for i in after if i.rule == rule} <= left, [(i.key, i.hint) for i in after if i.rule == rule]
    assert not errors(after) - errors(before)


def test_mask_remedy_is_not_the_eod_id(tmp_path: Path) -> None:
    """The reported case: vocab_size = 50257 and a NullTokenizer of 50257 (its EOD is 50257, the
    default [MASK] id): the fix of mask-token-distinct must not be mask_token_id = 50257."""
    data = _base({"model.vocab_size": 50257, "data.tokenizer.vocab_size": 50257})
    issues = validate(write(tmp_path, Example(data)), [])
    (issue,) = [i for i in issues if i.rule == "mask-token-distinct"]
    assert "50257 (the first padded slot)" not in (issue.hint or "")
    assert issue.fix is not None and issue.fix.set.get("objective.mask_token_id") not in (None, 50257)


def test_remedy_in_json(tmp_path: Path) -> None:
    """``--json`` carries the structured fix beside the hint."""
    import json

    from typer.testing import CliRunner

    from dlmspec.cli.commands import app

    path = write(tmp_path, Example(_base({"parallel.tensor_model_parallel_size": 3})))
    result = CliRunner().invoke(app, ["validate", str(path), "--json"])
    (issue,) = [i for i in json.loads(result.stdout)["issues"] if i["rule"] == "tp-divides-heads"]
    assert issue["fix"]["unset"] == [] and issue["fix"]["set"]["parallel.tensor_model_parallel_size"] in (1, 2, 4, 8)


def test_strings_inside_lists_and_free_tables_get_remedies(tmp_path: Path) -> None:
    """A secret or a NUL inside a list (a data.train entry, a list of the free-form [lock] table)
    gets a fix that rewrites the list without it, and the rule is quiet once it is applied."""
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    data = _base({"data.train": [{"prefix": "data/a\x00b", "weight": 1.0}, "data/ok"], "lock": {"notes": [token, "x"]}})
    issues = [i for i in validate(write(tmp_path, Example(data)), []) if i.rule in ("secret-in-spec", "string-characters")]
    assert {(i.rule, i.key) for i in issues} == {("string-characters", "data.train.0.prefix"),
                                                ("secret-in-spec", "lock.notes.0")}
    for issue in issues:
        assert issue.fix is not None and names_fix(issue.hint, issue.fix), (issue.hint, issue.fix)
        assert token not in str(issue.to_dict())
        apply(data, issue.fix)
    assert get(data, "lock.notes") == ["x"] and get(data, "data.train")[0]["prefix"] == "data/ab"
    after = validate(write(tmp_path, Example(data)), [])
    assert not [i for i in after if i.rule in ("secret-in-spec", "string-characters")]


@pytest.mark.parametrize("changes, key, fix", [
    ({"objective.kind": "diffusion"}, "objective.kind", Fix({"objective.kind": "mdm"})),
    ({"train.micro_batch_sise": 2}, "train.micro_batch_sise",
     Fix({"train.micro_batch_size": 2}, ("train.micro_batch_sise",))),
    ({"model.num_layers": 0}, "model.num_layers", Fix({"model.num_layers": 1})),
], ids=["allowed-value", "misspelt-key", "range"])
def test_schema_remedies_validate(changes: dict[str, Any], key: str, fix: Fix, tmp_path: Path) -> None:
    """The loader's schema issues: an allowed value (the first the field lists that is not the
    rejected one), a misspelt key renamed to the close one with its value (the hint names the key:
    ``did you mean 'micro_batch_size'?``), a value within the range."""
    data = _base(changes)
    (issue,) = [i for i in validate(write(tmp_path, Example(data)), []) if i.rule == "schema"]
    assert (issue.key, issue.fix) == (key, fix)
    apply(data, issue.fix)
    assert main(["validate", str(write(tmp_path, Example(data)))]) == 0
