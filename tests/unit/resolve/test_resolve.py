"""Tests of dlmspec.resolve's layer path: ``transformer_impl = "auto"`` never takes a
path the spec's features cannot run on. The resolved choice (and why) reaches train.py as a
literal, the lock file, the plan and validate's report; an explicit path that cannot run a
feature is a validate (and compile) error."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.render.compile import render
from dlmspec.spec.load import load
from dlmspec.plan import make_plan
from dlmspec.resolve import resolve
from spec_kit import spec_file

ROOT = Path(__file__).resolve().parents[3]
SPECS = ROOT / "specs"


def build_layer_call(train_py: str) -> ast.Call:
    return next(n for n in ast.walk(ast.parse(train_py))
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "build_layer_spec")


def keyword(call: ast.Call, name: str) -> Any:
    return next(ast.literal_eval(k.value) for k in call.keywords if k.arg == name)


@pytest.mark.parametrize("changes, impl, because", [
    ({}, "auto", None),
    ({"objective.variable_length_prob": 0.01}, "local", "objective.variable_length_prob"),
    ({"data.reset_attention_mask": True}, "local", "data.reset_attention_mask"),
    ({"objective.attention_mask": "block_causal", "objective.block_size": 32}, "local", "objective.attention_mask"),
    ({"objective.kind": "ar", "objective.variable_length_prob": 0.01}, "auto", None),  # ar never cuts sequences
    ({"precision.fp8": "hybrid"}, "transformer_engine", "precision.fp8"),
    ({"model.num_experts": 8, "model.moe_grouped_gemm": True}, "transformer_engine", "model.moe_grouped_gemm"),
    ({"parallel.context_parallel_size": 2, "parallel.cp_comm_type": "p2p"}, "transformer_engine",
     "parallel.cp_comm_type"),
    ({"parallel.context_parallel_size": 2, "parallel.cp_comm_type": "allgather"}, "auto", None),
    ({"model.transformer_impl": "local"}, "local", "model.transformer_impl"),
    ({"model.transformer_impl": "transformer_engine"}, "transformer_engine", "model.transformer_impl"),
])
def test_auto_takes_the_path_the_features_need(tmp_path: Path, changes: dict[str, Any], impl: str,
                                               because: str | None) -> None:
    resolved = resolve(load(spec_file(tmp_path, changes)).spec)
    assert resolved.transformer_impl == impl
    if because is not None:
        assert because in resolved.transformer_impl_reason
    assert resolved.derived()["transformer_impl"] == impl
    assert resolved.derived()["transformer_impl_reason"] == resolved.transformer_impl_reason


@pytest.mark.parametrize("name, impl", [("demo-dlm", "local"), ("megadlms-1.7b-mdm", "auto"),
                                        ("llada-8b-pretrain", "auto"), ("demo-ar", "auto"),
                                        ("megadlms-1.7b-ar", "auto")])
def test_bundled_specs_with_variable_length_take_the_local_path(name: str, impl: str) -> None:
    """The demo cuts 1% of the sequences one by one (variable_length_prob = 0.01), which auto keeps
    on the local layers where they were measured (TE runs them through its padding mask when asked):
    its train.py asks for the local layers, saying why, wherever Transformer Engine imports. The
    MegaDLMs and LLaDA specs cut whole micro-batches (objective.variable_length = "micro_batch",
    LLaDA's GUIDELINES.md cuts the whole batch): dense, either path."""
    resolved = resolve(load(SPECS / f"{name}.toml").spec)
    assert resolved.transformer_impl == impl
    text = render(resolved, f"specs/{name}.toml")["train.py"]
    call = build_layer_call(text)
    assert keyword(call, "use_transformer_engine") == {"local": False, "auto": None}[impl]
    line = next(line for line in text.splitlines() if "use_transformer_engine=" in line)
    if impl == "local":
        assert "variable_length_prob" in line and "local" in line
    assert "# Run path: transformer_impl = 'auto' -> " + impl in text
    lock = render(resolved, f"specs/{name}.toml")["spec.lock.toml"]
    assert f'transformer_impl = "{impl}"' in lock
    assert make_plan(resolved).runtime["modelled_as"] == "local+sdpa"
    if impl == "local":
        assert "variable_length_prob" in make_plan(resolved).runtime["transformer_impl"]


@pytest.mark.parametrize("changes, key", [
    ({"model.transformer_impl": "transformer_engine", "data.reset_attention_mask": True}, "data.reset_attention_mask"),
    ({"model.transformer_impl": "transformer_engine", "objective.attention_mask": "block_causal",
      "objective.block_size": 32}, "objective.attention_mask"),
])
def test_transformer_engine_with_a_local_only_feature_is_a_validate_error(tmp_path: Path, changes: dict[str, Any],
                                                                         key: str) -> None:
    result = CliRunner().invoke(app, ["validate", str(spec_file(tmp_path, changes)), "--json"])
    assert result.exit_code == 2, result.output
    errors = [i for i in json.loads(result.stdout)["issues"] if i["severity"] == "error"]
    assert [i["key"] for i in errors] == [key]
    assert "transformer_impl" in errors[0]["hint"]


def test_features_that_need_both_paths_are_an_error_naming_both(tmp_path: Path) -> None:
    """auto with a local-only feature (document masks) and a Transformer Engine-only one (fp8):
    no path runs both; the error says which feature chose the local path. Variable-length
    sequences run on both (TE's padding mask): with fp8, auto takes TE."""
    path = spec_file(tmp_path, {"data.reset_attention_mask": True, "precision.fp8": "hybrid"})
    result = CliRunner().invoke(app, ["validate", str(path), "--json"])
    assert result.exit_code == 2
    (error,) = [i for i in json.loads(result.stdout)["issues"] if i["severity"] == "error"]
    assert error["key"] == "precision.fp8" and "reset_attention_mask" in error["message"]
    path = spec_file(tmp_path, {"objective.variable_length_prob": 0.01, "precision.fp8": "hybrid"})
    result = CliRunner().invoke(app, ["validate", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["result"]["derived"]["transformer_impl"] == "transformer_engine"


def test_block_causal_with_auto_compiles_on_the_local_path(tmp_path: Path) -> None:
    path = spec_file(tmp_path, {"objective.attention_mask": "block_causal", "objective.block_size": 32})
    result = CliRunner().invoke(app, ["compile", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    call = build_layer_call((tmp_path / "out" / "train.py").read_text())
    assert keyword(call, "use_transformer_engine") is False and keyword(call, "attention") == "block_causal"


def test_validate_states_the_layer_path() -> None:
    result = CliRunner().invoke(app, ["validate", str(SPECS / "demo-dlm.toml")])
    assert result.exit_code == 0
    assert "layers: local (auto: objective.variable_length_prob" in result.stdout
    result = CliRunner().invoke(app, ["validate", str(SPECS / "demo-ar.toml")])
    assert "layers: auto (Transformer Engine where it imports" in result.stdout
    derived = json.loads(CliRunner().invoke(app, ["validate", str(SPECS / "demo-dlm.toml"), "--json"]).stdout)["result"]["derived"]
    assert derived["transformer_impl"] == "local"
