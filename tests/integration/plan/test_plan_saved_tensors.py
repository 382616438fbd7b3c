"""The planner's per-layer activation terms against what autograd actually saves.

Builds megatron-core GPT models with this project's local layer spec
(``backends/megatron/layers.py``: megatron-core local modules + SDPA core attention) on CPU in a
one-process gloo world, runs a forward pass with the loss, and records every tensor autograd
saves for backward (``torch.autograd.graph.saved_tensors_hooks``), counting each storage once and
leaving out parameters. The bytes one transformer layer adds (a 2-layer model minus a 1-layer
model) must equal :func:`dlmspec.plan.memory.layer_activation_terms`; what the 1-layer model
saves besides its layer must equal the planner's output-side terms plus the loss's fp32 softmax.

Two differences between this CPU run and a GPU run are removed: megatron's RoPE asks for
``torch.cuda.current_device()`` (patched to CPU, as ``tests/integration/runtime/test_runtime_model.py`` does), and
PyTorch's CPU build computes RMSNorm with a composite implementation that saves fp32 copies,
while on CUDA ``rms_norm`` runs the fused ``_fused_rms_norm`` kernel, which saves the input and
the fp32 ``rstd`` - emulated here with an autograd function that saves exactly those.
"""

from __future__ import annotations


import pytest

from bench_scripts import load_script
from cpu_world_kit import megatron_cpu_world

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

import torch.nn.functional as F  # noqa: E402

from dlmspec.plan.memory import layer_activation_terms  # noqa: E402
from dlmspec.plan.shape import layout, model_shape  # noqa: E402
from dlmspec.resolve import resolve  # noqa: E402
from dlmspec.spec.models import Spec  # noqa: E402

H, FFN, HEADS, KV, VOCAB, SEQ = 64, 256, 4, 16, 1024, 256


def _load_count_kernels():
    """bench/plan/count_kernels.py, whose CUDA ``_fused_rms_norm`` emulation (it saves the input,
    the fp32 rstd and the weight) this test shares rather than repeats."""
    return load_script("bench/plan/count_kernels.py", "plan_count_kernels")


_rms_norm = _load_count_kernels()._rms_norm


@pytest.fixture(scope="module", autouse=True)
def cpu_megatron(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        mp.setattr(F, "rms_norm", _rms_norm)
        torch.manual_seed(0)
        yield


def _saved_bytes(layers: int, groups: int, qk_norm: bool, attention: str, batch: int, dropout: float) -> int:
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.layers import build_layer_spec, build_model

    config = TransformerConfig(
        num_layers=layers, hidden_size=H, ffn_hidden_size=FFN, num_attention_heads=HEADS, num_query_groups=groups,
        kv_channels=KV, normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, qk_layernorm=qk_norm, hidden_dropout=dropout, attention_dropout=0.0,
        use_cpu_initialization=True, bf16=True, params_dtype=torch.bfloat16,
        # what dlmspec.render.compile writes into train.py for SwiGLU
        bias_activation_fusion=True, bias_dropout_fusion=True, masked_softmax_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, calculate_per_token_loss=True,
    )
    spec = build_layer_spec(attention=attention, qk_layernorm=qk_norm, use_transformer_engine=False)
    model = build_model(config, layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                        position_embedding_type="rope", rotary_base=10000, ddp_config=None)[0]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    tokens = torch.randint(0, VOCAB, (batch, SEQ))
    positions = torch.arange(SEQ).expand(batch, SEQ)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens, positions, None, labels=tokens)
    return sum(seen.values())


def _planned(groups: int, qk_norm: bool, attention: str, batch: int, dropout: float):
    spec = Spec.model_validate({
        "model": {"num_layers": 1, "hidden_size": H, "ffn_hidden_size": FFN, "num_attention_heads": HEADS,
                  "num_query_groups": groups, "kv_channels": KV, "vocab_size": VOCAB, "max_position_embeddings": SEQ,
                  "qk_layernorm": qk_norm, "hidden_dropout": dropout, "transformer_impl": "local"},
        "objective": {"kind": "ar" if attention == "causal" else "mdm", "attention_mask": attention,
                      "variable_length_prob": 0.0, "mask_token_id": 0},
        "train": {"micro_batch_size": batch, "global_batch_size": batch, "seq_length": SEQ},
        "cluster": {"gpu": "h100", "gpus_per_node": 1},
    })
    r = resolve(spec)
    return model_shape(r), layout(r)


@pytest.mark.parametrize(
    "groups,qk_norm,attention,batch,dropout",
    [
        (2, False, "causal", 2, 0.0),
        (2, True, "bidirectional", 3, 0.0),
        (4, True, "bidirectional", 1, 0.0),  # MHA: the query reshape is a view
        (1, True, "causal", 2, 0.0),  # MQA
        (2, False, "bidirectional", 2, 0.1),  # two bool dropout masks per layer
    ],
)
def test_layer_terms_equal_saved_tensors(groups, qk_norm, attention, batch, dropout):
    one = _saved_bytes(1, groups, qk_norm, attention, batch, dropout)
    two = _saved_bytes(2, groups, qk_norm, attention, batch, dropout)
    shape, lay = _planned(groups, qk_norm, attention, batch, dropout)
    terms = layer_activation_terms(shape, lay, moe=False)
    assert two - one == sum(terms.values())
    if dropout:
        # The embedding's nn.Dropout takes ATen's unfused CPU path (a bf16 noise tensor instead
        # of CUDA's bool mask), so the outside terms are only compared without dropout.
        return

    # Outside the layers: the final norm's input and rstd, the output layer's input (the
    # planner's embedding_output_activations), the fp32 softmax of the cross entropy (4*T*V,
    # part of loss_logits), and int64 ids and targets + the bool target mask of the loss.
    T = batch * SEQ
    outside = (2 * T * H + 4 * T) + 2 * T * H
    loss = 4 * T * VOCAB + 8 * T + 8 * T + T
    assert one - sum(terms.values()) == outside + loss


@pytest.mark.parametrize("distopt", [False, True])
def test_ddp_buffers_match_planned_weights_and_gradients(distopt):
    """megatron-core DDP's param and grad buffers (bf16 weights, fp32 main_grad) against the
    planner's ``weights`` and ``gradients`` (padding to the bucket size: under 1%)."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.layers import build_layer_spec, build_model
    from dlmspec.plan import make_plan

    config = TransformerConfig(
        num_layers=2, hidden_size=H, ffn_hidden_size=FFN, num_attention_heads=HEADS, num_query_groups=2,
        kv_channels=KV, normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, qk_layernorm=True, use_cpu_initialization=True, bf16=True, params_dtype=torch.bfloat16,
    )
    model = build_model(config, layer_spec=build_layer_spec(attention="causal", qk_layernorm=True, use_transformer_engine=False),
                        vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope", rotary_base=10000,
                        ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=distopt))[0]
    grads = sum(b.grad_data.numel() * b.grad_data.element_size() for b in model.buffers)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    spec = Spec.model_validate({
        "model": {"num_layers": 2, "hidden_size": H, "ffn_hidden_size": FFN, "num_attention_heads": HEADS,
                  "num_query_groups": 2, "kv_channels": KV, "vocab_size": VOCAB, "max_position_embeddings": SEQ,
                  "qk_layernorm": True, "transformer_impl": "local"},
        "objective": {"kind": "ar"},
        "parallel": {"use_distributed_optimizer": distopt, "grad_reduce_in_fp32": True},
        "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": SEQ},
        "cluster": {"gpu": "h100", "gpus_per_node": 1},
    })
    b = make_plan(resolve(spec)).memory.peak.breakdown
    assert b["weights"] == weights
    assert b["gradients"] == pytest.approx(grads, rel=0.01)
