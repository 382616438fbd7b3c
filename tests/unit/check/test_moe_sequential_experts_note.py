"""The validate note for a fine-grained MoE on megatron-core's SequentialMLP (rule
moe-sequential-experts, dlmspec/check/moe.py): it names grouped GEMM as the faster path, with a fix
that validates; it stays quiet for few experts per rank or grouped GEMM."""

from __future__ import annotations

from typing import Any

from dlmspec.check import find
from dlmspec.spec.models import Spec
from spec_kit import spec_dict

#: The issue's fine-grained MoE, cut to 4 layers: 128 experts, top-8, on the local layers.
FINE: dict[str, Any] = {"model.num_experts": 128, "model.moe_router_topk": 8, "model.moe_ffn_hidden_size": 128,
                        "model.transformer_impl": "local"}


def _note(changes: dict[str, Any]):
    spec = Spec.model_validate(spec_dict({**FINE, **changes}))
    return [i for i in find(("spec", "runtime"), spec) if i.rule == "moe-sequential-experts"]


def test_many_sequential_experts_get_a_note_naming_grouped_gemm():
    (issue,) = _note({})
    assert issue.severity == "warning" and issue.key == "model.moe_grouped_gemm"
    assert "SequentialMLP" in issue.message and "128 local experts" in issue.message
    assert "grouped_gemm kernel" in issue.message  # megatron-core's GroupedMLP on the local path
    assert issue.fix.set == {"model.moe_grouped_gemm": True, "model.transformer_impl": "transformer_engine"}
    data = spec_dict({**FINE, **issue.fix.set})
    errors = [i for i in find(("spec", "runtime"), Spec.model_validate(data)) if i.severity == "error"]
    assert errors == [] and not _note(issue.fix.set)


def test_launch_counts_in_the_note_follow_the_planner():
    from dlmspec.plan.launches import KERNELS_PER_LOCAL_EXPERT

    (issue,) = _note({})
    assert f"{4 * 128 * KERNELS_PER_LOCAL_EXPERT['local+sdpa']:,}" in issue.message


def test_few_experts_per_rank_or_grouped_gemm_get_no_note():
    assert not _note({"model.num_experts": 8, "model.moe_router_topk": 2})
    assert not _note({"parallel.expert_model_parallel_size": 4, "model.num_experts": 32})  # 8 per rank
    assert _note({"parallel.expert_model_parallel_size": 8}) != []  # 128 / 8 = 16 per rank: noted
    assert not _note({"model.moe_grouped_gemm": True, "model.transformer_impl": "transformer_engine"})


def test_a_spec_that_needs_the_local_layers_gets_the_note_with_words_only():
    (issue,) = _note({"objective.attention_mask": "block_causal", "objective.block_size": 64,
                      "model.transformer_impl": "auto"})
    assert issue.fix is None and "Transformer Engine layers" in issue.hint
