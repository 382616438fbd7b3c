"""The published values against the generated code ("a test compiles each spec and
compares the generated code with it, so a drift fails CI").

tests/unit/specs/test_published_recipes.py holds each bundled spec's *resolved* values to its data file
(specs/published/*.toml); this file holds the *compiled train.py* to the same entries: each spec
is rendered in-process (:func:`dlmspec.render.compile.render`, no torch), its train.py parsed with
``ast``, and every entry whose key maps to a generated keyword (a megatron-core config field, a
runtime config field, a module constant) is compared with the literal there. An entry's expected
value is its published ``value`` where the spec matches it, else its recorded ``spec_value``. A
renderer that drops, renames or rewrites one of those keywords fails here. Every key a data file
names is either mapped below (:data:`KEYWORDS`) or listed as not generated (:data:`NOT_GENERATED`,
with the reason), so a new entry cannot slip past unchecked.
"""

from __future__ import annotations

import ast
import math
import tomllib
from functools import cache
from pathlib import Path
from typing import Any, Callable

import pytest

from dlmspec.render.compile import render
from dlmspec.resolve import Resolved, padded_vocab_size, resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
FILES = sorted((ROOT / "specs" / "published").glob("*.toml"))

#: An expected value as train.py writes it, from the entry's value and the resolved spec.
Expect = Callable[[Any, Resolved], Any]


def _same(value: Any, r: Resolved) -> Any:
    return value


def _blend(value: Any, r: Resolved) -> Any:
    return [(e["prefix"], e["weight"]) for e in value] or None


def _rollout_generate(r: Resolved, name: str, value: Any) -> dict[str, Any]:
    """The RL stage's ``generate`` keyword with ``name`` = ``value`` (equal to train.py's only
    when train.py holds that value)."""
    from dlmspec.check.rl import rollout_values

    return {**rollout_values(r.spec)["generate"], name: value}


#: Spec key -> the train.py keywords that carry it: (call, keyword, expected). ``call`` is the
#: called name (``TransformerConfig``, ``ObjectiveConfig``, ...), the variable a ``dict(...)`` is
#: assigned to (``PARALLEL_SIZES``, ``model_kwargs``), or ``module`` for a module-level constant.
KEYWORDS: dict[str, list[tuple[str, str, Expect]]] = {
    "cluster.gpus_per_node": [("module", "GPUS_PER_NODE", _same)],
    "parallel.tensor_model_parallel_size": [("PARALLEL_SIZES", "tensor_model_parallel_size", _same)],
    "parallel.pipeline_model_parallel_size": [("PARALLEL_SIZES", "pipeline_model_parallel_size", _same)],
    "parallel.use_distributed_optimizer": [("DistributedDataParallelConfig", "use_distributed_optimizer", _same),
                                           ("OptimizerConfig", "use_distributed_optimizer", _same)],
    "parallel.overlap_param_gather": [("DistributedDataParallelConfig", "overlap_param_gather", _same),
                                      ("OptimizerConfig", "overlap_param_gather", _same)],
    "parallel.overlap_grad_reduce": [("DistributedDataParallelConfig", "overlap_grad_reduce", _same)],
    "parallel.grad_reduce_in_fp32": [("DistributedDataParallelConfig", "grad_reduce_in_fp32", _same)],
    **{f"model.{name}": [("TransformerConfig", name, _same)] for name in (
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "normalization",
        "layernorm_epsilon", "add_bias_linear", "add_qkv_bias", "qk_layernorm", "hidden_dropout", "attention_dropout",
        "init_method_std", "moe_router_topk", "moe_ffn_hidden_size")},
    "model.num_experts": [("TransformerConfig", "num_moe_experts", _same)],
    "derived.kv_channels": [("TransformerConfig", "kv_channels", _same)],
    "model.activation": [("TransformerConfig", "gated_linear_unit", lambda v, r: {"swiglu": True}[v]),
                         ("TransformerConfig", "activation_func", lambda v, r: {"swiglu": "F.silu"}[v])],
    "model.vocab_size": [("DataConfig", "vocab_size", _same),
                         ("model_kwargs", "vocab_size",
                          lambda v, r: padded_vocab_size(v, r.spec.model.make_vocab_size_divisible_by, r.tp))],
    "model.make_vocab_size_divisible_by": [("model_kwargs", "vocab_size",
                                            lambda v, r: padded_vocab_size(r.spec.model.vocab_size, v, r.tp))],
    "model.max_position_embeddings": [("model_kwargs", "max_sequence_length", _same)],
    "model.position_embedding_type": [("model_kwargs", "position_embedding_type", _same)],
    "model.rotary_base": [("model_kwargs", "rotary_base", _same)],
    "model.rotary_percent": [("model_kwargs", "rotary_percent", _same)],
    "model.untie_embeddings_and_output_weights": [("model_kwargs", "share_embeddings_and_output_weights",
                                                   lambda v, r: not v)],
    "precision.dtype": [("TransformerConfig", "bf16", lambda v, r: v == "bf16"),
                        ("TransformerConfig", "fp16", lambda v, r: v == "fp16"),
                        ("OptimizerConfig", "bf16", lambda v, r: v == "bf16")],
    "derived.attention_mask": [("build_layer_spec", "attention", _same)],
    "derived.transformer_impl": [("build_layer_spec", "use_transformer_engine",
                                  lambda v, r: {"auto": None, "transformer_engine": True, "local": False}[v])],
    "kernels.sdpa_backend": [("build_layer_spec", "sdpa_backend", _same)],
    "derived.mask_token_id": [("ObjectiveConfig", "mask_token_id", _same)],
    **{f"objective.{name}": [("ObjectiveConfig", name, _same)] for name in (
        "kind", "eps", "loss_weighting", "variable_length_prob", "min_masked_tokens", "variable_length", "shift",
        "cart_p", "unshift")},
    "train.loss_normalization": [("ObjectiveConfig", "loss_normalization", _same),
                                 ("TransformerConfig", "calculate_per_token_loss", lambda v, r: v == "global_token")],
    **{f"train.{name}": [("OptimizerConfig", name, _same)] for name in (
        "optimizer", "lr", "min_lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad")},
    **{f"train.{name}": [("ScheduleConfig", name, _same)] for name in (
        "micro_batch_size", "global_batch_size", "lr_warmup_iters", "lr_decay_style", "lr_wsd_decay_style",
        "lr_wsd_decay_iters", "lr_points", "eval_interval", "eval_iters")},
    "train.train_tokens": [("ScheduleConfig", "train_iters", lambda v, r: math.ceil(v / r.tokens_per_step))],
    "train.seq_length": [("DataConfig", "seq_length", _same)],
    "train.seed": [("RunConfig", "seed", _same)],
    "data.valid": [("DataConfig", "valid_blend", _blend)],
    "data.split": [("DataConfig", "split", _same)],
    "data.num_workers": [("DataConfig", "num_workers", _same)],
    "data.tokenizer.eod_id": [("DataConfig", "eod_id", _same)],
    "checkpoint.save_interval": [("CheckpointConfig", "save_interval", _same)],
    "checkpoint.init_from": [("CheckpointConfig", "init_from", _same)],
    "logging.log_interval": [("LoggingConfig", "log_interval", _same)],
    "stage.sft.pad_eos_tokens": [("SftConfig", "pad_eos_tokens", lambda v, r: None if v == "unset" else v)],
    **{f"stage.rl.{name}": [("RLConfig", name, _same)] for name in (
        "advantage_scale", "chat_template", "grpo_clamp_eps_lower", "grpo_clamp_eps_upper", "grpo_group_size",
        "grpo_iterations", "grpo_kl_beta", "loss_normalization", "prompt_mask_prob", "prompts", "ref_model_sync_steps",
        "truncated_completions")},
    # the rollout sampler's [generate] settings: one dict keyword of RLConfig, holding the entry's value
    **{f"generate.{name}": [("RLConfig", "generate", lambda v, r, name=name: _rollout_generate(r, name, v))]
       for name in ("gen_length", "steps", "block_length", "remasking", "temperature")},
}

#: Keys of the data files that reach no train.py keyword, and why.
NOT_GENERATED: dict[str, str] = {
    "-": "no dlmspec key (the entry names the option it lacks)",
    "model.preset": "expanded into the model keys, each checked on its own",
    "data.tokenizer.type": "read by `dlmspec data prepare` and validate; train.py names it in a comment only",
    "data.tokenizer.model": "read by `dlmspec data prepare` and validate; train.py names it in a comment only",
    "checkpoint.format": "torch_dist is the only format the runtime writes (no keyword)",
    "cluster.gpu": "reaches train.py as the GPU's peak (LoggingConfig.peak_tflops_per_gpu) and the plan",
    "derived.parameters.total": "a count the compiler writes in a comment",
    "derived.parameters.non_embedding": "a count the compiler writes in a comment",
    "stage.kind": "the SFT stage is not rendered yet (rule runtime-sft refuses it)",
    "cluster.slurm.time": "reaches launch.sbatch (#SBATCH --time), not train.py",
    "stage.sft.mask_prompt": "the SFT stage is not rendered yet (rule runtime-sft refuses it)",
    "stage.sft.chat_template": "the SFT stage is not rendered yet (rule runtime-sft refuses it)",
}


def _literal(node: ast.expr) -> Any:
    """A keyword's value: the Python literal, else its source text (``F.silu``)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def generated_keywords(source: str) -> dict[str, dict[str, Any]]:
    """The keyword arguments of every call in a train.py, by called name (a ``dict(...)`` by the
    name it is assigned to), and the module's constants under ``"module"``.

    Raises:
        AssertionError: a name is called twice (its keywords would be ambiguous).
    """
    tree = ast.parse(source)
    assigned = {id(node.value): node.targets[0].id for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)}
    found: dict[str, dict[str, Any]] = {"module": {}}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if not isinstance(node.value, ast.Call):
                found["module"][node.targets[0].id] = _literal(node.value)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func).rsplit(".", 1)[-1]
        if name == "dict":
            name = assigned.get(id(node), "dict")
        keywords = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg is not None}
        if not keywords:
            continue
        assert name not in found, f"{name} is called twice in train.py"
        found[name] = keywords
    return found


def _equal(expected: Any, actual: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool) or expected is None or actual is None:
        return expected is actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return math.isclose(expected, actual, rel_tol=1e-12) or expected == actual
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        return len(expected) == len(actual) and all(_equal(e, a) for e, a in zip(expected, actual))
    return expected == actual


def _expected(entry: dict[str, Any]) -> tuple[bool, Any]:
    """(whether the entry states the spec's value, that value)."""
    if entry["status"] == "matches":
        return True, entry["value"]
    if "spec_value" in entry:
        return True, entry["spec_value"]
    return False, None


def drift(entries: list[dict[str, Any]], resolved: Resolved, source: str) -> tuple[int, list[str]]:
    """Compare a train.py's keywords with a data file's entries.

    Returns:
        (the number of keywords compared, one line per keyword that differs or is missing).
    """
    keywords = generated_keywords(source)
    checked, wrong = 0, []
    for i, entry in enumerate(entries, start=1):
        stated, value = _expected(entry)
        if not stated or entry["key"] not in KEYWORDS:
            continue
        for call, keyword, expect in KEYWORDS[entry["key"]]:
            want = expect(value, resolved)
            if call not in keywords or keyword not in keywords[call]:
                wrong.append(f"setting {i} {entry['key']}: train.py has no {call}({keyword}=...) (expected {want!r})")
            elif not _equal(want, keywords[call][keyword]):
                wrong.append(f"setting {i} {entry['key']}: train.py has {call}({keyword}={keywords[call][keyword]!r}), "
                             f"the data file says {want!r}")
            checked += 1
    return checked, wrong


@cache
def _compiled(spec: str) -> tuple[Resolved, str]:
    resolved = resolve(load(ROOT / "specs" / f"{spec}.toml").spec)
    return resolved, render(resolved, f"specs/{spec}.toml")["train.py"]


def _entries(path: Path) -> list[dict[str, Any]]:
    return tomllib.loads(path.read_text(encoding="utf-8"))["setting"]


def test_every_key_is_mapped_or_said_not_generated() -> None:
    keys = {entry["key"] for path in FILES for entry in _entries(path)}
    assert not set(KEYWORDS) & set(NOT_GENERATED)
    assert keys <= set(KEYWORDS) | set(NOT_GENERATED), sorted(keys - set(KEYWORDS) - set(NOT_GENERATED))


#: How many train.py keywords each data file's entries reach (at least: a mapping or an entry lost
#: would lower it).
CHECKED = {"dream-7b-adapt": 25, "llada-8b-pretrain": 38, "megadlms-1.7b-ar": 5, "megadlms-1.7b-mdm": 71,
           "megadlms-1.7b-sft": 11, "mixtral-8x7b-mdm": 15, "llada-8b-d1-gsm8k": 34}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_compiled_train_py_holds_the_recorded_values(path: Path) -> None:
    resolved, source = _compiled(path.stem)
    checked, wrong = drift(_entries(path), resolved, source)
    assert not wrong, f"{path.name} against the compiled train.py:\n  " + "\n  ".join(wrong)
    assert checked >= CHECKED[path.stem], f"{checked} keywords compared, {CHECKED[path.stem]} before"


def test_a_renderer_drift_fails() -> None:
    """A changed literal, a renamed keyword and a dropped call are each reported."""
    resolved, source = _compiled("megadlms-1.7b-mdm")
    entries = _entries(FILES[[p.stem for p in FILES].index("megadlms-1.7b-mdm")])
    assert "        lr=0.0002,\n" in source and "lr_wsd_decay_style='exponential'," in source
    for changed, key in ((source.replace("        lr=0.0002,\n", "        lr=0.0003,\n"), "train.lr"),
                         (source.replace("lr_wsd_decay_style=", "wsd_decay_style="), "train.lr_wsd_decay_style"),
                         (source.replace("overlap_param_gather=True", "overlap_param_gather=False"),
                          "parallel.overlap_param_gather"),
                         (source.replace("calculate_per_token_loss=False", "calculate_per_token_loss=True"),
                          "train.loss_normalization")):
        _, wrong = drift(entries, resolved, changed)
        assert wrong and all(f" {key}: " in line for line in wrong), wrong


def test_keywords_are_read_from_the_code_not_comments() -> None:
    source = ("X = 3  # X = 4\n"
              "c = dict(a=1, b=F.silu)\n"
              "def f():\n    return Run(seed=7, data=Data(vocab_size=5, blend=[('p', 1.0)]))  # seed=8\n")
    assert generated_keywords(source) == {"module": {"X": 3}, "c": {"a": 1, "b": "F.silu"},
                                          "Run": {"seed": 7, "data": "Data(vocab_size=5, blend=[('p', 1.0)])"},
                                          "Data": {"vocab_size": 5, "blend": [("p", 1.0)]}}
