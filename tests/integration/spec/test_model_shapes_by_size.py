"""Spec.shapes / dlmspec.dsl.model_shape: a size (non-embedding parameters, as dlmspec.params counts
them) becomes a concrete shape within the rule's tolerance, near its depth/width and MLP ratios."""

from __future__ import annotations

import math

import pytest

from dlmspec.dsl import ShapeRule, Spec, model_shape
from dlmspec.errors import SpecError
from dlmspec.params import count_parameters
from dlmspec.spec.load import load

SIZES = [1e5, 3e5, 5e5, 1e6, 1.5e6, 4.5e6, 13.5e6, 1e8, 1e9]


@pytest.mark.parametrize("size", SIZES, ids=[f"{s:g}" for s in SIZES])
def test_each_size_gets_a_shape_whose_counted_parameters_are_within_the_tolerance(size):
    base = Spec.load("demo-dlm")
    rule = ShapeRule()
    members = Spec.shapes(base, [size], rule=rule)
    (spec,) = members.values()
    counts = count_parameters(spec.model)  # counted afresh on the member's own [model]
    assert abs(counts.non_embedding - size) <= rule.tolerance * size
    m = spec.model
    assert m.hidden_size % rule.head_dim == 0 and m.num_attention_heads == m.hidden_size // rule.head_dim
    assert m.num_attention_heads % (m.num_query_groups or m.num_attention_heads) == 0
    ratio = base.model.ffn_hidden_size / base.model.hidden_size
    assert ratio / rule.ffn_slack <= m.ffn_hidden_size / m.hidden_size <= ratio * rule.ffn_slack
    assert m.ffn_hidden_size % rule.ffn_multiple == 0
    # what the base keeps: vocabulary, embeddings, norms, activation
    for key in ("vocab_size", "untie_embeddings_and_output_weights", "normalization", "activation", "qk_layernorm"):
        assert getattr(m, key) == getattr(base.model, key), key
    assert f"{counts.non_embedding:,} non-embedding parameters ({counts.total:,} in all)" in spec.description


def test_the_rule_gives_the_demo_its_own_depth_and_width_at_its_size():
    base = Spec.load("demo-dlm")
    shape = model_shape(base, count_parameters(base.model).non_embedding)
    assert (shape.num_layers, shape.hidden_size, shape.num_attention_heads, shape.num_query_groups) == (12, 768, 12, 4)
    assert abs(shape.ffn_hidden_size - 2048) <= 64


def test_the_nearest_shape_to_both_ratios_wins():
    """Of the shapes within tolerance, none is nearer the aspect and MLP ratios than the one chosen."""
    base = Spec.load("demo-dlm")
    rule = ShapeRule()
    ratio = base.model.ffn_hidden_size / base.model.hidden_size
    chosen = model_shape(base, 1e6, rule)

    def distance(layers, hidden, ffn):
        return abs(math.log(hidden / layers / rule.aspect_ratio)) + abs(math.log(ffn / (ratio * hidden)))

    best = distance(chosen.num_layers, chosen.hidden_size, chosen.ffn_hidden_size)
    for hidden in range(64, 1025, 64):
        heads = hidden // 64
        groups = heads // 3 if heads % 3 == 0 else heads
        for layers in range(1, 40):
            for ffn in range(8, 4 * hidden, 8):
                if not ratio / rule.ffn_slack <= ffn / hidden <= ratio * rule.ffn_slack:
                    continue
                n = count_parameters(base.model.model_copy(update={
                    "num_layers": layers, "hidden_size": hidden, "ffn_hidden_size": ffn,
                    "num_attention_heads": heads, "num_query_groups": groups, "kv_channels": 64})).non_embedding
                if abs(n - 1e6) <= rule.tolerance * 1e6:
                    assert distance(layers, hidden, ffn) >= best - 1e-12, (layers, hidden, ffn)


def test_a_size_no_shape_reaches_is_refused_naming_the_nearest_and_a_tolerance(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text('from dlmspec.dsl import Spec\n'
                    'base = Spec.load("demo-dlm")\n'
                    'spec = Spec.shapes(base, [2000])\n', encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load(path)
    (issue,) = info.value.issues
    assert issue.key == "sizes" and "within 2%" in issue.message
    assert (issue.file, issue.line) == (str(path), 3)
    assert "or more (the rule's smallest shape: 1 layer x 64 wide)" in issue.hint
    # a size between two shapes the tolerance cannot reach: the nearest shape and a tolerance that takes it
    with pytest.raises(SpecError) as info:
        Spec.shapes(Spec.load("demo-dlm"), [1.2e5], rule=ShapeRule(tolerance=0.001))
    (issue,) = info.value.issues
    nearest = int(issue.hint.split()[2].replace(",", ""))
    tolerance = float(issue.hint.split("ShapeRule(tolerance=")[1].rstrip(")"))
    (spec,) = Spec.shapes(Spec.load("demo-dlm"), [1.2e5], rule=ShapeRule(tolerance=tolerance)).values()
    assert count_parameters(spec.model).non_embedding == nearest


def test_a_mixture_of_experts_base_and_bad_sizes_are_refused(spec_dict):
    moe = Spec.model_validate(spec_dict(model={"num_experts": 8, "moe_router_topk": 2}))
    with pytest.raises(SpecError) as info:
        Spec.shapes(moe, [1e6])
    assert info.value.issues[0].key == "model.num_experts"
    dense = Spec.model_validate(spec_dict())
    for bad in ([], [0], [-1e6], ["1e6"], [1e6, 1e6], [float("nan")]):
        with pytest.raises(SpecError) as info:
            Spec.shapes(dense, bad)
        assert info.value.issues[0].key == "sizes", bad


def test_a_rule_no_shape_can_follow_is_refused_naming_its_field():
    for field, value in (("aspect_ratio", 0), ("head_dim", 48.5), ("tolerance", -0.1), ("ffn_slack", 0.5),
                         ("width_multiple", 96), ("ffn_ratio", 0), ("max_width", float("inf"))):
        with pytest.raises(SpecError) as info:
            ShapeRule(**{field: value})
        assert info.value.issues[0].key == f"ShapeRule.{field}", field


@pytest.mark.parametrize("name", ["demo-dlm", "demo-ar", "llada-8b-pretrain"])
def test_a_dense_models_counts_are_affine_in_its_depth(name):
    """model_shape counts each (width, MLP width) at 1 and 2 layers and takes every other depth as
    affine: that holds for the bundled dense specs' norms, biases, embeddings and positions."""
    m = Spec.load(name).model
    for layers in (1, 2, 3, 17, 126):
        for ffn in (m.ffn_hidden_size, m.ffn_hidden_size + 256):
            one, two, deep = (count_parameters(m.model_copy(update={"num_layers": n, "ffn_hidden_size": ffn,
                                                                    "moe_layer_freq": 1}))
                              for n in (1, 2, layers))
            assert deep.non_embedding == one.non_embedding + (layers - 1) * (two.non_embedding - one.non_embedding)
            assert deep.total == one.total + (layers - 1) * (two.total - one.total)
