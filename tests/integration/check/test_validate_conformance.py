"""Conformance: for random specs over the model and parallel knobs, the validator's verdict on
the rules that mirror megatron-core's ``TransformerConfig.__post_init__`` (which runs
``ModelParallelConfig.__post_init__`` first) agrees with constructing that ``TransformerConfig``
exactly as the compiled ``train.py`` does, on CPU.

Knobs: layers, hidden size, heads, query groups, kv_channels, TP, PP, VPP, CP, EP, expert TP,
sequence parallelism, MoE experts and top-k, recomputation (granularity, method, layers,
modules), fp8 (format and recipe) and the dtype (bf16, fp16, fp32), plus the MoE switches those
checks read (grouped GEMM, linear biases).

The comparison is restricted to :data:`MIRRORED` because dlmspec checks more than
``TransformerConfig`` does, for good reasons: the world size divisible by TP*PP*CP and by
ETP*EP*PP (megatron.core.parallel_state), layers by PP and by VPP
(transformer_block.get_num_layers_to_build), experts by EP (moe_layer), batch by micro batch * DP
(num_microbatches_calculator), heads by query groups (attention), hidden size by heads without
kv_channels (Megatron-LM's argument checks), expert parallelism with TP needing sequence
parallelism (megatron-core only warns), CP's sequence and mask limits and fp8's need for
Transformer Engine and fp8 tensor cores. Those rules are tested against their own megatron-core
functions in test_validate_megatron.py, or cite their reason in ``dlmspec show --rules``.

megatron-core checks some fp8 settings against the installed Transformer Engine version; fp8
runs need Transformer Engine, so those checks are answered as a recent version would
(``is_te_min_version`` -> True), which is what the GPU machine has. Skipped without
megatron-core.
"""

from __future__ import annotations

import warnings
from typing import Any
from unittest import mock

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from dlmspec.check import RULES, find
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    transformer_config = pytest.importorskip("megatron.core.transformer.transformer_config")

from dlmspec.render import compile as dlm_compile  # noqa: E402  (after the skip: needs jinja2 only)

#: The validator's rules whose source is TransformerConfig / ModelParallelConfig.__post_init__.
MIRRORED = frozenset({
    "tp-divides-heads",
    "tp-query-groups",
    "sequence-parallel-needs-tp",
    "ep-needs-moe",
    "moe-bias-needs-etp1",
    "moe-top1-routing",
    "moe-act-needs-grouped-gemm",
    "recompute-full-needs-method",
    "recompute-full-needs-num-layers",
    "fp8-recompute-modules",
    # megatron-core's uneven pipeline splits (dlmspec.pipeline_split)
    "pipeline-stage-layers-with-accounting",
    "pipeline-layout-alone",
    "pipeline-layout-grammar",
    "pipeline-layout-stages",
    "pipeline-layout-virtual-size",
    "pipeline-layout-layers",
    "pipeline-stage-layers",
    "pipeline-accounted-layers-divide",
})

#: Cites ModelParallelConfig.__post_init__, where megatron-core only warns (dlmspec: an error).
WARNED_BY_MEGATRON = frozenset({"sequence-parallel-with-ep"})

#: Cite OptimizerConfig.__post_init__: held to it by tests/integration/render/test_optimizer_config_accepted.py.
OPTIMIZER_CONFIG = frozenset({"precision-aware-needs-adam", "precision-aware-needs-distributed-optimizer",
                              "optimizer-dtypes-need-precision-aware", "precision-aware-needs-transformer-engine"})

#: (granularity, method, num_layers, modules) as a spec may write them.
RECOMPUTE: list[tuple[str, str | None, int | None, list[str] | None]] = [
    ("none", None, None, None),
    ("full", None, 1, None),
    ("full", "uniform", None, None),
    ("full", "uniform", 1, None),
    ("full", "block", 2, None),
    ("selective", None, None, None),
    ("selective", None, 1, None),
    ("selective", "uniform", None, ["core_attn", "mlp"]),
    ("selective", None, None, ["moe_act"]),
    ("selective", None, None, ["layernorm", "moe"]),
    ("selective", None, None, ["shared_experts"]),
]


def test_mirrored_rules_cite_post_init() -> None:
    assert MIRRORED <= set(RULES)
    for rule in MIRRORED:
        assert "TransformerConfig.__post_init__" in RULES[rule].source or "ModelParallelConfig.__post_init__" in RULES[rule].source
    others = {r for r, rule in RULES.items() if "__post_init__" in rule.source} - MIRRORED - OPTIMIZER_CONFIG
    assert others == WARNED_BY_MEGATRON, "a rule citing __post_init__ is missing from MIRRORED"


def build(knobs: dict[str, Any]) -> Spec:
    """A schema-valid spec from the knobs (mock data, so only model and parallel rules matter)."""
    granularity, method, rc_layers, modules = knobs["recompute"]
    model: dict[str, Any] = {
        "num_layers": knobs["layers"], "hidden_size": knobs["hidden"], "ffn_hidden_size": 4 * knobs["hidden"],
        "num_attention_heads": knobs["heads"], "vocab_size": 1000, "max_position_embeddings": 1024,
        "add_bias_linear": knobs["bias"], "moe_grouped_gemm": knobs["grouped_gemm"],
    }
    for key, value in (("num_query_groups", knobs["groups"]), ("kv_channels", knobs["kv"])):
        if value is not None:
            model[key] = value
    if knobs["experts"] is not None:
        model.update(num_experts=knobs["experts"], moe_router_topk=knobs["topk"],
                     moe_ffn_hidden_size=2 * knobs["hidden"])
        if knobs["shared"]:
            model["moe_shared_expert_intermediate_size"] = 2 * knobs["hidden"]
    parallel: dict[str, Any] = {
        "tensor_model_parallel_size": knobs["tp"], "pipeline_model_parallel_size": knobs["pp"],
        "context_parallel_size": knobs["cp"], "expert_model_parallel_size": knobs["ep"],
        "sequence_parallel": knobs["sp"],
    }
    if knobs["vpp"] is not None:
        parallel["virtual_pipeline_model_parallel_size"] = knobs["vpp"]
    parallel.update(split_keys(knobs.get("split", "none"), knobs["layers"], knobs["pp"], knobs["vpp"]))
    if knobs["etp"] is not None:
        parallel["expert_tensor_parallel_size"] = knobs["etp"]
    recompute: dict[str, Any] = {"granularity": granularity}
    for key, value in (("method", method), ("num_layers", rc_layers), ("modules", modules)):
        if value is not None:
            recompute[key] = value
    precision: dict[str, Any] = {"dtype": knobs["dtype"], "fp8": knobs["fp8"]}
    if knobs["fp8"] != "none":
        precision["fp8_recipe"] = knobs["recipe"]
    world = knobs["tp"] * knobs["pp"] * knobs["cp"] * 2
    return Spec.model_validate({
        "model": model, "parallel": parallel, "recompute": recompute, "precision": precision,
        "train": {"global_batch_size": 64, "seq_length": 256, "train_iters": 10},
        "data": {"mock": True, "tokenizer": {"type": "NullTokenizer", "vocab_size": 999}},
        "cluster": {"gpus_per_node": world},
    })


def _layout(layers: int, stages: int) -> str:
    """A layout of ``layers`` over ``stages`` stages, the first ones one layer more, 'E' first, 'L' last."""
    counts = [layers // stages + (1 if i < layers % stages else 0) for i in range(stages)]
    parts = ["t" * c for c in counts]
    parts[0], parts[-1] = "E" + parts[0], parts[-1] + "L"
    return "|".join(parts)


def split_keys(split: str, layers: int, pp: int, vpp: int | None) -> dict[str, Any]:
    """``[parallel]`` keys of a pipeline split knob (megatron-core's uneven options)."""
    layout = _layout(layers, pp * (vpp or 1))
    return {
        "none": {},
        "accounting": {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True},
        "embedding": {"account_for_embedding_in_pipeline_split": True},
        "first": {"num_layers_in_first_pipeline_stage": 1},
        "last": {"num_layers_in_last_pipeline_stage": 2},
        "first+accounting": {"num_layers_in_first_pipeline_stage": 1, "account_for_embedding_in_pipeline_split": True},
        "layout": {"pipeline_model_parallel_layout": layout},
        "layout-short": {"pipeline_model_parallel_layout": layout.replace("t", "", 1)},
        "layout+loss": {"pipeline_model_parallel_layout": layout, "account_for_loss_in_pipeline_split": True},
        "layout-bad-char": {"pipeline_model_parallel_layout": layout.replace("t", "x", 1)},
        "layout-one-stage": {"pipeline_model_parallel_layout": _layout(layers, 1)},
        "layout-without-vpp": {"pipeline_model_parallel_layout": _layout(layers, pp)},
    }[split]


_ENV = dlm_compile._environment()  # the one compile.render uses


def megatron_raises(spec: Spec) -> bool:
    """Whether ``TransformerConfig(...)`` with the keywords of the compiled train.py raises
    (ValueError or AssertionError: megatron-core's own checks)."""
    resolved = resolve(spec)
    source = _ENV.get_template("train.py.j2").render(dlm_compile.template_context(resolved, "conformance.toml"))
    namespace: dict[str, Any] = {"__name__": "conformance_train"}
    exec(compile(source, "train.py", "exec"), namespace)  # defines build_configs(); runs nothing
    outcome: dict[str, BaseException | None] = {}

    def transformer_config_of_train_py(**kwargs: Any) -> Any:
        try:
            config = transformer_config.TransformerConfig(**kwargs)
        except (ValueError, AssertionError) as exc:
            outcome["error"] = exc
            raise
        outcome["error"] = None
        return config

    namespace["TransformerConfig"] = transformer_config_of_train_py
    with warnings.catch_warnings(), mock.patch.object(transformer_config, "is_te_min_version", return_value=True):
        warnings.simplefilter("ignore")
        try:
            namespace["build_configs"]()
        except (ValueError, AssertionError):
            pass  # raised by TransformerConfig (recorded) or by a later config (not compared)
    assert "error" in outcome, "train.py's build_configs() did not construct a TransformerConfig"
    return outcome["error"] is not None


def ours(spec: Spec) -> set[str]:
    return {i.rule for i in find(("spec",), spec) if i.severity == "error"} & MIRRORED


def _usually(draw: Any, fine: st.SearchStrategy, anything: st.SearchStrategy) -> Any:
    """A value from ``fine`` three times in four, else from ``anything``: random specs break a
    rule often, so most draws keep each knob legal and about half the specs stay clean."""
    return draw(fine if draw(st.integers(0, 3)) else anything)


@st.composite
def knobs(draw: Any) -> dict[str, Any]:
    tp = draw(st.sampled_from([1, 2, 4, 8, 3]))
    heads = _usually(draw, st.sampled_from([1, 2, 4]).map(lambda k: k * tp), st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]))
    groups_ok = [g for g in (1, 2, 3, 4, 6, 8, 16) if heads % g == 0 and (g % tp == 0 or tp % g == 0)]
    experts = draw(st.sampled_from([None, None, 2, 4, 8]))
    moe = experts is not None
    granularity = draw(st.sampled_from(RECOMPUTE))
    return {
        "layers": draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12])),
        "hidden": draw(st.sampled_from([64, 96, 192, 256])),
        "heads": heads,
        "groups": _usually(draw, st.sampled_from([None, *groups_ok]), st.sampled_from([None, 1, 2, 3, 4, 6, 8])),
        "kv": draw(st.sampled_from([None, 16, 32])),
        "tp": tp,
        "pp": draw(st.sampled_from([1, 2, 4])),
        "vpp": draw(st.sampled_from([None, 2, 3])),
        "cp": draw(st.sampled_from([1, 2])),
        "ep": _usually(draw, st.sampled_from([1, 2, 4] if moe else [1]), st.sampled_from([1, 2, 4])),
        "etp": draw(st.sampled_from([None, 1, 2])),
        "sp": _usually(draw, st.just(tp > 1), st.booleans()),
        "experts": experts,
        "topk": _usually(draw, st.sampled_from([2, 3]), st.sampled_from([1, 2, 3])),
        "shared": draw(st.booleans()),
        "bias": _usually(draw, st.just(False), st.booleans()),
        "grouped_gemm": draw(st.booleans()),
        "recompute": granularity,
        "dtype": draw(st.sampled_from(["bf16", "bf16", "fp16", "fp32"])),
        "fp8": draw(st.sampled_from(["none", "none", "hybrid", "e4m3"])),
        "recipe": draw(st.sampled_from(["delayed", "tensorwise"])),
        "split": draw(st.sampled_from(["none", "none", "none", "accounting", "embedding", "first", "last",
                                       "first+accounting", "layout", "layout-short", "layout+loss"])),
    }


#: A clean spec; the examples below change one knob each, so every mirrored rule is exercised
#: whatever hypothesis draws.
CLEAN: dict[str, Any] = {
    "layers": 4, "hidden": 256, "heads": 8, "groups": 4, "kv": None, "tp": 2, "pp": 1, "vpp": None, "cp": 1,
    "ep": 1, "etp": None, "sp": True, "experts": None, "topk": 2, "shared": False, "bias": False,
    "grouped_gemm": False, "recompute": RECOMPUTE[0], "dtype": "bf16", "fp8": "none", "recipe": "delayed",
    "split": "none",
}
MOE = {"experts": 4, "ep": 2}
ONE_RULE_EACH: dict[str, dict[str, Any]] = {
    "tp-divides-heads": {"heads": 12, "tp": 8},
    "tp-query-groups": {"heads": 12, "groups": 6, "tp": 4},
    "sequence-parallel-needs-tp": {"tp": 1},
    "ep-needs-moe": {"ep": 2},
    "moe-bias-needs-etp1": {**MOE, "bias": True},
    "moe-top1-routing": {**MOE, "topk": 1},
    "moe-act-needs-grouped-gemm": {**MOE, "recompute": RECOMPUTE[8]},
    "recompute-full-needs-method": {"recompute": RECOMPUTE[1]},
    "recompute-full-needs-num-layers": {"recompute": RECOMPUTE[2]},
    "fp8-recompute-modules": {"fp8": "hybrid", "recompute": RECOMPUTE[9]},
    "pipeline-stage-layers-with-accounting": {"pp": 2, "split": "first+accounting"},
    "pipeline-layout-alone": {"pp": 2, "split": "layout+loss"},
    "pipeline-layout-grammar": {"pp": 2, "split": "layout-bad-char"},
    "pipeline-layout-stages": {"pp": 2, "split": "layout-one-stage"},
    "pipeline-layout-virtual-size": {"pp": 2, "vpp": 2, "split": "layout-without-vpp"},
    "pipeline-layout-layers": {"pp": 2, "split": "layout-short"},
    "pipeline-stage-layers": {"pp": 4, "split": "last"},
    "pipeline-accounted-layers-divide": {"pp": 2, "split": "embedding"},
}


def test_clean_spec_is_clean_for_both() -> None:
    spec = build(CLEAN)
    assert ours(spec) == set() and not megatron_raises(spec)


@pytest.mark.parametrize("rule", sorted(ONE_RULE_EACH))
def test_each_mirrored_rule_is_a_megatron_error(rule: str) -> None:
    assert set(ONE_RULE_EACH) == MIRRORED
    spec = build({**CLEAN, **ONE_RULE_EACH[rule]})
    assert ours(spec) == {rule}
    assert megatron_raises(spec)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(knobs=knobs())
@example(knobs={**CLEAN, "fp8": "e4m3", "recipe": "tensorwise", "recompute": RECOMPUTE[9]})  # TE >= 2.6: legal
@example(knobs={**CLEAN, **MOE, "fp8": "hybrid", "grouped_gemm": True, "recompute": RECOMPUTE[8]})
@example(knobs={**CLEAN, **MOE, "topk": 1, "bias": True, "etp": 1})
@example(knobs={**CLEAN, "heads": 12, "groups": 3, "tp": 3, "dtype": "fp16"})
@example(knobs={**CLEAN, "recompute": RECOMPUTE[6]})  # selective + num_layers: train.py drops the layers
def test_validator_agrees_with_transformer_config(knobs: dict[str, Any]) -> None:
    spec = build(knobs)
    fired = ours(spec)
    raises = megatron_raises(spec)
    event(f"megatron raises: {raises}")  # --hypothesis-show-statistics: both verdicts are common
    for rule in fired:
        event(f"fired: {rule}")
    assert raises == bool(fired), (fired, knobs)
