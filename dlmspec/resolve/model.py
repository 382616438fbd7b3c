"""The one derivation of a spec's values: :func:`resolve` builds the :class:`~dlmspec.resolve.resolved.Resolved`."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from dlmspec import objectives
from dlmspec.gpus import GPUS
from dlmspec.layout import derive as derive_layout
from dlmspec.params import count_parameters, moe_layer_pattern
from dlmspec.resolve.blend import BlendResolution, record_means, resolve_blend
from dlmspec.resolve.layers import effective_cross_entropy, layer_path
from dlmspec.resolve.resolved import Resolved
from dlmspec.resolve.runtime import runtime_values
from dlmspec.resolve.stage import stage_template_values
from dlmspec.resolve.tokenizer import FILE_FACT_TYPES, eod_choice, padded_vocab_size, spec_tokenizer_facts
from dlmspec.spec.presets import MASK_TOKEN_IDS

if TYPE_CHECKING:
    from dlmspec.spec.models import Spec


def resolve(spec: Spec) -> Resolved:
    """Derive every value of :class:`Resolved` from ``spec`` (no errors raised; see module doc).
    The tokenizer's files and the data blends are read here, once."""
    m, par, tr = spec.model, spec.parallel, spec.train
    world = spec.cluster.world_size
    tp, pp, cp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size, par.context_parallel_size
    ep = par.expert_model_parallel_size
    etp = par.expert_tensor_parallel_size or tp
    dp, expert_dp, num_microbatches = derive_layout(world, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp,
                                                    global_batch_size=tr.global_batch_size,
                                                    micro_batch_size=tr.micro_batch_size)
    padded = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)
    objective = objectives.get(spec.objective.kind)
    attention = spec.objective.attention_mask or objective.attention
    mask_id = None
    if objective.diffusion:
        mask_id = spec.objective.mask_token_id
        if mask_id is None:
            mask_id = MASK_TOKEN_IDS.get(m.preset or "", m.vocab_size)
    tokens_per_step = tr.global_batch_size * tr.seq_length
    impl, impl_reason = layer_path(spec, attention, cp)
    if tr.train_iters is not None:
        iters = tr.train_iters
    elif tr.train_tokens is not None:
        iters = max(1, math.ceil(tr.train_tokens / tokens_per_step))
    else:
        iters = 0
    resolved = Resolved(
        spec=spec,
        world_size=world,
        tp=tp,
        pp=pp,
        vpp=par.virtual_pipeline_model_parallel_size,
        cp=cp,
        ep=ep,
        etp=etp,
        dp=dp,
        expert_dp=expert_dp,
        num_microbatches=num_microbatches,
        padded_vocab_size=padded,
        num_query_groups=m.num_query_groups or m.num_attention_heads,
        kv_channels=m.kv_channels or max(1, m.hidden_size // m.num_attention_heads),
        moe_ffn_hidden_size=(m.moe_ffn_hidden_size or m.ffn_hidden_size) if m.num_experts else None,
        attention_mask=attention,
        mask_token_id=mask_id,
        train_iters=iters,
        tokens_per_step=tokens_per_step,
        params=count_parameters(m),
        params_padded=count_parameters(m, padded),
        moe_layers=tuple(moe_layer_pattern(m)),
        gpu=GPUS.get(spec.cluster.gpu),
        cross_entropy=effective_cross_entropy(spec.kernels.cross_entropy, tp, spec.parallel.fsdp),
        transformer_impl=impl,
        transformer_impl_reason=impl_reason,
        train_blend=BlendResolution() if spec.data.mock else resolve_blend(spec.data.train, "data.train"),
        valid_blend=BlendResolution() if spec.data.mock else resolve_blend(spec.data.valid, "data.valid"),
        tokenizer_facts=spec_tokenizer_facts(spec) if spec.data.tokenizer.type in FILE_FACT_TYPES else None,
        eod=eod_choice(spec),
    )
    if spec.stage.kind == "sft" and not spec.data.mock:
        resolved = replace(resolved, record_means=record_means(resolved.train_blend))
    return replace(resolved, runtime=runtime_values(resolved), stage_values=stage_template_values(spec))
