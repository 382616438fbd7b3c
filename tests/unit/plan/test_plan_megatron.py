"""The planner against Megatron-LM's theoretical memory formula
(``megatron/training/theoretical_memory_usage.py``, re-implemented in
:mod:`dlmspec.plan.megatron_formula`)."""

from __future__ import annotations

import pytest

from dlmspec.plan import make_plan
from dlmspec.plan.megatron_formula import megatron_activation_bytes, megatron_estimate
from dlmspec.plan.shape import layout, model_shape
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec
from spec_kit import spec_dict

LLAMA = spec_dict({
    "name": None,
    "data": None,
    "model": {"preset": "llama-3-8b"},
    "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 4096},
    "cluster.nodes": None,
})


def _resolved(**overrides):
    return resolve(Spec.model_validate(LLAMA).replace(**overrides))


@pytest.mark.parametrize("distopt", [True, False])
def test_weights_and_optimizer_agree_without_tp_and_pp(distopt):
    # Llama-3-8B has no biases and no q/k norm: both count the same parameters, and with
    # fp32 gradients both charge 2 + 4 + 12 (or 12/dp) bytes per parameter.
    r = _resolved(**{"parallel.use_distributed_optimizer": distopt})
    plan = make_plan(r)
    b = plan.memory.peak.breakdown
    ours = b["weights"] + b["gradients"] + b["optimizer_states"]
    theirs = megatron_estimate(model_shape(r), layout(r)).weight_and_optimizer_bytes
    assert ours == pytest.approx(theirs, rel=1e-12)
    per_param = 6 + 12 / 8 if distopt else 18
    assert theirs == pytest.approx(per_param * r.params_padded.total)


def test_megatron_activation_formula_by_hand():
    # compute_activation_memory (SP + selective), Korthikanti Table 2: s*b*h*(18 + 4f/h) per
    # layer, + 8sbp (ids) + sbhp (embedding dropout), + 4sbh(1 + V/h) logits when pp = 1, / t.
    r = _resolved(**{"parallel.tensor_model_parallel_size": 2, "parallel.sequence_parallel": True,
                     "recompute.granularity": "selective"})
    s, b, h, f, L, V, t = 4096, 1, 4096, 14336, 32, r.padded_vocab_size, 2
    expected = (s * b * h * (18 + 4 * f / h) * L + 8 * s * b + s * b * h + 4 * s * b * h * (1 + V / h)) / t
    got, formula = megatron_activation_bytes(model_shape(r), layout(r))
    assert formula == "sp_selective"
    assert got == pytest.approx(expected)


def test_megatron_activation_without_sp_by_hand():
    r = _resolved()
    s, b, h, L, V = 4096, 1, 4096, 32, r.padded_vocab_size
    expected = (s * b * h * (10 + 24) * L + 8 * s * b + s * b * h + (s * b * V + s * b * h) * 2) * 1.05
    got, formula = megatron_activation_bytes(model_shape(r), layout(r))
    assert formula == "without_sp"
    assert got == pytest.approx(expected)


def test_planner_and_megatron_activations_same_order():
    # Different models of the same tensors (flash attention, GQA, SwiGLU, fp32 logits in the
    # planner): within a factor of two of each other on a standard configuration.
    r = _resolved(**{"parallel.tensor_model_parallel_size": 2, "parallel.sequence_parallel": True,
                     "recompute.granularity": "selective"})
    plan = make_plan(r)
    b = plan.memory.peak.breakdown
    ours = b["activations"] + b["embedding_output_activations"] + b["loss_logits"]
    theirs, _ = megatron_activation_bytes(model_shape(r), layout(r))
    assert 0.5 < ours / theirs < 2.0
