"""``[precision] fp8_dot_product_attention`` ("FP8 attention where TE offers it"): the
rule that keeps it to fp8 with the delayed or tensorwise recipe (megatron-core passes ``fp8_dpa``
to those two TE recipes only), the keyword train.py passes to ``TransformerConfig``, and the plan
(attention at the fp8 peak, flagged as outside what the calibration measured)."""

from __future__ import annotations

from dlmspec.plan import make_plan
from dlmspec.resolve import resolve
from te_rules_kit import FP8, TE, issues, rules, spec

DPA = {"precision.fp8_dot_product_attention": True}
#: fp8 attention was measured to fail on bidirectional attention (H200): the rule lets
#: only causal attention (an AR objective) through
AR = {"objective.kind": "ar"}


def test_fp8_attention_validates_with_the_delayed_and_tensorwise_recipes() -> None:
    assert issues({**TE, **FP8, **DPA, **AR}) == []
    assert issues({**TE, **FP8, **DPA, **AR, "precision.fp8_recipe": "tensorwise"}) == []


def test_fp8_attention_on_bidirectional_attention_is_refused_with_the_measurement() -> None:
    found = [i for i in issues({**TE, **FP8, **DPA}) if i.rule == "fp8-attention"]
    assert len(found) == 1 and "bidirectional attention" in found[0].message
    assert "te-fp8-dpa.log" in found[0].message and "= false" in found[0].hint


def test_fp8_attention_without_fp8_is_refused_with_a_remedy() -> None:
    found = [i for i in issues({**TE, **DPA}) if i.rule == "fp8-attention"]
    assert len(found) == 1 and found[0].severity == "error"
    assert found[0].key == "precision.fp8_dot_product_attention" and "precision.fp8 = 'none'" in found[0].message
    assert "fp8_dot_product_attention = false" in found[0].hint


def test_fp8_attention_with_the_blockwise_recipe_is_refused() -> None:
    found = [i for i in issues({**TE, **FP8, **DPA, **AR, "precision.fp8_recipe": "blockwise"}) if i.rule == "fp8-attention"]
    assert len(found) == 1 and "'blockwise'" in found[0].message and "tensorwise" in found[0].hint
    assert "fp8-attention" not in rules({**TE, **FP8, "precision.fp8_recipe": "blockwise"})


def _attention_and_outside(changes: dict) -> tuple[float, list]:
    plan = make_plan(resolve(spec({**TE, **FP8, **AR, "cluster.gpu": "h200", **changes})))
    return plan.time.breakdown["attention"], plan.provenance


def test_the_plan_runs_attention_at_the_fp8_peak_and_says_it_is_unmeasured() -> None:
    bf16_attn, prov = _attention_and_outside({})
    fp8_attn, prov_dpa = _attention_and_outside(DPA)
    from dlmspec.gpus import GPUS

    h200 = GPUS["h200"]
    # the attention term scales with the peak it runs at: bf16 / fp8 peak
    assert abs(fp8_attn / bf16_attn - h200.bf16_tflops / h200.fp8_tflops) < 1e-9
    assert "fp8_dot_product_attention" not in str(prov)
    assert "precision.fp8_dot_product_attention" in str(prov_dpa)


def test_compiled_train_py_passes_the_keyword() -> None:
    from dlmspec.render.compile import render

    text = render(resolve(spec({**TE, **FP8, **DPA, **AR, "cluster.gpu": "h200"})), "t.toml")["train.py"]
    assert "        fp8_dot_product_attention=True," in text
    assert "fp8_dot_product_attention" not in render(resolve(spec({**TE, **FP8, "cluster.gpu": "h200"})), "t.toml")["train.py"]
