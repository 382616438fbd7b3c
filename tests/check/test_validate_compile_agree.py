"""``dlmspec validate`` and ``dlmspec compile`` agree (issues 15 and 16): on every bundled spec,
every starter spec and one failing example of every rule of :data:`dlmspec.check.RULES` (the
loader's, the spec's, the files', SLURM's, memory's and the runtime's), both exit with the same
code and report the same issues (rule, key, severity), and the example's rule is among them. The
memory rule has one override, ``cluster.allow_memory_overflow``, which both honour and the lock
file keeps."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from typer.testing import CliRunner

import dlmspec.check.memory
import dlmspec.cli
import dlmspec.cli.app
import dlmspec.cli.commands
import dlmspec.cli.output
import dlmspec.cli.plan
import dlmspec.cli.validate
import blend_examples
import sft_examples
import eval_generation_examples
import test_validate
import test_validate_hardening
from dlmspec.check import RULES
from dlmspec.cli import main
from dlmspec.cli.commands import app
from dlmspec.plan import PlanError
from dlmspec.spec.presets import PRESETS

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "specs").glob("*.toml"))

#: Nodes a starter spec of these presets needs to fit H100s (what `dlmspec new` suggests).
STARTER_NODES = {"llama-3-70b": 4, "mixtral-8x7b": 2, "qwen3-30b-a3b": 2}

#: A small valid spec (8 GPUs, data parallel): the failing examples change it.
BASE: dict[str, Any] = {
    "name": "t",
    "model": {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024, "num_attention_heads": 8,
              "num_query_groups": 4, "vocab_size": 1000, "max_position_embeddings": 1024},
    "train": {"micro_batch_size": 2, "global_batch_size": 64, "seq_length": 512, "train_iters": 100,
              "lr_warmup_iters": 10, "eval_interval": 50},
    "data": {"train": ["data/x_text_document"], "tokenizer": {"type": "NullTokenizer", "vocab_size": 999}},
    "cluster": {"gpu": "h100", "gpus_per_node": 8, "nodes": 1},
    "logging": {"tensorboard_dir": "runs/t/tensorboard"},
}

#: A peak of about 105 GiB per GPU on H100s (80 GiB): the memory rule's example.
TOO_BIG = {"train.seq_length": 262144, "model.max_position_embeddings": 262144, "train.micro_batch_size": 8}

#: A peak of 99.5% of an H100's memory: the headroom rule's example.
TIGHT = {"train.seq_length": 196608, "model.max_position_embeddings": 196608, "train.micro_batch_size": 8}

#: (changes to BASE, the rule and key that refuse it): the rules of the runtime, SLURM, memory
#: and the end-of-document id, and a schema error beside a rule error.
#: A block-diffusion spec that validates (the base of the bd3lm rules' examples).
BD3 = {"objective.kind": "bd3lm", "objective.block_size": 16, "model.transformer_impl": "local",
       "model.attention_backend": "flex"}

FAILING: list[tuple[dict[str, Any], str, str]] = [
    ({k: v for k, v in BD3.items() if k != "objective.block_size"}, "bd3lm-needs-block-size", "objective.block_size"),
    ({**BD3, "objective.block_size": 24}, "bd3lm-block-divides-seq", "objective.block_size"),
    ({**BD3, "objective.noise_clip_min": 0.8, "objective.noise_clip_max": 0.3}, "bd3lm-noise-clip-order",
     "objective.noise_clip_min"),
    ({"objective.ar_loss_weight": 0.5}, "bd3lm-keys-ignored", "objective.ar_loss_weight"),
    ({**BD3, "objective.shift": True}, "bd3lm-mdm-keys-ignored", "objective.shift"),
    ({**BD3, "objective.variable_length_prob": 0.01}, "bd3lm-variable-length", "objective.variable_length_prob"),
    ({**BD3, "objective.attention_mask": "block_causal"}, "bd3lm-attention-mask", "objective.attention_mask"),
    ({"objective.kind": "bd3lm", "objective.block_size": 16, "model.transformer_impl": "transformer_engine"},
     "bd3lm-transformer-engine", "model.transformer_impl"),
    ({**BD3, "parallel.context_parallel_size": 2}, "bd3lm-context-parallel", "parallel.context_parallel_size"),
    ({**BD3, "parallel.pipeline_model_parallel_size": 2}, "bd3lm-pipeline", "parallel.pipeline_model_parallel_size"),
    ({**BD3, "data.reset_attention_mask": True}, "bd3lm-document-mask", "data.reset_attention_mask"),
    ({**BD3, "model.attention_backend": "sdpa"}, "bd3lm-dense-sdpa", "model.attention_backend"),
    ({**BD3, "stage.kind": "sft", "stage.sft": {"packed_sequence": True}}, "bd3lm-sft-packed",
     "stage.sft.packed_sequence"),
    ({**BD3, "objective.block_size_schedule": [[0, 4], [50, 48]]}, "bd3lm-block-schedule",
     "objective.block_size_schedule"),
    ({"generate.block_length": 30}, "generate-settings", "generate.block_length"),
    ({"stage.kind": "rl"}, "rl-table-missing", "stage.rl.prompts"),
    ({"eval.generation": {"prompts": "p.jsonl", "every": 70}, "data.tokenizer": {"type": "HuggingFaceTokenizer",
      "model": "org/name"}}, "eval-generation-every", "eval.generation.every"),
    ({"eval.generation": {"prompts": "p.jsonl"}, "parallel.pipeline_model_parallel_size": 2,
      "data.tokenizer": {"type": "HuggingFaceTokenizer", "model": "org/name"}}, "eval-generation-layout",
     "parallel.pipeline_model_parallel_size"),
    ({"stage.kind": "sft", "objective.variable_length_prob": 0.01}, "sft-variable-length",
     "objective.variable_length_prob"),
    ({"stage.kind": "sft", "stage.sft": {"packed_sequence": True, "pad_eos_tokens": 2}}, "sft-pad-eos-packed",
     "stage.sft.pad_eos_tokens"),
    ({"stage.kind": "sft", "stage.sft": {"packed_sequence": True}, "model.transformer_impl": "transformer_engine"},
     "sft-attention-mask", "model.transformer_impl"),
    ({"stage.kind": "sft", "data.mock": True}, "sft-mock-data", "data.mock"),
    ({"stage.kind": "sft", "data.eod_mask_loss": True}, "sft-pretraining-data", "data.eod_mask_loss"),
    ({"checkpoint.async_save": True}, "runtime-async-save", "checkpoint.async_save"),
    ({"parallel.fsdp": "torch"}, "runtime-torch-fsdp", "parallel.fsdp"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron", "parallel.use_distributed_optimizer": False},
     "runtime-fsdp-distributed-optimizer", "parallel.use_distributed_optimizer"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron", "parallel.pipeline_model_parallel_size": 2},
     "runtime-fsdp-pipeline", "parallel.pipeline_model_parallel_size"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "fused_linear"}, "runtime-fsdp-fused-ce",
     "kernels.cross_entropy"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron", "checkpoint.init_from": "mcore:runs/b/ckpt"},
     "runtime-fsdp-init-from", "checkpoint.init_from"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron", "precision.fp8": "hybrid",
      "model.transformer_impl": "transformer_engine"}, "runtime-fsdp-fp8", "precision.fp8"),
    ({"precision.fp8_dot_product_attention": True, "model.transformer_impl": "transformer_engine"}, "fp8-attention",
     "precision.fp8_dot_product_attention"),
    ({"model.num_experts": 8, "model.moe_grouped_gemm": True, "model.transformer_impl": "local"},
     "runtime-grouped-gemm-local", "model.moe_grouped_gemm"),
    ({"kernels.gradient_accumulation_fusion": True, "model.transformer_impl": "local"},
     "runtime-gradient-accumulation-fusion", "kernels.gradient_accumulation_fusion"),
    ({"objective.attention_mask": "block_causal", "objective.block_size": 32,
      "model.transformer_impl": "transformer_engine"}, "runtime-block-causal-te", "objective.attention_mask"),
    ({"model.attention_backend": "flex", "parallel.context_parallel_size": 2, "parallel.cp_comm_type": "allgather"},
     "attention-backend-masks", "model.attention_backend"),
    ({"logging.tensorboard_dir": "tb"}, "runtime-tensorboard-dir", "logging.tensorboard_dir"),
    ({"data.reset_attention_mask": True, "model.transformer_impl": "transformer_engine"},
     "runtime-document-mask-te", "data.reset_attention_mask"),
    ({"objective.variable_length_prob": 0.01, "objective.variable_length": "micro_batch",
      "parallel.pipeline_model_parallel_size": 2}, "runtime-variable-length-pipeline", "objective.variable_length"),
    (TOO_BIG, "memory-fits", "cluster.gpu"),
    (TIGHT, "memory-headroom", "cluster.gpu"),
    ({"data.tokenizer": {"type": "HuggingFaceTokenizer", "model": "org/name"}, "data.eod_mask_loss": True},
     "eod-id-unknown", "data.tokenizer.eod_id"),
    ({"cluster.slurm": {"partition": "bad name!"}}, "slurm-value", "cluster.slurm.partition"),
    ({"cluster.slurm": {"time": "4h"}}, "slurm-time", "cluster.slurm.time"),
    ({"cluster.slurm": {"signal_seconds_before_end": 70000}}, "slurm-signal", "cluster.slurm.signal_seconds_before_end"),
    ({"cluster.slurm": {"env": {"MASTER_PORT": "1"}}}, "slurm-env", "cluster.slurm.env.MASTER_PORT"),
    ({"cluster.slurm": {"env": {"HF_TOKEN": "x"}}}, "slurm-secret", "cluster.slurm.env.HF_TOKEN"),
    ({"cluster.slurm": {"container_mounts": ["/a:/a"]}}, "slurm-container", "cluster.slurm.container_mounts"),
    ({"train.lr": "fast", "parallel.tensor_model_parallel_size": 3}, "tp-divides-heads",
     "parallel.tensor_model_parallel_size"),
]

#: The warnings among those examples (the others are errors).
WARNING_EXAMPLES = {("memory-headroom", "cluster.gpu"), ("sft-variable-length", "objective.variable_length_prob"),
                    ("sft-pad-eos-packed", "stage.sft.pad_eos_tokens"), ("sft-pretraining-data", "data.eod_mask_loss"),
                    ("bd3lm-keys-ignored", "objective.ar_loss_weight"), ("bd3lm-mdm-keys-ignored", "objective.shift"),
                    ("bd3lm-dense-sdpa", "model.attention_backend")}

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


def spec_file(folder: Path, changes: dict[str, Any], name: str = "spec.toml") -> Path:
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    path = folder / name
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


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
    code, issues = assert_agree(spec_file(tmp_path, changes), tmp_path / "out", monkeypatch)
    severity = "warning" if (rule, key) in WARNING_EXAMPLES else "error"
    assert code == (2 if severity == "error" else 0) and (rule, key, severity) in issues


@pytest.mark.parametrize("name, text, args, rule, key", LOAD_FAILING, ids=[c[3] for c in LOAD_FAILING])
def test_load_examples(name: str, text: str | None, args: list[str], rule: str, key: str, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_file(tmp_path, {}, name) if text is None else tmp_path / name
    if text:
        spec.write_text(text, encoding="utf-8")
    code, issues = assert_agree(spec, tmp_path / "out", monkeypatch, args)
    assert code == 2 and (rule, key, "error") in issues, issues


def spec_rule_examples() -> dict[str, tuple[dict[str, Any], str]]:
    """One example per rule of the spec and paths scopes: the first case of the rule tests
    (tests/check/test_validate.py, test_validate_hardening.py) as spec data, and the key it names."""
    examples: dict[str, tuple[dict[str, Any], str]] = {}
    for rule, changes, key in test_validate.CASES:
        examples.setdefault(rule, (merged(test_validate.BASE, changes), key))
    for rule, changes, key, *_ in test_validate_hardening.CASES:
        examples.setdefault(rule, (merged(test_validate_hardening.BASE, changes), key))
    # [MASK] on an ordinary token of GPT-2's BPE (its layout when vocab.json cannot be read)
    examples["mask-token-ordinary"] = (merged(test_validate.BASE, {
        "data.tokenizer": {"type": "GPT2BPETokenizer", "vocab_file": "v.json", "merge_file": "m.txt"},
        "model.vocab_size": 50304, "objective.mask_token_id": 100}), "objective.mask_token_id")
    return examples


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with dotted-key ``changes``; a value of None deletes the key (as the rule tests'
    ``make``)."""
    data = copy.deepcopy(base)
    for key, value in changes.items():
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return data


SPEC_EXAMPLES = spec_rule_examples()


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
    spec_file(tmp_path, {"checkpoint.save": "runs/t/checkpoints"}, "base.toml")
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
    code, issues = assert_agree(spec_file(tmp_path, {}), tmp_path / "out", monkeypatch)
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
    code, issues = assert_agree(spec_file(tmp_path, changes), tmp_path / "out", monkeypatch)
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
    spec = spec_file(tmp_path, {**TOO_BIG, "cluster.allow_memory_overflow": True})
    code, issues = assert_agree(spec, tmp_path / "out", monkeypatch)
    assert code == 0 and ("memory-fits", "cluster.gpu", "warning") in issues
    code, planned = outcome(["plan", str(spec)], monkeypatch)
    assert code == 0 and ("memory-fits", "cluster.gpu", "warning") in planned
    lock = tomllib.loads((tmp_path / "out" / "spec.lock.toml").read_text())
    assert lock["cluster"]["allow_memory_overflow"] is True
    # The same spec without the override: an error everywhere, and the fix names the override.
    plain = spec_file(tmp_path, TOO_BIG, "plain.toml")
    assert outcome(["plan", str(plain)], monkeypatch)[0] == 2
    result = CliRunner().invoke(app, ["validate", str(plain), "--json"])
    (memory,) = [i for i in json.loads(result.stdout)["issues"] if i["rule"] == "memory-fits"]
    assert memory["severity"] == "error" and "cluster.allow_memory_overflow = true" in memory["hint"]
