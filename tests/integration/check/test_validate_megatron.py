"""The validator against megatron-core itself, beyond TransformerConfig (which
tests/test_validate_conformance.py covers): ``ConstantNumMicroBatchesCalculator``,
``get_num_layers_to_build`` and ``OptimizerParamScheduler`` raise exactly when the rules that cite
them fire, and expert parallelism with TP but without sequence parallelism is what megatron-core
warns about. Skipped where megatron-core is not installed."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from dlmspec.check import find
from dlmspec.spec.models import Spec

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    transformer_config = pytest.importorskip("megatron.core.transformer.transformer_config")

RECOMPUTE = [("none", None, None, None)]


def _spec(heads: int, groups: int, tp: int, sp: bool, ep: int, experts: int | None, recompute: tuple,
          bias: bool = False) -> Spec:
    granularity, method, num_layers, modules = recompute
    model: dict[str, Any] = {
        "num_layers": 8, "hidden_size": 384, "ffn_hidden_size": 1536, "num_attention_heads": heads,
        "num_query_groups": groups, "kv_channels": 32, "vocab_size": 1000, "max_position_embeddings": 1024,
        "add_bias_linear": bias,
    }
    if experts is not None:
        model["num_experts"] = experts
    rc: dict[str, Any] = {"granularity": granularity}
    for key, value in (("method", method), ("num_layers", num_layers), ("modules", modules)):
        if value is not None:
            rc[key] = value
    return Spec.model_validate({
        "model": model,
        "parallel": {"tensor_model_parallel_size": tp, "sequence_parallel": sp, "expert_model_parallel_size": ep},
        "recompute": rc,
        "train": {"global_batch_size": 64, "seq_length": 512, "train_iters": 10},
        "data": {"mock": True, "tokenizer": {"type": "NullTokenizer", "vocab_size": 999}},
        "cluster": {"gpus_per_node": 8},
    })


def test_sequence_parallel_with_ep_is_what_megatron_warns_about() -> None:
    """megatron-core only warns ("sequence parallelism must be used"); dlmspec makes it an error."""
    spec = _spec(8, 4, 2, False, 2, 4, RECOMPUTE[0])
    assert "sequence-parallel-with-ep" in {i.rule for i in find(("spec",), spec)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        transformer_config.TransformerConfig(
            num_layers=8, hidden_size=384, num_attention_heads=8, tensor_model_parallel_size=2,
            expert_model_parallel_size=2, num_moe_experts=4, sequence_parallel=False, add_bias_linear=False,
        )
    assert any("sequence parallelism must be used" in str(w.message) for w in caught)


def _small(changes: dict[str, Any]) -> Spec:
    data: dict[str, Any] = {
        "model": {"num_layers": 8, "hidden_size": 64, "ffn_hidden_size": 256, "num_attention_heads": 4,
                  "vocab_size": 1000, "max_position_embeddings": 1024},
        "train": {"global_batch_size": 64, "micro_batch_size": 1, "seq_length": 128, "train_iters": 100,
                  "eval_interval": 10},
        "data": {"mock": True, "tokenizer": {"type": "NullTokenizer", "vocab_size": 999}},
        "cluster": {"gpus_per_node": 8},
    }
    for key, value in changes.items():
        section, name = key.split(".")
        data.setdefault(section, {})[name] = value
    return Spec.model_validate(data)


@pytest.mark.parametrize(("gbs", "mbs", "gpus"), [(64, 2, 8), (60, 2, 8), (8, 2, 8), (16, 2, 8), (6, 4, 1), (16, 16, 1)])
def test_microbatch_calculator_agrees(gbs: int, mbs: int, gpus: int) -> None:
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    spec = _small({"train.global_batch_size": gbs, "train.micro_batch_size": mbs, "cluster.gpus_per_node": gpus})
    ours = "batch-divisible" in {i.rule for i in find(("spec",), spec)}
    try:
        ConstantNumMicroBatchesCalculator(gbs, mbs, gpus, False, 0)
    except AssertionError:
        assert ours
    else:
        assert not ours


@pytest.mark.parametrize(("layers", "pp", "vpp"), [(8, 2, None), (6, 4, None), (8, 2, 2), (8, 2, 3), (12, 2, 3), (12, 4, 2)])
def test_layers_per_stage_agree(layers: int, pp: int, vpp: int | None) -> None:
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    spec = _small({"model.num_layers": layers, "parallel.pipeline_model_parallel_size": pp,
                   "parallel.virtual_pipeline_model_parallel_size": vpp, "cluster.gpus_per_node": pp})
    ours = bool({i.rule for i in find(("spec",), spec)} & {"pp-divides-layers", "vpp-divides-stage-layers"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformer_config.TransformerConfig(
            num_layers=layers, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=pp,
            virtual_pipeline_model_parallel_size=vpp, pipeline_dtype=torch.bfloat16, add_bias_linear=False,
        )
    try:
        get_num_layers_to_build(config, vp_stage=0 if vpp else None, pp_rank=0)
    except AssertionError:
        assert ours
    else:
        assert not ours


@pytest.mark.parametrize(
    ("lr", "min_lr", "warmup", "iters", "style", "wsd"),
    [
        (3e-4, 3e-5, 10, 100, "cosine", None),
        (3e-4, 1e-3, 10, 100, "cosine", None),
        (3e-4, 3e-5, 100, 100, "linear", None),
        (3e-4, 3e-5, 10, 100, "WSD", None),
        (3e-4, 3e-5, 10, 100, "WSD", 20),
        (3e-4, 3e-4, 0, 1, "constant", None),
    ],
)
def test_lr_scheduler_agrees(lr: float, min_lr: float, warmup: int, iters: int, style: str, wsd: int | None) -> None:
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    spec = _small({"train.lr": lr, "train.min_lr": min_lr, "train.lr_warmup_iters": warmup, "train.train_iters": iters,
                   "train.eval_interval": 1, "train.lr_decay_style": style, "train.lr_wsd_decay_iters": wsd})
    ours = bool({i.rule for i in find(("spec",), spec)} & {"min-lr-le-lr", "warmup-lt-decay", "wsd-needs-decay-iters"})
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    try:
        OptimizerParamScheduler(optimizer, init_lr=0.0, max_lr=lr, min_lr=min_lr, lr_warmup_steps=warmup,
                                lr_decay_steps=iters, lr_decay_style=style, start_wd=0.1, end_wd=0.1,
                                wd_incr_steps=iters, wd_incr_style="constant", wsd_decay_steps=wsd,
                                lr_wsd_decay_style="linear")
    except AssertionError:
        assert ours
    else:
        assert not ours
