"""``dlmspec validate`` and ``dlmspec compile`` agree: on every bundled spec,
every starter spec and one failing example of every rule of :data:`dlmspec.check.RULES` (the
loader's, the spec's, the files', SLURM's, memory's and the runtime's), both exit with the same
code and report the same issues (rule, key, severity), and the example's rule is among them. The
memory rule has one override, ``cluster.allow_memory_overflow``, which both honour and the lock
file keeps."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import dlmspec.check.memory
import dlmspec.cli
import dlmspec.cli.app
import dlmspec.cli.commands
import dlmspec.cli.output
import dlmspec.cli.plan
import dlmspec.cli.validate
import blend_examples
import eval_generation_examples
import sft_examples
import validate_kit
import rule_cases_kit
from dlmspec.check import RULES
from dlmspec.cli import main
from dlmspec.cli.commands import app
from dlmspec.plan import PlanError
from dlmspec.spec.presets import PRESETS
from spec_kit import spec_file

from agree_kit import (  # noqa: F401 (fixtures among them)
    AGREE,
    BASE,
    FAILING,
    SPEC_EXAMPLES,
    TIGHT,
    TOO_BIG,
    merged,
    spec_rule_examples,
)

ROOT = Path(__file__).resolve().parents[3]
SPECS = sorted((ROOT / "specs").glob("*.toml"))

#: Nodes a starter spec of these presets needs to fit H100s (what `dlmspec new` suggests).
STARTER_NODES = {"llama-3-70b": 4, "mixtral-8x7b": 2, "qwen3-30b-a3b": 2}





#: The warnings among those examples (the others are errors).
WARNING_EXAMPLES = {("memory-headroom", "cluster.gpu"), ("sft-variable-length", "objective.variable_length_prob"),
                    ("sft-pad-eos-packed", "stage.sft.pad_eos_tokens"), ("sft-pretraining-data", "data.eod_mask_loss"),
                    ("bd3lm-keys-ignored", "objective.ar_loss_weight"), ("bd3lm-mdm-keys-ignored", "objective.shift"),
                    ("bd3lm-dense-sdpa", "model.attention_backend"),
                    ("attention-anneal-init-from", "objective.attention_anneal_iters")}

#: (file name, text, extra arguments, the loader's rule, its key): one spec per ``load`` rule. The
#: text None is BASE as TOML; "" writes nothing (the file is missing).
LOAD_FAILING: list[tuple[str, str, list[str], str, str]] = [
    ("spec.toml", "", [], "file", "<file>"),
    ("spec.toml", "name = [\n", [], "toml", "<toml>"),
    ("spec.py", "raise RuntimeError('no spec here')\n", [], "python", "<python>"),
    ("spec.toml", "x = " + "[" * 40 + "]" * 40 + "\n", [], "nesting", "x"),
    ("spec.toml", 'extends = "spec.toml"\n', [], "extends", "extends"),
    ("spec.toml", None, ["--set", "train.lr"], "set", "--set"),
    ("spec.toml", None, ["--set", "train.seed=" + str(2**70)], "int64", "train.seed"),
    ("spec.toml", None, ["--set", "train.lr=\"fast\""], "schema", "train.lr"),
    ("spec.toml", None, ["--set", "model.preset=\"no-such-model\""], "unknown-preset", "model.preset"),
    ("spec.toml", None, ["--set", "checkpoint.save=\"runs/{nmae}/checkpoints\""], "name-placeholder",
     "checkpoint.save"),
]


def outcome(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[tuple[str, str, str]]]:
    """Exit code of ``dlmspec ARGV`` (run as the console script runs it) and the issues it
    reported (rule, key, severity), sorted."""
    seen: list[tuple[str, str, str]] = []
    issues, warnings = dlmspec.cli.output.report_issues, dlmspec.cli.output.report_warnings

    def record(found: list) -> None:
        seen.extend((i.rule, i.key, i.severity) for i in found)

    def report_issues(found: list, **options: object) -> None:
        record(found)
        issues(found, **options)

    def report_warnings(found: list) -> None:
        record(found)
        warnings(found)

    with monkeypatch.context() as patch:
        # every module of dlmspec.cli that calls them (each imported the names; dlmspec.cli's fast path
        # imports them from dlmspec.cli.output when it reports, so that module's names are patched too)
        for module in (dlmspec.cli, dlmspec.cli.output, dlmspec.cli.app, dlmspec.cli.commands.compile,
                       dlmspec.cli.commands.new, dlmspec.cli.plan, dlmspec.cli.validate):
            for name, func in (("report_issues", report_issues), ("report_warnings", report_warnings)):
                if hasattr(module, name):
                    patch.setattr(module, name, func)
        code = main(argv)
    return code, sorted(seen)


def assert_agree(spec: Path, out: Path, monkeypatch: pytest.MonkeyPatch,
                 args: list[str] | tuple[str, ...] = ()) -> tuple[int, list[tuple[str, str, str]]]:
    validate = outcome(["validate", str(spec), *args], monkeypatch)
    compiled = outcome(["compile", str(spec), "-o", str(out), *args], monkeypatch)
    assert validate == compiled, f"validate {validate} != compile {compiled}"
    assert out.is_dir() == (compiled[0] == 0)
    return validate


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_bundled_specs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_agree(path, tmp_path / "out", monkeypatch)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_starter_specs(preset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / f"{preset}.toml"
    result = CliRunner().invoke(app, ["new", str(spec), "--preset", preset, "--nodes", str(STARTER_NODES.get(preset, 1))])
    assert result.exit_code == 0, result.output
    assert assert_agree(spec, tmp_path / "out", monkeypatch) == (0, [])


@pytest.mark.parametrize("changes, rule, key", FAILING, ids=[f"{r}:{k}" for _, r, k in FAILING])
def test_failing_examples(changes: dict[str, Any], rule: str, key: str, tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    code, issues = assert_agree(spec_file(tmp_path, AGREE, changes), tmp_path / "out", monkeypatch)
    severity = "warning" if (rule, key) in WARNING_EXAMPLES else "error"
    assert code == (2 if severity == "error" else 0) and (rule, key, severity) in issues


@pytest.mark.parametrize("name, text, args, rule, key", LOAD_FAILING, ids=[c[3] for c in LOAD_FAILING])
def test_load_examples(name: str, text: str | None, args: list[str], rule: str, key: str, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_file(tmp_path, AGREE, {}, file_name=name) if text is None else tmp_path / name
    if text:
        spec.write_text(text, encoding="utf-8")
    code, issues = assert_agree(spec, tmp_path / "out", monkeypatch, args)
    assert code == 2 and (rule, key, "error") in issues, issues








@pytest.mark.parametrize("rule", sorted(SPEC_EXAMPLES))
def test_spec_rule_examples(rule: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example is written as a Python spec (it may hold strings TOML cannot: lone surrogates)."""
    data, key = SPEC_EXAMPLES[rule]
    spec = tmp_path / "spec.py"
    spec.write_text(f"spec = {data!r}\n", encoding="utf-8")
    code, issues = assert_agree(spec, tmp_path / "out", monkeypatch)
    severity = RULES[rule].severity
    assert (rule, key, severity) in issues, issues
    assert code == (2 if any(s == "error" for _, _, s in issues) else 0)


def test_checkpoint_inherited_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one rule that reads which file wrote a key: a spec that renames the run of the spec it
    extends, and inherits its checkpoint folder."""
    spec_file(tmp_path, AGREE, {"checkpoint.save": "runs/t/checkpoints"}, file_name="base.toml")
    child = tmp_path / "child.toml"
    child.write_text('extends = "base.toml"\nname = "other"\n[logging]\ntensorboard_dir = "runs/other/tensorboard"\n',
                     encoding="utf-8")
    code, issues = assert_agree(child, tmp_path / "out", monkeypatch)
    assert code == 2 and ("checkpoint-inherited", "checkpoint.save", "error") in issues


def test_plan_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec the planner cannot model (no spec reaches this today: the planner raises only for a
    GPU outside the catalog, which the memory rules skip): both refuse it with the ``plan`` rule."""
    def fail(*args: Any, **kwargs: Any) -> None:
        raise PlanError("no model of this spec")

    monkeypatch.setattr(dlmspec.check.memory, "make_plan", fail)
    code, issues = assert_agree(spec_file(tmp_path, AGREE, {}), tmp_path / "out", monkeypatch)
    assert code == 2 and ("plan", "<plan>", "error") in issues


FILE_EXAMPLES = {**sft_examples.FILE_EXAMPLES, **blend_examples.FILE_EXAMPLES, **eval_generation_examples.FILE_EXAMPLES}


@pytest.mark.parametrize("rule", sorted(FILE_EXAMPLES))
def test_sft_file_examples(rule: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules that read files of the example: the SFT rules (the dataset record and the
    response masks) and those of globs and manifests of shards."""
    changes, files, key = FILE_EXAMPLES[rule]
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, issues = assert_agree(spec_file(tmp_path, AGREE, changes), tmp_path / "out", monkeypatch)
    severity = RULES[rule].severity
    assert (rule, key, severity) in issues and code == (2 if severity == "error" else 0)


def test_every_rule_has_a_failing_example() -> None:
    covered = ({rule for _, rule, _ in FAILING} | {c[3] for c in LOAD_FAILING} | set(SPEC_EXAMPLES)
               | {"checkpoint-inherited", "plan"} | set(FILE_EXAMPLES))
    assert covered == set(RULES), sorted(set(RULES) ^ covered)


def test_memory_override_turns_the_error_into_a_recorded_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cluster.allow_memory_overflow = true`` is the memory rule's one override: validate,
    plan and compile then pass with a ``memory-fits`` warning, and spec.lock.toml keeps the key,
    so the compiled job says that it was accepted on purpose."""
    spec = spec_file(tmp_path, AGREE, {**TOO_BIG, "cluster.allow_memory_overflow": True})
    code, issues = assert_agree(spec, tmp_path / "out", monkeypatch)
    assert code == 0 and ("memory-fits", "cluster.gpu", "warning") in issues
    code, planned = outcome(["plan", str(spec)], monkeypatch)
    assert code == 0 and ("memory-fits", "cluster.gpu", "warning") in planned
    lock = tomllib.loads((tmp_path / "out" / "spec.lock.toml").read_text())
    assert lock["cluster"]["allow_memory_overflow"] is True
    # The same spec without the override: an error everywhere, and the fix names the override.
    plain = spec_file(tmp_path, AGREE, TOO_BIG, file_name="plain.toml")
    assert outcome(["plan", str(plain)], monkeypatch)[0] == 2
    result = CliRunner().invoke(app, ["validate", str(plain), "--json"])
    (memory,) = [i for i in json.loads(result.stdout)["issues"] if i["rule"] == "memory-fits"]
    assert memory["severity"] == "error" and "cluster.allow_memory_overflow = true" in memory["hint"]
