"""The issue registry (dlmspec.check.registry): every rule is described, each command's scopes
come from one table, issues come in one order, and ``dlmspec show --rules`` lists every rule."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dlmspec.check import RULES, SCOPE_NAMES, SCOPES, Rule, issues_for, sort_key
from dlmspec.check.registry import add_rule
from dlmspec.cli.commands import app
from dlmspec.spec.models import Spec

ROOT = Path(__file__).resolve().parents[3]


def test_show_rules_lists_every_rule_with_its_scope() -> None:
    """The loader's, the spec's, the files', SLURM's, memory's and the runtime's rules, by scope."""
    result = CliRunner().invoke(app, ["show", "--rules", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["result"]["rules"]
    assert sorted(r["id"] for r in rows) == sorted(RULES)
    assert {r["id"]: (r["scope"], r["severity"], r["source"], r["summary"], r["fix"]) for r in rows} == {
        r.id: (r.scope, r.severity, r.source, r.summary, r.fix) for r in RULES.values()}
    scopes = [r["scope"] for r in rows]
    assert scopes == sorted(scopes, key=SCOPE_NAMES.index) and set(scopes) == set(SCOPE_NAMES)
    table = CliRunner().invoke(app, ["show", "--rules"])
    assert table.exit_code == 0
    for rule_id in ("schema", "tp-divides-heads", "path-not-found", "slurm-secret", "memory-fits", "rl-batch"):
        assert rule_id in table.stdout


def test_every_rule_is_described() -> None:
    for r in RULES.values():
        assert r.id and r.id == r.id.strip().lower() and " " not in r.id, r.id
        assert r.severity in ("error", "warning"), r.id
        assert r.source.strip() and r.summary.strip(), r.id
        assert r.scope in SCOPE_NAMES, r.id
        assert (r.func is None) == (r.scope == "load"), r.id  # the loader raises its own issues
    # rules whose fix never varies give it once, as the rule's
    assert all(RULES[r].fix for r in RULES if r.startswith("runtime-"))


def test_compile_checks_exactly_what_validate_checks() -> None:
    assert SCOPES["compile"] is SCOPES["validate"]
    assert SCOPES["validate"] == ("spec", "paths", "slurm", "memory", "runtime")
    for command, scopes in SCOPES.items():
        assert set(scopes) <= set(SCOPE_NAMES) - {"load"} and len(set(scopes)) == len(scopes), command
    assert SCOPES["plan"] == ("spec", "memory") and SCOPES["sbatch"] == ("slurm",)
    assert {r.id for r in RULES.values() if r.only_if_clean} == {r.id for r in RULES.values() if r.scope == "memory"}


def test_a_rule_id_is_registered_once() -> None:
    with pytest.raises(ValueError, match="duplicate rule id tp-divides-heads"):
        add_rule(Rule("tp-divides-heads", "error", "s", "s", None))


def _spec(**changes: Any) -> Spec:
    data = {"name": "t",
            "model": {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024, "num_attention_heads": 8,
                      "vocab_size": 1000, "max_position_embeddings": 262144},
            "train": {"micro_batch_size": 8, "global_batch_size": 64, "seq_length": 262144, "train_iters": 100,
                      "eval_interval": 50},
            "data": {"mock": True, "tokenizer": {"type": "NullTokenizer", "vocab_size": 999}},
            "cluster": {"gpu": "h100", "gpus_per_node": 8}}
    for key, value in changes.items():
        table, _, leaf = key.partition("__")
        data.setdefault(table, {})[leaf] = value
    return Spec.model_validate(data)


def test_memory_waits_for_the_scopes_before_it() -> None:
    """A spec that breaks a spec rule is not planned (its layout may not exist); one the runtime
    cannot run still is (validate's scopes run memory before the runtime's)."""
    assert [(i.rule, i.severity) for i in issues_for("validate", _spec())] == [("memory-fits", "error")]
    broken = {i.rule for i in issues_for("validate", _spec(parallel__tensor_model_parallel_size=3))}
    assert "tp-divides-heads" in broken and "memory-fits" not in broken
    unsupported = {i.rule for i in issues_for("validate", _spec(checkpoint__async_save=True))}
    assert {"runtime-async-save", "memory-fits"} <= unsupported
    assert [i.rule for i in issues_for("plan", _spec(checkpoint__async_save=True))] == ["memory-fits"]


def test_one_order_for_every_command() -> None:
    spec = _spec(parallel__tensor_model_parallel_size=3, train__eval_interval=1000, checkpoint__async_save=True)
    for command in SCOPES:
        found = issues_for(command, spec)
        assert found == sorted(found, key=sort_key), command
    found = issues_for("validate", spec)
    severities = [i.severity for i in found]
    assert severities == sorted(severities, key=("error", "warning").index) and "warning" in severities


def test_the_registry_imports_neither_the_compiler_nor_jinja2_nor_torch() -> None:
    code = ("import sys, dlmspec.check\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jinja2', 'torch', 'megatron', 'typer') "
            "or m in ('dlmspec.render.compile', 'dlmspec.render.sbatch', 'dlmspec.cli.commands', 'dlmspec.spec.models')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]", out.stdout


#: A runtime module (and a name in it) as rule sources and messages cite them: the dotted import
#: name (dlmspec.backends.megatron.data.DataConfig.eod_id) or the file (backends/megatron/fsdp.py
#: fsdp_problems).
_RUNTIME_REF = re.compile(r"(?:dlmspec\.backends\.megatron\.(\w+)((?:\.\w+)*)|backends/megatron/(\w+)\.py(?: (\w+))?)")


def test_rule_sources_name_runtime_code_that_exists() -> None:
    """A source or message that cites the runtime names a module of backends/megatron and, when it
    names one, a function or class defined there (the runtime's modules move: the citations must
    follow)."""
    cited = 0
    for r in RULES.values():
        texts = [r.source, r.fix or ""]
        if r.func is not None and r.scope == "runtime":
            texts += [f.message for f in _runtime_findings(r)]
        for text in texts:
            for m in _RUNTIME_REF.finditer(text):
                module, names = (m[1], m[2].lstrip(".").split(".")[0]) if m[1] else (m[3], m[4] or "")
                if m[1] and (ROOT / "backends" / "megatron" / module).is_dir():  # a package: module.file.Name
                    parts = m[2].lstrip(".").split(".")
                    module, names = f"{module}/{parts[0]}", (parts[1] if len(parts) > 1 else "")
                path = ROOT / "backends" / "megatron" / f"{module}.py"
                assert path.is_file(), f"{r.id}: {m[0]}: no {path.relative_to(ROOT)}"
                if names:
                    assert re.search(rf"^\s*(?:def|class) {names}\b|^{names}\s*[:=]", path.read_text(), re.M), (
                        f"{r.id}: {m[0]}: {names} is not defined in {path.relative_to(ROOT)}")
                cited += 1
    assert cited >= 20


def _runtime_findings(r: Rule) -> list[Any]:
    """The findings of a runtime rule on its failing example (tests/integration/check/test_validate_compile_agree.py)."""
    from agree_kit import BASE, FAILING, merged

    examples = [changes for changes, rule_id, _ in FAILING if rule_id == r.id]
    if not examples:
        return []
    from dlmspec.check import Context
    from dlmspec.resolve import resolve

    spec = Spec.model_validate(merged(BASE, examples[0]))
    return list(r.func(Context(spec=spec, r=resolve(spec))))
