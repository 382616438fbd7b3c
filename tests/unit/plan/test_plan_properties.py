"""Properties of the planner over random specs: it never raises on a schema-valid spec (even one
the validator rejects: resolve clamps), its JSON is finite and its breakdowns add up."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlmspec.check import find
from dlmspec.plan import make_plan
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec


@st.composite
def specs(draw):
    heads = draw(st.sampled_from([4, 8, 12, 16]))
    moe = draw(st.booleans())
    model = {
        "num_layers": draw(st.integers(1, 12)),
        "hidden_size": heads * draw(st.sampled_from([16, 32, 64])),
        "ffn_hidden_size": draw(st.sampled_from([128, 256, 384])),
        "num_attention_heads": heads,
        "num_query_groups": draw(st.sampled_from([1, 2, heads])),
        "vocab_size": draw(st.integers(100, 5000)),
        "max_position_embeddings": 4096,
        "activation": draw(st.sampled_from(["swiglu", "gelu", "relu"])),
        "normalization": draw(st.sampled_from(["RMSNorm", "LayerNorm"])),
        "qk_layernorm": draw(st.booleans()),
        "position_embedding_type": draw(st.sampled_from(["rope", "learned_absolute"])),
        "untie_embeddings_and_output_weights": draw(st.booleans()),
        "hidden_dropout": draw(st.sampled_from([0.0, 0.1])),
        "transformer_impl": draw(st.sampled_from(["auto", "local", "transformer_engine"])),
    }
    if moe:
        model.update(num_experts=draw(st.sampled_from([2, 4, 8])), moe_router_topk=draw(st.sampled_from([1, 2])),
                     moe_ffn_hidden_size=128, moe_layer_freq=draw(st.sampled_from([1, 2])))
    recompute = draw(st.sampled_from([
        {"granularity": "none"},
        {"granularity": "selective", "modules": ["core_attn", "mlp", "layernorm"]},
        {"granularity": "full", "method": "uniform", "num_layers": 2},
        {"granularity": "full", "method": "block", "num_layers": 1},
    ]))
    parallel = {
        "tensor_model_parallel_size": draw(st.sampled_from([1, 2, 3, 4])),
        "pipeline_model_parallel_size": draw(st.sampled_from([1, 2, 4])),
        "context_parallel_size": draw(st.sampled_from([1, 2])),
        "sequence_parallel": draw(st.booleans()),
        "use_distributed_optimizer": draw(st.booleans()),
        "fsdp": draw(st.sampled_from(["none", "megatron", "torch"])),
        "grad_reduce_in_fp32": draw(st.booleans()),
    }
    if draw(st.booleans()):
        parallel["virtual_pipeline_model_parallel_size"] = draw(st.sampled_from([2, 3]))
    if moe:
        parallel["expert_model_parallel_size"] = draw(st.sampled_from([1, 2]))
    return {
        "model": model,
        "objective": {"kind": draw(st.sampled_from(["mdm", "ar"])),
                      "variable_length_prob": draw(st.sampled_from([0.0, 0.01]))},
        "parallel": parallel,
        "recompute": recompute,
        "precision": {"dtype": draw(st.sampled_from(["bf16", "fp16", "fp32"])),
                      "fp8": draw(st.sampled_from(["none", "hybrid"]))},
        "train": {"micro_batch_size": draw(st.integers(1, 8)), "global_batch_size": draw(st.integers(1, 64)),
                  "seq_length": draw(st.sampled_from([64, 500, 2048])), "train_iters": draw(st.integers(1, 100)),
                  "optimizer": draw(st.sampled_from(["adam", "sgd"]))},
        "cluster": {"gpu": draw(st.sampled_from(["h100", "a100-40gb", "l40s", "b200"])),
                    "gpus_per_node": draw(st.sampled_from([1, 2, 4, 8])), "nodes": draw(st.integers(1, 3))},
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_plan_of_any_schema_valid_spec(data):
    resolved = resolve(Spec.model_validate(data))
    plan = make_plan(resolved)
    d = plan.to_dict()
    json.dumps(d, allow_nan=False)  # finite numbers only (compile writes plan.json with allow_nan=False)
    for stage in d["memory"]["per_stage"]:
        b = stage["breakdown"]
        assert all(v >= 0 for v in b.values())
        assert abs(sum(b[k] for k in d["memory"]["allocated_terms"]) - stage["peak_allocated_bytes"]) <= len(b)
        assert abs(sum(b.values()) - stage["peak_bytes"]) <= len(b)
    assert d["memory"]["peak_bytes"] == max(s["peak_bytes"] for s in d["memory"]["per_stage"])
    # MFU is quoted against the dense bf16 peak (as the runtime does), so fp8 GEMMs can exceed 1.
    # Its upper bound holds only for a layout the GPUs can hold: with TP x PP x CP above the world
    # size (rule world-model-parallel; validate and plan never plan such a spec) resolve clamps DP
    # to 1 and the planned step covers more GPUs' work than there are GPUs.
    assert d["time"]["step_seconds"] > 0 and d["mfu"] > 0
    if resolved.tp * resolved.pp * resolved.cp <= resolved.world_size:
        assert d["mfu"] < (2 if d["layout"]["fp8"] else 1)
    assert abs(sum(d["time"]["breakdown_seconds"].values()) - d["time"]["step_seconds"]) < 1e-9 * d["time"]["step_seconds"] + 1e-12
    issues = find(("memory",), resolved.spec, resolved)
    assert bool(issues and issues[0].rule == "memory-fits") == (not plan.fits)
