"""Validate rules of the Transformer Engine / fp8 combinations: what the runtime runs on
TE now (variable-length sequences through TE's padding mask), what it cannot (each an issue with
its reason and a fix), and the layer path ``auto`` takes for them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dlmspec.check import find
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec

from te_rules_kit import (  # noqa: F401 (fixtures among them)
    BASE,
    FP8,
    SCOPES,
    TE,
    issues,
    rules,
    spec,
)










def test_base_is_clean() -> None:
    assert issues({}) == [] and issues(TE) == [] and issues({**TE, **FP8}) == []


# ------------------------------------------------------------------------------------------------
# variable-length sequences


def test_variable_length_sequences_validate_on_transformer_engine() -> None:
    """TE's padding mask runs them (backends/megatron/attention.py with_key_padding): no refusal."""
    assert issues({**TE, "objective.variable_length_prob": 0.5}, "error") == []
    assert issues({**TE, **FP8, "objective.variable_length_prob": 0.5}, "error") == []


def test_what_transformer_engine_cannot_mask_stays_refused() -> None:
    # a document mask is per query, not key padding
    assert "runtime-document-mask-te" in rules({**TE, "data.reset_attention_mask": True}, "error")
    # TE's padding mask has no context parallelism (the same on the local path)
    assert "cp-attention-mask" in rules({**TE, "objective.variable_length_prob": 0.5, "parallel.context_parallel_size": 2,
                               "parallel.cp_comm_type": "p2p"}, "error")


def test_auto_keeps_the_measured_local_path_and_takes_te_for_fp8() -> None:
    """``auto`` keeps variable-length sequences on the local layers (compiled output of the bundled
    specs unchanged), but a feature only TE runs (fp8) takes TE with them instead of an error."""
    r = resolve(spec({"objective.variable_length_prob": 0.01}))
    assert r.transformer_impl == "local" and "variable_length_prob" in r.transformer_impl_reason
    changes = {**FP8, "objective.variable_length_prob": 0.01}
    r = resolve(spec(changes))
    assert r.transformer_impl == "transformer_engine", r.transformer_impl_reason
    assert "fp8" in r.transformer_impl_reason
    assert issues(changes, "error") == []
    # a feature TE cannot run at all still takes the local layers (and fp8 is refused there)
    assert "fp8-needs-te" in rules({**FP8, "data.reset_attention_mask": True}, "error")


# ------------------------------------------------------------------------------------------------
# fp8 recipes and shapes


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "blockwise"])
def test_fp8_recipes_on_hopper(recipe: str) -> None:
    assert issues({**TE, **FP8, "precision.fp8_recipe": recipe}, "error") == []


def test_blockwise_needs_hopper() -> None:
    found = [i for i in issues({**TE, **FP8, "precision.fp8_recipe": "blockwise", "cluster.gpu": "l40s"})
             if i.rule == "fp8-blockwise-gpu"]
    assert len(found) == 1 and found[0].key == "precision.fp8_recipe" and found[0].severity == "error"
    assert "9.0" in found[0].message and "8.9" in found[0].message
    assert found[0].fix.set == {"precision.fp8_recipe": "tensorwise"}
    assert issues({**TE, **FP8, "precision.fp8_recipe": "tensorwise", "cluster.gpu": "l40s"}, "error") == []


def test_fp8_gemm_widths() -> None:
    """TE's fp8 GEMMs take matrices whose rows are a multiple of 8 and columns of 16
    (transformer_engine.pytorch.utils.assert_dim_for_fp8_exec)."""
    found = {i.key: i for i in issues({**TE, **FP8, "model.ffn_hidden_size": 1000}) if i.rule == "fp8-gemm-shapes"}
    assert set(found) == {"model.ffn_hidden_size"}
    assert "16" in found["model.ffn_hidden_size"].message
    assert found["model.ffn_hidden_size"].fix.set == {"precision.fp8": "none"}
    # TP splits the MLP: 1024 / 128 = 8 columns per GPU on fc2
    tp = {"parallel.tensor_model_parallel_size": 8, "model.num_attention_heads": 8, "model.num_query_groups": 8,
          "train.global_batch_size": 2}
    assert "fp8-gemm-shapes" not in rules({**TE, **FP8, **tp})
    assert "fp8-gemm-shapes" in rules({**TE, **FP8, **tp, "model.ffn_hidden_size": 64})
    assert "fp8-gemm-shapes" not in rules({**TE, "model.ffn_hidden_size": 1000})  # bf16 takes any width


def test_fp8_tokens_per_micro_batch() -> None:
    found = [i for i in issues({**TE, **FP8, "train.micro_batch_size": 1, "train.seq_length": 500})
             if i.rule == "fp8-gemm-shapes"]
    assert [i.key for i in found] == ["train.seq_length"]
    assert found[0].fix.set == {"train.seq_length": 496}
    assert "fp8-gemm-shapes" not in rules({**TE, **FP8, "train.micro_batch_size": 8, "train.seq_length": 500})


def test_fp8_with_a_micro_batch_cut() -> None:
    """A micro-batch cut to a random length gives GEMMs of any number of rows: refused with fp8, and
    the fix is the per-sequence cut, which keeps the shape (TE's padding mask)."""
    changes = {**TE, **FP8, "objective.variable_length_prob": 0.5, "objective.variable_length": "micro_batch"}
    found = [i for i in issues(changes) if i.rule == "fp8-gemm-shapes"]
    assert [i.key for i in found] == ["objective.variable_length"]
    assert found[0].fix.set == {"objective.variable_length": "sequence"}
    changes.update(found[0].fix.set)
    assert issues(changes, "error") == []
    # micro batch 8: every cut length gives a multiple of 8 rows
    assert "fp8-gemm-shapes" not in rules({**changes, "objective.variable_length": "micro_batch",
                                           "train.micro_batch_size": 8, "train.global_batch_size": 64})


# ------------------------------------------------------------------------------------------------
# recomputation on Transformer Engine layers


def test_layernorm_recompute_is_a_no_op_on_te_dense_layers() -> None:
    sel = {"recompute.granularity": "selective", "recompute.modules": ["layernorm", "mlp"]}
    found = [i for i in issues({**TE, **sel}) if i.rule == "recompute-layernorm-te"]
    assert len(found) == 1 and found[0].severity == "warning" and found[0].key == "recompute.modules"
    assert found[0].fix.set == {"recompute.modules": ["mlp"]}
    assert "recompute-layernorm-te" not in rules({**sel, "model.transformer_impl": "local"})
    only = [i for i in issues({**TE, "recompute.granularity": "selective", "recompute.modules": ["layernorm"]})
            if i.rule == "recompute-layernorm-te"]
    assert only[0].fix.set == {"recompute.granularity": "none"} and only[0].fix.unset == ("recompute.modules",)


def test_the_document_mask_refusal_says_what_train_py_says() -> None:
    """validate and train.py (backends/megatron/checks.py check_masks_supported) give the same reason:
    a document mask is per query, no key-padding mask, and the TE layers take no other."""
    (issue,) = [i for i in issues({**TE, "data.reset_attention_mask": True}) if i.rule == "runtime-document-mask-te"]
    assert "[b, 1, s, s]" in issue.message and "key-padding" in issue.message and "ignore" not in issue.message
    from dlmspec.check import RULES

    assert "ignore" not in RULES["runtime-document-mask-te"].source


def test_core_attn_recompute_frees_almost_nothing_on_te() -> None:
    """'core_attn' (also megatron-core's default of recompute.modules) is warned about on the TE
    dense layers, with a fix that keeps the rest; not on the local layers."""
    sel = {"recompute.granularity": "selective", "recompute.modules": ["core_attn", "mlp"]}
    (found,) = [i for i in issues({**TE, **sel}) if i.rule == "recompute-core-attn-te"]
    assert found.severity == "warning" and found.key == "recompute.modules" and found.fix.set == {"recompute.modules": ["mlp"]}
    (default,) = [i for i in issues({**TE, "recompute.granularity": "selective"}) if i.rule == "recompute-core-attn-te"]
    assert "the default of recompute.modules" in default.message and default.fix.set == {"recompute.modules": ["mlp"]}
    assert "recompute-core-attn-te" not in rules({**sel, "model.transformer_impl": "local"})
    assert "recompute-core-attn-te" not in rules({**TE, "recompute.granularity": "selective", "recompute.modules": ["mlp"]})


def test_fp8_delayed_layernorm_recompute_remedy_on_te_drops_the_no_op() -> None:
    """With delayed fp8 on TE's dense layers, the fix for recomputing 'layernorm' drops it (it
    recomputes nothing there) rather than changing the fp8 recipe; on local layers it changes the recipe."""
    sel = {**FP8, "recompute.granularity": "selective", "recompute.modules": ["layernorm", "mlp"]}
    (te,) = [i for i in issues({**TE, **sel}) if i.rule == "fp8-recompute-modules"]
    assert te.fix.set == {"recompute.modules": ["mlp"]} and "tensorwise" in te.hint
    (moe,) = [i for i in issues({**TE, **sel, "model.num_experts": 8}) if i.rule == "fp8-recompute-modules"]
    assert moe.fix.set == {"precision.fp8_recipe": "tensorwise"}
