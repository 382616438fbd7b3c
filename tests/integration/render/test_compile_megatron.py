"""The generated ``train.py`` against the installed megatron-core and runtime, on CPU.

For every spec in ``specs/`` and a set of variations (TP/SP, PP, VPP, CP, EP + MoE, recompute,
fp8, fp16/fp32, AR, SGD/WSD, mock data, learned positions): every keyword ``train.py`` passes to
a megatron-core class or function it imports (and to the runtime's ``dlmspec.backends.megatron``
classes) exists there, and executing ``build_configs()``, ``build_run()`` and ``build_layer()``
runs megatron-core's ``__post_init__`` checks and gives objects that hold the resolved values.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import itertools
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest

from dlmspec.render.compile import check_spec, render
from dlmspec.spec.load import load
from dlmspec.resolve import Resolved, resolve

from compile_megatron_kit import (  # noqa: F401 (fixtures among them)
    _counter,
    _import,
)
from spec_kit import spec_file

ROOT = Path(__file__).resolve().parents[3]

#: 8 layers, 8 GPUs, vocab 1000 (padded 1024): what it changes in spec_kit.DEFAULT; variations below
#: change it further (``spec_file(tmp_path, BASE, VARIATIONS[name], file_name=f"{name}.toml")``).
BASE: dict[str, Any] = {
    "name": "v",
    "model.num_layers": 8,
    "train.micro_batch_size": 1,
    "train.global_batch_size": 32,
    "data": {"tokenizer": {"type": "NullTokenizer", "vocab_size": 999}, "train": ["data/x_text_document"]},
}

VARIATIONS: dict[str, dict[str, Any]] = {
    "dp8": {},
    "tp2-sp": {"parallel.tensor_model_parallel_size": 2, "parallel.sequence_parallel": True},
    "pp2": {"parallel.pipeline_model_parallel_size": 2},
    "pp2-vpp2": {"parallel.pipeline_model_parallel_size": 2, "parallel.virtual_pipeline_model_parallel_size": 2},
    "cp2": {"parallel.context_parallel_size": 2, "parallel.cp_comm_type": "p2p"},
    "tp2-pp2-cp2": {"parallel.tensor_model_parallel_size": 2, "parallel.pipeline_model_parallel_size": 2,
                    "parallel.context_parallel_size": 2, "parallel.sequence_parallel": True},
    "moe-ep4": {"model.num_experts": 8, "model.moe_router_topk": 2, "model.moe_ffn_hidden_size": 512,
                "parallel.expert_model_parallel_size": 4},
    "moe-freq-shared-grouped": {"model.num_experts": 4, "model.moe_layer_freq": [1, 0, 1, 0, 1, 0, 1, 0],
                                "model.moe_shared_expert_intermediate_size": 512, "model.moe_grouped_gemm": True,
                                "model.transformer_impl": "transformer_engine",
                                "model.moe_token_dispatcher_type": "allgather",
                                "model.moe_router_load_balancing_type": "seq_aux_loss",
                                "parallel.expert_model_parallel_size": 2},
    "recompute-full-uniform": {"recompute.granularity": "full", "recompute.method": "uniform",
                               "recompute.num_layers": 2},
    "recompute-full-block-pp2": {"recompute.granularity": "full", "recompute.method": "block",
                                 "recompute.num_layers": 1, "parallel.pipeline_model_parallel_size": 2},
    "recompute-selective": {"recompute.granularity": "selective", "recompute.modules": ["core_attn", "mlp"]},
    "fp8-te": {"precision.fp8": "hybrid", "precision.fp8_recipe": "delayed",
               "model.transformer_impl": "transformer_engine"},
    "fp16": {"precision.dtype": "fp16"},
    "fp32-sgd-wsd": {"precision.dtype": "fp32", "train.optimizer": "sgd", "train.lr_decay_style": "WSD",
                     "train.lr_wsd_decay_iters": 20, "train.lr_wsd_decay_style": "linear"},
    "ar-causal": {"objective.kind": "ar", "data.eod_mask_loss": True},
    "mdm-realised-local": {"objective.loss_weighting": "realised", "objective.variable_length_prob": 0.01,
                           "model.transformer_impl": "local", "data.reset_attention_mask": True},
    "block-causal-local": {"objective.attention_mask": "block_causal", "objective.block_size": 64,
                           "model.transformer_impl": "local"},
    "mock-learned-layernorm-gelu": {"data.mock": True, "data.train": [], "model.position_embedding_type":
                                    "learned_absolute", "model.normalization": "LayerNorm",
                                    "model.activation": "gelu", "model.add_bias_linear": True,
                                    "model.untie_embeddings_and_output_weights": False},
    "squared-relu-train-tokens": {"model.activation": "squared_relu", "train.train_iters": None,
                                  "train.train_tokens": 10_000_000, "train.lr_warmup_iters": 0,
                                  "train.lr_warmup_fraction": 0.05},
    "two-nodes": {"cluster.nodes": 2, "train.global_batch_size": 64},
    "init-from-hf-no-save": {"checkpoint.init_from": "hf:models/tiny"},
    "profile": {"logging.profile": True, "logging.profile_step_start": 2, "logging.profile_step_end": 4,
                "logging.profile_ranks": [0]},
    "init-from-mcore": {"checkpoint.init_from": "mcore:runs/base/checkpoints", "checkpoint.save": "runs/v/ckpt"},
    "fsdp-megatron": {"parallel.fsdp": "megatron", "parallel.data_parallel_sharding_strategy": "optim_grads_params",
                      "kernels.cross_entropy": "megatron"},
    "fsdp-megatron-tp2-sp-optim": {"parallel.fsdp": "megatron", "parallel.data_parallel_sharding_strategy": "optim",
                                   "parallel.tensor_model_parallel_size": 2, "parallel.sequence_parallel": True},
}


# Bundled specs whose header says "`dlmspec compile` refuses it" are left out (tests/unit/specs/test_specs.py).
CASES = [pytest.param(p, id=p.stem) for p in sorted((ROOT / "specs").glob("*.toml"))
         if "`dlmspec compile` refuses it" not in p.read_text()] + [
    pytest.param(name, id=f"var-{name}") for name in VARIATIONS
]



def _compile(case: Path | str, tmp_path: Path) -> tuple[Resolved, Path]:
    """Load, check and render a case; returns the resolved spec and the written train.py."""
    path = case if isinstance(case, Path) else spec_file(tmp_path, BASE, VARIATIONS[case], file_name=f"{case}.toml")
    loaded = load(path)
    resolved = resolve(loaded.spec)
    check_spec(loaded, resolved)  # each case is a valid spec: a failure here means a bad case
    train = tmp_path / "train.py"
    train.write_text(render(resolved, path.name)["train.py"], encoding="utf-8")
    return resolved, train




# ------------------------------------------------------------------------------------------
# Keyword checking by introspection


def imported_callables(tree: ast.Module, prefixes: tuple[str, ...]) -> dict[str, Any]:
    """Names bound by ``from X import Y [as Z]`` with X under ``prefixes``, resolved to objects."""
    found: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefixes):
            module = importlib.import_module(node.module)
            for alias in node.names:
                found[alias.asname or alias.name] = getattr(module, alias.name)
    return found


def accepted_keywords(obj: Callable[..., Any]) -> set[str]:
    """``dataclasses.fields`` of a dataclass, else the named parameters of its signature.

    Raises:
        AssertionError: the callable takes ``**kwargs`` (no keyword could be checked).
    """
    if dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj) if f.init}
    params = inspect.signature(obj).parameters.values()
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params), f"{obj} takes **kwargs"
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def unknown_keywords(source: str, prefixes: tuple[str, ...]) -> list[str]:
    """``"Class.keyword"`` for every keyword of a call to an imported callable under
    ``prefixes`` that the callable does not accept; also counts the calls checked."""
    tree = ast.parse(source)
    callables = imported_callables(tree, prefixes)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in callables:
            allowed = accepted_keywords(callables[node.func.id])
            bad += [f"{node.func.id}.{kw.arg}" for kw in node.keywords if kw.arg is not None and kw.arg not in allowed]
    return bad


def called_names(source: str, prefixes: tuple[str, ...]) -> set[str]:
    tree = ast.parse(source)
    callables = imported_callables(tree, prefixes)
    return {n.func.id for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in callables}


def test_the_checker_finds_a_wrong_keyword() -> None:
    source = (
        "from megatron.core.transformer.transformer_config import TransformerConfig\n"
        "from megatron.core.optimizer import OptimizerConfig\n"
        "TransformerConfig(num_layers=1, num_layerz=2)\n"
        "OptimizerConfig(lr=1.0, learning_rate=2.0)\n"
    )
    assert sorted(unknown_keywords(source, ("megatron",))) == ["OptimizerConfig.learning_rate", "TransformerConfig.num_layerz"]


@pytest.mark.parametrize("case", CASES)
def test_megatron_and_runtime_keywords_exist(case: Path | str, tmp_path: Path) -> None:
    _, train = _compile(case, tmp_path)
    source = train.read_text()
    assert {"TransformerConfig", "DistributedDataParallelConfig", "OptimizerConfig"} <= called_names(source, ("megatron",))
    assert unknown_keywords(source, ("megatron",)) == []
    assert {"RunConfig", "DataConfig", "ScheduleConfig", "build_layer_spec", "train"} <= called_names(source, ("dlmspec.backends",))
    assert unknown_keywords(source, ("dlmspec.backends",)) == []
    # TransformerConfig takes the parallel sizes as **PARALLEL_SIZES (stated once): its keys are
    # checked here, since unknown_keywords sees no keyword in a ** unpack.
    from megatron.core.transformer.transformer_config import TransformerConfig

    sizes = next(n.value for n in ast.parse(source).body if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", None) == "PARALLEL_SIZES")
    assert sizes.keywords and {kw.arg for kw in sizes.keywords} <= accepted_keywords(TransformerConfig)
    assert "**PARALLEL_SIZES" in source.split("TransformerConfig(", 1)[1].split("\n    )", 1)[0]


# ------------------------------------------------------------------------------------------
# Executing the config-building part on CPU


@pytest.mark.parametrize("case", CASES)
def test_build_configs_runs_megatron_checks_and_holds_the_resolved_values(case: Path | str, tmp_path: Path) -> None:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.parallel_state import initialize_model_parallel

    from dlmspec.backends.megatron.init_from import default_cache_dir
    from dlmspec.backends.megatron.layers import build_model, layer_spec_attention
    from dlmspec.backends.megatron.training import train as runtime_train

    r, train = _compile(case, tmp_path)
    module = _import(train)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tc, model_kwargs, ddp, opt = module.build_configs()
        run = module.build_run()
    spec = r.spec

    # parallel sizes: parallel_state, TransformerConfig and train() agree
    sizes = module.PARALLEL_SIZES
    assert set(sizes) <= set(inspect.signature(initialize_model_parallel).parameters)
    assert set(sizes) <= set(inspect.signature(runtime_train).parameters)
    assert (sizes["tensor_model_parallel_size"], sizes["pipeline_model_parallel_size"],
            sizes["virtual_pipeline_model_parallel_size"], sizes["context_parallel_size"],
            sizes["expert_model_parallel_size"], sizes["expert_tensor_parallel_size"]) == (
        r.tp, r.pp, r.vpp, r.cp, r.ep, r.etp)
    for key, value in sizes.items():
        assert getattr(tc, key) == value, key
    assert module.WORLD_SIZE == r.world_size

    # model
    assert (tc.num_layers, tc.hidden_size, tc.ffn_hidden_size, tc.num_attention_heads) == (
        spec.model.num_layers, spec.model.hidden_size, spec.model.ffn_hidden_size, spec.model.num_attention_heads)
    assert (tc.num_query_groups, tc.kv_channels) == (r.num_query_groups, r.kv_channels)
    assert tc.num_moe_experts == spec.model.num_experts
    if spec.model.num_experts:
        assert tc.moe_ffn_hidden_size == r.moe_ffn_hidden_size
    assert tc.sequence_parallel == spec.parallel.sequence_parallel
    assert tc.recompute_granularity == (None if spec.recompute.granularity == "none" else spec.recompute.granularity)
    assert tc.fp8 == (None if spec.precision.fp8 == "none" else spec.precision.fp8)
    assert (tc.bf16, tc.fp16) == (spec.precision.dtype == "bf16", spec.precision.dtype == "fp16")
    assert (opt.bf16, opt.fp16, opt.params_dtype) == (tc.bf16, tc.fp16, tc.params_dtype)

    # GPTModel / build_model keyword arguments
    model_params = set(inspect.signature(GPTModel.__init__).parameters)
    assert set(model_kwargs) <= model_params
    assert set(model_kwargs) <= set(inspect.signature(build_model).parameters)
    assert model_kwargs["vocab_size"] == r.padded_vocab_size
    assert model_kwargs["share_embeddings_and_output_weights"] == (not spec.model.untie_embeddings_and_output_weights)

    # optimizer and DDP
    assert (opt.optimizer, opt.lr, opt.min_lr, opt.clip_grad) == (
        spec.train.optimizer, spec.train.lr, spec.train.min_lr, spec.train.clip_grad)
    assert ddp.use_distributed_optimizer == opt.use_distributed_optimizer == spec.parallel.use_distributed_optimizer
    reduced_over = r.world_size // (r.tp * r.pp)
    assert ddp.overlap_grad_reduce == (spec.parallel.overlap_grad_reduce and reduced_over > 1)
    assert ddp.use_megatron_fsdp == (spec.parallel.fsdp == "megatron")
    if spec.parallel.fsdp == "megatron":
        assert ddp.data_parallel_sharding_strategy == spec.parallel.data_parallel_sharding_strategy
        assert run.checkpoint.optimizer_sharding == "fsdp_dtensor"

    # the runtime's RunConfig
    assert run.objective.kind == spec.objective.kind
    assert run.objective.mask_token_id == r.mask_token_id
    assert run.schedule.train_iters == r.train_iters
    assert run.schedule.global_batch_size == spec.train.global_batch_size
    assert run.data.seq_length == spec.train.seq_length
    assert run.data.mock == spec.data.mock
    assert run.checkpoint.save_dir == spec.checkpoint.save
    assert run.checkpoint.init_from == spec.checkpoint.init_from
    if (spec.checkpoint.init_from or "").startswith("hf:"):  # where the runtime's default puts it
        assert run.checkpoint.init_cache_dir == default_cache_dir(spec.checkpoint.save, run.logging.run_dir)
    else:
        assert run.checkpoint.init_cache_dir is None

    # the layer spec, where it can be built here (Transformer Engine is not installed on CPU CI)
    if r.transformer_impl != "transformer_engine":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            layer = module.build_layer()
        assert layer_spec_attention(layer) == r.attention_mask


def test_auto_builds_the_local_layers_where_transformer_engine_imports(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """demo-dlm cuts 1% of its sequences (objective.variable_length_prob), which auto keeps on the
    local layers where they were measured: on a machine where Transformer Engine imports, its train.py
    still builds the local layers, the runtime's mask check passes, and the RunConfig (the start
    record's run_config) says why."""
    import dlmspec.backends.megatron.layers as layers
    from dlmspec.backends.megatron.checks import check_masks_supported

    _, train = _compile(ROOT / "specs" / "demo-dlm.toml", tmp_path)
    module = _import(train)
    monkeypatch.setattr(layers, "transformer_engine_available", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = module.build_layer()
        run = module.build_run()
    backend = layers.layer_spec_backend(layer)
    assert backend == "local+sdpa"
    check_masks_supported(backend, run.objective, run.data)
    assert "objective.variable_length_prob" in run.layer_path


def test_megatron_rejects_what_build_configs_would_pass_wrongly(tmp_path: Path) -> None:
    """Executing build_configs() is a real check: a TransformerConfig megatron-core refuses
    (sequence parallelism without TP) fails here."""
    _, train = _compile("dp8", tmp_path)
    text = train.read_text().replace("sequence_parallel=False,", "sequence_parallel=True,", 1)
    train.write_text(text)
    module = _import(train)
    with pytest.raises(ValueError, match="sequence parallel"):
        module.build_configs()
