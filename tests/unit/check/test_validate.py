"""Tests of the spec rules of dlmspec.check: every rule fires on a spec that breaks it and stays
quiet on a clean one, issues point at the file and line to edit, and one run reports all of them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from dlmspec.check import RULES, find, load_for
from dlmspec.errors import SpecError
from dlmspec.spec.load import load_text
from dlmspec.spec.models import Spec

from validate_kit import (  # noqa: F401 (fixtures among them)
    BASE,
    CASES,
    MOE,
    PAD_998,
    make,
)


#: The scopes of the rules that read a spec and this machine's files.
FILES = ("spec", "paths")





def rules_of(spec: Spec) -> set[str]:
    return {i.rule for i in find(("spec",), spec)}


def test_base_spec_is_clean() -> None:
    assert find(("spec",), make()) == []
    # Its data prefix is not on this machine: only the path rule, only when asked, only a warning.
    (issue,) = find(FILES, make())
    assert (issue.rule, issue.severity, issue.key, issue.value) == (
        "path-not-found", "warning", "data.train", ["data/x_text_document"])





#: Rules that read where keys were written (a spec file and its extends chain): tested below.
FILE_RULES = {"checkpoint-inherited"}


def test_every_rule_has_a_case() -> None:
    from rule_cases_kit import CASES as HARDENING_CASES, MASK_RULE  # the rules, tested there

    from sft_examples import FILE_EXAMPLES as SFT_FILE_RULES  # the SFT rules that read a dataset record
    from blend_examples import FILE_EXAMPLES as BLEND_FILE_RULES  # globs and manifests (tests/unit/data/test_blend.py)
    from eval_generation_examples import FILE_EXAMPLES as EVAL_GENERATION_FILE_RULES  # reads the prompts file

    hardening = {case[0] for case in HARDENING_CASES} | {MASK_RULE}
    spec_rules = {r.id for r in RULES.values() if r.scope in FILES}
    assert ({case[0] for case in CASES} | hardening | FILE_RULES | set(SFT_FILE_RULES)
            | set(BLEND_FILE_RULES) | set(EVAL_GENERATION_FILE_RULES)) == spec_rules


def _valid_base(name: str = "base") -> str:
    """TOML (after this file's TOML is defined) of a valid spec named ``name`` with no run paths."""
    return (TOML.replace("tensor_model_parallel_size = 5", "tensor_model_parallel_size = 2")
            .replace("gpus_per_node = 10", "gpus_per_node = 8").replace("global_batch_size = 9", "global_batch_size = 16")
            .replace('name = "lines"', f'name = "{name}"'))


def _inherited(tmp_path, parent_tables: str, child_text: str, overrides: tuple[str, ...] = ()):
    """The checkpoint-inherited issues of child.toml, which extends base.toml (``parent_tables``
    appended to a valid spec named "base")."""
    (tmp_path / "base.toml").write_text(_valid_base() + parent_tables, encoding="utf-8")
    child = tmp_path / "child.toml"
    child.write_text('extends = "base.toml"\n' + child_text, encoding="utf-8")
    return [w for w in load_for("validate", child, overrides)[2] if w.rule == "checkpoint-inherited"]


def test_an_inherited_checkpoint_folder_of_a_renamed_run_is_an_error(tmp_path) -> None:
    """The child would resume (or overwrite) the parent's run, and a SLURM job has no
    one to ask: an error, whose fix ({name}) validates."""
    parent = '\n[checkpoint]\nsave = "runs/base/checkpoints"\n'
    (found,) = _inherited(tmp_path, parent, 'name = "child-run"\n')
    assert (found.key, found.severity, found.file) == ("checkpoint.save", "error", str(tmp_path / "base.toml"))
    assert "base.toml" in found.message and "'base'" in found.message and "'child-run'" in found.message
    assert 'checkpoint.save = "runs/{name}/checkpoints"' in found.hint
    # the same through --set, and a folder without the parent's name is as shared
    assert [w.key for w in _inherited(tmp_path, parent, "", ("name=\"x\"",))] == ["checkpoint.save"]
    assert [w.severity for w in _inherited(tmp_path, '\n[checkpoint]\nsave = "/scratch/ckpt"\n',
                                           'name = "child-run"\n')] == ["error"]
    # the parent itself, a child that keeps the name, one that names its own folder, and the fix: quiet
    assert not [w for w in load_for("validate", tmp_path / "base.toml")[2] if w.rule == "checkpoint-inherited"]
    assert not _inherited(tmp_path, parent, "[train]\nlr = 1e-4\n")
    assert not _inherited(tmp_path, parent, 'name = "child-run"\n[checkpoint]\nsave = "runs/child/ckpt"\n')
    fixed = 'name = "child-run"\n[checkpoint]\nsave = "runs/{name}/checkpoints"\n'
    assert not _inherited(tmp_path, parent, fixed)
    assert not [i for i in load_for("validate", tmp_path / "child.toml")[2] if i.severity == "error"]
    # an inherited placeholder follows the child's name
    assert not _inherited(tmp_path, '\n[checkpoint]\nsave = "runs/{name}/checkpoints"\n', 'name = "child-run"\n')


def test_resume_from_run_says_the_inherited_checkpoint_folder_is_meant(tmp_path) -> None:
    parent = '\n[checkpoint]\nsave = "runs/base/checkpoints"\n'
    assert not _inherited(tmp_path, parent, 'name = "child"\n[checkpoint]\nresume_from_run = "base"\n')
    (found,) = _inherited(tmp_path, parent, 'name = "child"\n[checkpoint]\nresume_from_run = "third"\n')
    assert found.severity == "error" and 'resume_from_run = "base"' in found.hint


#: (a path key, the parent's literal value holding its name, the finding's severity, the key's table).
NAMED_PATHS = [
    ("checkpoint.save", "runs/base/checkpoints", "error", "checkpoint"),
    ("checkpoint.load", "runs/base/checkpoints", "error", "checkpoint"),
    ("logging.run_dir", "runs/base", "warning", "logging"),
    ("logging.tensorboard_dir", "runs/base/tensorboard", "warning", "logging"),
    ("logging.wandb_exp_name", "base-v1", "warning", "logging"),
    ("cluster.slurm.job_name", "base", "warning", "cluster.slurm"),
]


@pytest.mark.parametrize("key, value, severity, table", NAMED_PATHS, ids=[k for k, *_ in NAMED_PATHS])
def test_every_inherited_path_holding_the_parents_name_is_flagged(tmp_path, key, value, severity, table) -> None:
    leaf = key.rsplit(".", 1)[1]
    parent = f'\n[{table}]\n{leaf} = "{value}"\n'
    (found,) = _inherited(tmp_path, parent, 'name = "child"\n')
    assert (found.key, found.severity, found.value) == (key, severity, value)
    fix = value.replace("base", "{name}")
    assert f'{key} = "{fix}"' in found.hint
    # the fix, written in the child, validates and is quiet
    assert not _inherited(tmp_path, parent, f'name = "child"\n[{table}]\n{leaf} = "{fix}"\n')
    assert not [i for i in load_for("validate", tmp_path / "child.toml")[2] if i.severity == "error"]


def test_a_relative_spec_path_with_set_name_is_not_an_inherited_folder(tmp_path, monkeypatch) -> None:
    """A false positive to avoid: `dlmspec validate spec.toml --set name=x`, with no parent."""
    from dlmspec.cli import main

    (tmp_path / "spec.toml").write_text(_valid_base() + '\n[checkpoint]\nsave = "runs/base/checkpoints"\n',
                                        encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert not [w for w in load_for("validate", "spec.toml", ["name=\"x\""])[2] if w.rule == "checkpoint-inherited"]
    assert main(["validate", "spec.toml", "--set", "name=\"x\"", "--json"]) == 0


@pytest.mark.parametrize(("rule", "changes", "key"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires(rule: str, changes: dict[str, Any], key: str) -> None:
    found = [i for i in find(FILES if RULES[rule].scope == "paths" else ("spec",), make(changes)) if i.rule == rule]
    assert found, f"{rule} did not fire"
    issue = next((i for i in found if i.key == key), None)
    assert issue is not None, [i.key for i in found]
    assert issue.severity == RULES[rule].severity
    assert issue.source == RULES[rule].source
    assert issue.message and issue.hint, "every issue says why and what works"


def test_a_leftover_tokenizer_key_warns_with_its_removal() -> None:
    """``data.tokenizer.vocab_size`` sizes only a NullTokenizer: left in a spec whose tokenizer is
    GPT-2's BPE (after ``--set data.tokenizer.type=...``) it is a warning whose fix removes it."""
    spec = make({"data.tokenizer": {"type": "GPT2BPETokenizer", "vocab_file": "v.json", "merge_file": "m.txt",
                                    "vocab_size": 999}, "model.vocab_size": 50304})
    (issue,) = [i for i in find(("spec",), spec) if i.rule == "tokenizer-keys-ignored"]
    assert (issue.key, issue.severity, issue.value) == ("data.tokenizer.vocab_size", "warning", 999)
    assert "GPT2BPETokenizer" in issue.message and "remove data.tokenizer.vocab_size" in issue.hint
    assert issue.fix is not None and issue.fix.unset == ("data.tokenizer.vocab_size",) and not issue.fix.set
    # the keys a type reads are quiet: BASE (NullTokenizer with vocab_size) has no issue
    assert not [i for i in find(("spec",), make()) if i.rule == "tokenizer-keys-ignored"]


def test_rule_metadata() -> None:
    for rule in RULES.values():
        assert rule.severity in ("error", "warning")
        assert rule.source and rule.summary


# Combinations that look close to a rule but are legal.
@pytest.mark.parametrize(
    "changes",
    [
        # megatron-core accepts num_query_groups dividing TP (KV heads replicated).
        {"model.num_query_groups": 2, "parallel.tensor_model_parallel_size": 4},
        {"parallel.tensor_model_parallel_size": 2, "parallel.sequence_parallel": True},
        {"parallel.pipeline_model_parallel_size": 2, "parallel.virtual_pipeline_model_parallel_size": 2},
        {"model.num_attention_heads": 12, "model.kv_channels": 32},
        {"objective.kind": "ar"},
        {"objective.attention_mask": "block_causal", "objective.block_size": 32},
        {"recompute.granularity": "full", "recompute.method": "uniform", "recompute.num_layers": 4},
        # (on the TE layers, which "auto" may take, 'core_attn' warns: recompute-core-attn-te)
        {"recompute.granularity": "selective", "recompute.modules": ["core_attn", "mlp"], "model.transformer_impl": "local"},
        {"recompute.granularity": "selective", "recompute.modules": ["mlp"]},
        {"train.train_iters": None, "train.train_tokens": 3_276_800},
        {"train.lr_decay_style": "WSD", "train.lr_wsd_decay_iters": 20},
        {"train.lr_decay_style": "piecewise", "train.lr_points": [[10, 3e-4], [50, 3e-4], [50, 1e-4], [100, 3e-5]]},
        {"train.lr_decay_style": "piecewise", "train.lr_warmup_iters": 0, "train.lr_points": [[0, 1e-4], [100, 0.0]]},
        {"train.lr_warmup_iters": 0, "train.lr_warmup_fraction": 0.05},
        {**MOE, "parallel.expert_model_parallel_size": 8, "model.moe_layer_freq": [1, 0] * 4},
        {**MOE, "parallel.tensor_model_parallel_size": 2, "parallel.expert_model_parallel_size": 2,
         "parallel.sequence_parallel": True},
        {"data.train": [], "data.mock": True},
        {"data.valid": ["data/v_text_document"], "data.split": "garbage"},
        {"precision.fp8": "hybrid", "cluster.gpu": "l40s"},
        {"checkpoint.init_from": "hf:/models/llada", "checkpoint.save": "runs/t/checkpoints"},
        {"parallel.fsdp": "megatron", "parallel.data_parallel_sharding_strategy": "optim_grads_params"},
        {"parallel.context_parallel_size": 2, "parallel.cp_comm_type": "a2a"},
        {"parallel.context_parallel_size": 2, "parallel.cp_comm_type": "allgather", "model.transformer_impl": "local"},
        {"parallel.context_parallel_size": 2, "parallel.cp_comm_type": "allgather", "model.transformer_impl": "local",
         "objective.attention_mask": "block_causal", "objective.block_size": 32},
        {"parallel.context_parallel_size": 2, "parallel.cp_comm_type": "allgather", "model.transformer_impl": "local",
         "objective.kind": "ar"},
        {**MOE, "model.add_bias_linear": True, "parallel.tensor_model_parallel_size": 2,
         "parallel.expert_tensor_parallel_size": 1},
    ],
)
def test_legal_combinations_are_clean(changes: dict[str, Any]) -> None:
    assert find(("spec",), make(changes)) == []


def test_expert_parallel_rule_does_not_repeat_the_tp_error() -> None:
    rules = rules_of(make({"cluster.gpus_per_node": 6, "parallel.tensor_model_parallel_size": 4}))
    assert "world-divisible-by-model-parallel" in rules
    assert "world-divisible-by-expert-parallel" not in rules


def test_tp_hint_lists_only_working_sizes() -> None:
    issue = next(i for i in find(("spec",), make({"parallel.tensor_model_parallel_size": 8, "model.num_query_groups": 4,
                                               "model.num_attention_heads": 12, "model.kv_channels": 32}))
                 if i.rule == "tp-divides-heads")
    assert issue.hint == "set parallel.tensor_model_parallel_size = 4 (also 1 or 2 fit)"
    assert issue.fix is not None and issue.fix.set == {"parallel.tensor_model_parallel_size": 4}


def test_batch_hint_gives_neighbouring_multiples() -> None:
    issue = next(i for i in find(("spec",), make({"train.global_batch_size": 60})) if i.rule == "batch-divisible")
    assert issue.value == 60
    assert issue.hint == "use global_batch_size = 48 or 64"


def test_findings_are_sorted_errors_first_and_deterministic() -> None:
    spec = make({"train.global_batch_size": 60, "train.eval_interval": 200, "parallel.sequence_parallel": True})
    first, second = find(("spec",), spec), find(("spec",), spec)
    assert [i.to_dict() for i in first] == [i.to_dict() for i in second]
    severities = [i.severity for i in first]
    assert severities == sorted(severities, key=lambda s: s != "error")
    assert {"batch-divisible", "sequence-parallel-needs-tp", "eval-interval"} <= {i.rule for i in first}


TOML = """\
name = "lines"

[model]
preset = "llada-8b"

[parallel]
tensor_model_parallel_size = 5

[train]
micro_batch_size = 1
global_batch_size = 9
seq_length = 4096
train_iters = 100
eval_interval = 10

[data]
mock = true

[data.tokenizer]
type = "NullTokenizer"
vocab_size = 126000

[cluster]
gpus_per_node = 10
"""


def test_findings_point_at_file_and_line() -> None:
    loaded = load_text(TOML, name="specs/lines.toml")
    issues = {i.rule: i for i in find(("spec",), loaded)}
    assert (issues["batch-divisible"].file, issues["batch-divisible"].line) == ("specs/lines.toml", 11)
    assert issues["tp-divides-heads"].line == 7
    # ffn_hidden_size comes from the preset: the issue points at `preset = ...`.
    assert issues["tp-divides-ffn"].key == "model.ffn_hidden_size"
    assert issues["tp-divides-ffn"].line == 4
    assert str(issues["batch-divisible"]).startswith("specs/lines.toml:11: error: train.global_batch_size = 9:")


def test_one_run_finds_every_finding() -> None:
    loaded = load_text(TOML, name="lines.toml")
    issues = find(("spec",), loaded)
    assert {"batch-divisible", "tp-divides-heads", "tp-divides-ffn"} <= {i.rule for i in issues}
    assert len([i for i in issues if i.severity == "error"]) >= 3


def test_warnings_are_findings_of_their_own() -> None:
    assert [(w.rule, w.severity) for w in find(("spec",), make({"train.eval_interval": 200}))] == [
        ("eval-interval", "warning")]
    assert find(("spec",), make()) == []


def test_load_for(tmp_path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(TOML.replace("tensor_model_parallel_size = 5", "tensor_model_parallel_size = 2")
                    .replace("gpus_per_node = 10", "gpus_per_node = 8")
                    .replace("global_batch_size = 9", "global_batch_size = 16"), encoding="utf-8")
    _, resolved, issues = load_for("spec", path)
    assert resolved.dp == 4 and resolved.num_microbatches == 4
    assert issues == []
    _, _, issues = load_for("spec", path, ["train.global_batch_size=10"])
    issue = issues[0]
    assert (issue.rule, issue.file, issue.value) == ("batch-divisible", "--set", 10)


@pytest.mark.parametrize(
    ("changes", "report"),
    [
        # data_parallel_sharding_strategy without Megatron FSDP has no effect (train.py never
        # passes it): one warning, and the compiler does not refuse it.
        ({"parallel.data_parallel_sharding_strategy": "optim_grads"}, [("sharding-needs-megatron-fsdp", "warning")]),
        # fp8 with megatron-core's local layers: one error, the validator's.
        ({"precision.fp8": "hybrid", "model.transformer_impl": "local"}, [("fp8-needs-te", "error")]),
    ],
)
def test_one_problem_one_report(changes: dict[str, Any], report: list[tuple[str, str]]) -> None:
    """Problems the spec rules report are not reported again by the runtime's rules
    (dlmspec.check.runtime)."""
    spec = make(changes)
    assert [(i.rule, i.severity) for i in find(("spec",), spec)] == report
    assert find(("runtime",), spec) == []


def test_divisors_are_exact_for_real_sizes_and_bounded_for_huge_ones() -> None:
    from dlmspec.check.hints import DIVISOR_LIMIT, divisors

    assert divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(1) == [1] and divisors(0) == []
    assert divisors(2 * 3 * 5 * 7 * 11 * 13) == [d for d in range(1, 30031) if 30030 % d == 0]
    # A prime far beyond any real size: only 1 (its divisors up to the limit), without 2**61 steps.
    assert divisors(2**61 - 1) == [1]
    assert divisors(2**40) == [2**k for k in range(17)] and 2**16 == DIVISOR_LIMIT


def test_huge_sizes_get_hints_not_hangs() -> None:
    issue = next(i for i in find(("spec",), make({"model.num_attention_heads": 2**61 - 1, "model.kv_channels": 32,
                                               "parallel.tensor_model_parallel_size": 8}))
                 if i.rule == "tp-divides-heads")
    assert issue.hint == "set parallel.tensor_model_parallel_size = 1"


@pytest.mark.parametrize(
    ("changes", "warned"),
    [
        ({"data.train": ["data/x_text_document"]}, set()),
        ({"data.tokenizer.type": "HuggingFaceTokenizer", "data.tokenizer.model": "Qwen/Qwen3-1.7B",
          "data.tokenizer.eod_id": 5}, set()),  # a hub id: the tokenizer loads from the hub
        ({"data.tokenizer.type": "HuggingFaceTokenizer", "data.tokenizer.model": "./tok/tokenizer.json",
          "data.tokenizer.eod_id": 5}, {"data.tokenizer.model"}),
        ({"checkpoint.init_from": "mcore:ckpt"}, set()),
        ({"checkpoint.init_from": "hf:Qwen/Qwen3-1.7B"}, {"checkpoint.init_from"}),  # converted from a local folder
        ({"checkpoint.save": "new-run", "checkpoint.load": "new-run"}, set()),  # written by this run
        ({"data.mock": True, "data.train": []}, set()),
    ],
)
def test_path_warnings(tmp_path, monkeypatch: pytest.MonkeyPatch, changes: dict[str, Any], warned: set[str]) -> None:
    """Relative paths are looked up from the current directory (where the job is launched)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    for suffix in (".bin", ".idx"):
        (tmp_path / "data" / f"x_text_document{suffix}").write_bytes(b"")
    (tmp_path / "ckpt").mkdir()
    found = [i for i in find(FILES, make(changes)) if i.rule == "path-not-found"]
    assert {i.key for i in found} == warned
    assert all(i.severity == "warning" and "not on this machine" in i.message for i in found)


# ------------------------------------------------------------------------------------------
# mask-token-not-pad: the tokenizer's pad id (read from a local Hugging Face folder)


def _hf_tokenizer(folder: Path, config: dict[str, Any] | None = None, special: dict[str, Any] | None = None,
                  tokenizer: dict[str, Any] | None = None) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (("tokenizer_config.json", config), ("special_tokens_map.json", special),
                       ("tokenizer.json", tokenizer)):
        if data is not None:
            (folder / name).write_text(json.dumps(data))
    return str(folder)


def _hf(folder: str, **changes: Any) -> Spec:
    return make({"data.tokenizer.type": "HuggingFaceTokenizer", "data.tokenizer.model": folder,
                 "data.tokenizer.vocab_size": None, "data.tokenizer.eod_id": 999, **changes})


def _pad_issues(spec: Spec, paths: bool = True) -> list:
    return [i for i in find(FILES if paths else ("spec",), spec) if i.rule in ("mask-token-not-pad", "mask-token-distinct")]


@pytest.mark.parametrize("files", [
    # pad_token named in tokenizer_config.json, its id in added_tokens_decoder
    {"config": {"pad_token": "<pad>", "added_tokens_decoder": {"7": {"content": "<pad>", "special": True}}}},
    # pad_token as an AddedToken dict; its id in tokenizer.json's added_tokens
    {"config": {"pad_token": {"content": "<pad>", "__type": "AddedToken"}},
     "tokenizer": {"added_tokens": [{"id": 7, "content": "<pad>"}], "model": {"vocab": {}}}},
    # pad_token only in special_tokens_map.json; its id in tokenizer.json's vocabulary
    {"config": {}, "special": {"pad_token": "<pad>"}, "tokenizer": {"model": {"vocab": {"<pad>": 7, "a": 8}}}},
])
def test_mask_token_is_not_the_tokenizers_pad_id(tmp_path: Path, files: dict[str, Any]) -> None:
    """A padded position would be indistinguishable from a masked one: [MASK] = the pad id of a
    local Hugging Face tokenizer is an error (with a free padded slot as the fix); another id is
    clean; the rule reads files, so it runs only in the paths scope (dlmspec validate)."""
    folder = _hf_tokenizer(tmp_path / "tok", **files)
    (issue,) = _pad_issues(_hf(folder, **{"objective.mask_token_id": 7}))
    assert (issue.rule, issue.key, issue.value, issue.severity) == ("mask-token-not-pad", "objective.mask_token_id", 7,
                                                                    "error")
    assert "'<pad>'" in issue.message and "indistinguishable from a masked one" in issue.message
    assert "objective.mask_token_id = 1000" in issue.hint
    assert _pad_issues(_hf(folder, **{"objective.mask_token_id": 1000})) == []
    assert _pad_issues(_hf(folder, **{"objective.mask_token_id": 7}), paths=False) == []


def test_pad_rule_is_quiet_without_a_readable_pad(tmp_path: Path) -> None:
    """No pad token, an id that cannot be found, unreadable JSON, a hub id or a missing folder:
    the validator cannot tell, and says nothing."""
    cases = [
        _hf_tokenizer(tmp_path / "none", config={"eos_token": "</s>"}),
        _hf_tokenizer(tmp_path / "unknown-id", config={"pad_token": "<pad>"}),
        str(tmp_path / "missing"),
        "org/tokenizer",
    ]
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "tokenizer_config.json").write_text("{not json")
    cases.append(str(tmp_path / "garbage"))
    for folder in cases:
        assert _pad_issues(_hf(folder, **{"objective.mask_token_id": 7})) == [], folder


def test_pad_that_is_also_eod_is_reported_once(tmp_path: Path) -> None:
    """[MASK] = pad = EOD: mask-token-distinct (the EOD rule) reports it, not a second issue."""
    folder = _hf_tokenizer(tmp_path / "tok", config={"pad_token": "</s>",
                                                     "added_tokens_decoder": {"999": {"content": "</s>"}}})
    assert [i.rule for i in _pad_issues(_hf(folder, **{"objective.mask_token_id": 999}))] == ["mask-token-distinct"]


def test_validate_reports_mask_equal_to_pad_with_file_line_and_remedy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`dlmspec validate` exits 2 and names the file, the line of objective.mask_token_id, the
    key, the value, why and an id that works."""
    from dlmspec.cli import main

    monkeypatch.chdir(tmp_path)
    _hf_tokenizer(tmp_path / "tok", config={"pad_token": "<pad>",
                                            "added_tokens_decoder": {"7": {"content": "<pad>"}}})
    text = (
        'name = "pad"\n'
        "[model]\nnum_layers = 2\nhidden_size = 64\nffn_hidden_size = 128\nnum_attention_heads = 4\n"
        "vocab_size = 1000\nmax_position_embeddings = 256\n"
        "[objective]\nkind = \"mdm\"\nmask_token_id = 7\n"
        "[train]\nglobal_batch_size = 8\nseq_length = 128\ntrain_iters = 10\n"
        '[data]\nmock = true\n[data.tokenizer]\ntype = "HuggingFaceTokenizer"\nmodel = "tok"\neod_id = 999\n'
        '[cluster]\ngpu = "h100"\ngpus_per_node = 1\n'
    )
    spec = tmp_path / "pad.toml"
    spec.write_text(text)
    assert main(["validate", str(spec), "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    (issue,) = [i for i in report["issues"] if i["severity"] == "error"]
    assert (issue["rule"], issue["key"], issue["value"]) == ("mask-token-not-pad", "objective.mask_token_id", 7)
    assert issue["file"].endswith("pad.toml") and text.splitlines()[issue["line"] - 1] == "mask_token_id = 7"
    assert "padded position would be indistinguishable from a masked one" in issue["message"]
    assert issue["hint"] == "use another id: set objective.mask_token_id = 1000 (a padded slot of the embedding)"
    assert issue["fix"] == {"set": {"objective.mask_token_id": 1000}, "unset": []}
    spec.write_text(text.replace("mask_token_id = 7", "mask_token_id = 1000"))
    assert main(["validate", str(spec)]) == 0



def test_a_misspelt_table_given_by_set_is_reported_at_set(tmp_path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(TOML, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_for("spec", path, ["paralel.tensor_model_parallel_size=4"])
    issue = next(i for i in info.value.issues if i.key == "paralel")
    assert (issue.file, issue.hint) == ("--set", "did you mean 'parallel'?")


def test_schema_errors_and_rule_errors_are_reported_in_one_run(tmp_path) -> None:
    """A wrong type and an unknown key do not hide the cross-field rules: they run on the rest of
    the spec (rejected keys at their defaults), and say nothing about the rejected keys."""
    path = tmp_path / "s.toml"
    path.write_text(TOML, encoding="utf-8")  # TP 5 does not divide the heads; batch 9 not by DP
    with pytest.raises(SpecError) as info:
        load_for("spec", path, ["train.lr=fast", "train.micro_bach_size=2"])
    rules = {i.rule for i in info.value.errors}
    assert {"schema", "tp-divides-heads"} <= rules
    assert not [i for i in info.value.issues if i.rule != "schema" and i.key == "train.lr"]
    # a missing required key leaves no spec to run the rules on: the schema errors alone
    path.write_text(TOML.replace("global_batch_size = 9\n", ""), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_for("spec", path)
    assert {i.rule for i in info.value.errors} == {"schema"}


def test_an_inherited_tokenizer_key_is_not_reported(tmp_path) -> None:
    """A child that changes the tokenizer type cannot remove the keys its parent wrote for the
    old type (TOML has no null): those are not reported, so ``--strict`` can pass; the same key
    written in the child itself is (the new-user trial)."""
    from dlmspec.check import load_for

    parent = tmp_path / "parent.toml"
    parent.write_text(Path(__file__).resolve().parents[3].joinpath("specs", "demo-dlm.toml").read_text())
    child = tmp_path / "child.toml"
    child.write_text('extends = "parent.toml"\nname = "child"\n[data.tokenizer]\ntype = "NullTokenizer"\n'
                     'vocab_size = 50256\n')
    issues = load_for("validate", child, [])[2]
    assert not [i for i in issues if i.rule == "tokenizer-keys-ignored"], [(i.key, i.file) for i in issues]
    child.write_text(child.read_text() + 'model = "leftover"\n')
    (issue,) = [i for i in load_for("validate", child, [])[2] if i.rule == "tokenizer-keys-ignored"]
    assert issue.key == "data.tokenizer.model"


def test_inherited_tensorboard_remedy_agrees_with_the_runtime_rule(tmp_path) -> None:
    """checkpoint-inherited's fix of an inherited TensorBoard folder is <run_dir>/tensorboard, the
    one folder the runtime writes (rule runtime-tensorboard-dir): applied, neither rule fires
    (the new-user trial found the two fixes disagreeing)."""
    from dlmspec.check import load_for

    text = Path(__file__).resolve().parents[3].joinpath("specs", "demo-dlm.toml").read_text()
    text = text.replace('name = "demo-dlm"', 'name = "p4"').replace(
        'tensorboard_dir = "runs/{name}/tensorboard"', 'tensorboard_dir = "runs/p4/tb"')
    (tmp_path / "p4.toml").write_text(text)
    child = tmp_path / "c4.toml"
    child.write_text('extends = "p4.toml"\nname = "c4"\n')
    issues = load_for("validate", child, [])[2]
    (inherited,) = [i for i in issues if i.rule == "checkpoint-inherited" and i.key == "logging.tensorboard_dir"]
    assert "that run's events" in inherited.message
    value = inherited.fix.set["logging.tensorboard_dir"]
    child.write_text(child.read_text() + f'[logging]\ntensorboard_dir = "{value}"\n')
    after = load_for("validate", child, [])[2]
    assert not [i for i in after if i.key == "logging.tensorboard_dir"], [(i.rule, i.hint) for i in after]
