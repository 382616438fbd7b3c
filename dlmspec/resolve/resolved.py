"""The :class:`Resolved` spec: every value a later stage reads (built by :func:`dlmspec.resolve.resolve`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dlmspec.gpus import GPU
from dlmspec.params import ParamCounts
from dlmspec.resolve.blend import BlendResolution
from dlmspec.resolve.tokenizer import FILE_FACT_TYPES, GPT2_VOCAB_SIZE, TOKENIZER_KEYS, TOKENIZER_READS, EodChoice
from dlmspec.resolve.values import RuntimeValues
from dlmspec.tokenizers import TokenizerFacts

if TYPE_CHECKING:
    from dlmspec.spec.models import Spec


@dataclass(frozen=True)
class Resolved:
    """A spec with every derived value.

    Attributes:
        spec: the validated spec.
        world_size: GPUs in the job (nodes * gpus_per_node).
        tp, pp, vpp, cp, ep, etp: parallel sizes (vpp is None without interleaving; etp
            defaults to tp).
        dp: data-parallel size, world / (tp * pp * cp) (megatron-core parallel_state).
        expert_dp: expert data-parallel size, world / (etp * ep * pp).
        num_microbatches: microbatches per step per DP rank, gbs / (mbs * dp).
        padded_vocab_size: vocab padded for TP (see :func:`padded_vocab_size`).
        num_query_groups, kv_channels, moe_ffn_hidden_size: model values with defaults filled.
        attention_mask: bidirectional, causal or block_causal.
        mask_token_id: [MASK] id for mdm (None for ar).
        train_iters: optimizer steps (from train_iters or train_tokens / tokens per step).
        tokens_per_step: global_batch_size * seq_length.
        params: counts with the tokenizer vocabulary (compare with published figures).
        params_padded: counts with the padded vocabulary (what is in memory).
        moe_layers: 1 per MoE layer, 0 per dense layer.
        gpu: the catalog entry of ``cluster.gpu`` (None if unknown; validate reports it).
        cross_entropy: ``"fused_linear"`` or ``"megatron"`` (``kernels.cross_entropy``;
            ``"auto"`` is fused_linear at TP = 1, where the output layer is not split).
        transformer_impl: the layer path train.py asks for, ``"transformer_engine"``,
            ``"local"`` or ``"auto"`` (the runtime decides), and transformer_impl_reason: why
            (:func:`layer_path`).
        train_blend, valid_blend: ``data.train`` / ``data.valid`` with globs and manifests
            expanded into shards weighted by tokens (:func:`resolve_blend`); empty with mock data.
        tokenizer_facts: the size and EOD read from the tokenizer's files for the types of
            :data:`FILE_FACT_TYPES` (:func:`spec_tokenizer_facts`), else None.
        eod: the end-of-document id train.py passes to the runtime (:func:`eod_choice`).
        record_means: ``(prefix, mean conversation tokens, response fraction, note)`` of each
            training shard's dataset record, read for an SFT stage only (:func:`record_means`).
        stage_values: what the stage's registration renders into train.py
            (:data:`dlmspec.stages.STAGE_KINDS`' ``template_values``), computed here so the
            registry (below the spec) never imports resolve; ``None`` for a stage without any.
        runtime: every value train.py and the launch scripts pass beyond the spec's own
            (:class:`~dlmspec.resolve.runtime.RuntimeValues`); None only while :func:`resolve`
            builds it.
    """

    spec: Spec
    world_size: int
    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    etp: int
    dp: int
    expert_dp: int
    num_microbatches: int
    padded_vocab_size: int
    num_query_groups: int
    kv_channels: int
    moe_ffn_hidden_size: int | None
    attention_mask: str
    mask_token_id: int | None
    train_iters: int
    tokens_per_step: int
    params: ParamCounts
    params_padded: ParamCounts
    moe_layers: tuple[int, ...]
    gpu: GPU | None
    cross_entropy: str = "megatron"
    transformer_impl: str = "auto"
    transformer_impl_reason: str = ""
    train_blend: BlendResolution = BlendResolution()
    valid_blend: BlendResolution = BlendResolution()
    tokenizer_facts: TokenizerFacts | None = None
    eod: EodChoice | None = None
    runtime: RuntimeValues | None = None
    record_means: tuple[tuple[str, float | None, float | None, str], ...] = ()
    stage_values: dict[str, Any] | None = None

    def tokenizer_size(self) -> int | None:
        """Ids the spec's tokenizer emits, when the spec says it (one more than its largest id):
        NullTokenizer's ``vocab_size + 1`` (its EOD is ``vocab_size``), GPT-2 BPE's 50257. None
        for a tokenizer whose files hold it (Hugging Face, SentencePiece, TikToken)."""
        tok = self.spec.data.tokenizer
        if tok.type == "NullTokenizer" and tok.vocab_size is not None:
            return tok.vocab_size + 1
        if tok.type == "GPT2BPETokenizer":
            return GPT2_VOCAB_SIZE
        if tok.type in FILE_FACT_TYPES:  # read from its files by resolve (dlmspec.tokenizers.tokenizer_facts)
            return self.tokenizer_facts.size if self.tokenizer_facts is not None else None
        return None

    def tokenizer_settings(self) -> list[tuple[str, Any]]:
        """``(key, value)`` of the ``data.tokenizer`` keys the tokenizer's type reads
        (:data:`TOKENIZER_READS`) and the spec sets, in :data:`TOKENIZER_KEYS` order; keys the type
        ignores are left out (the ``tokenizer-keys-ignored`` rule reports them)."""
        tok = self.spec.data.tokenizer
        reads = TOKENIZER_READS.get(tok.type, ())
        return [(k, getattr(tok, k)) for k in TOKENIZER_KEYS if k in reads and getattr(tok, k) is not None]

    def derived(self) -> dict[str, Any]:
        """The derived values as a JSON-ready dict (``dlmspec show``)."""
        return {
            "world_size": self.world_size,
            "data_parallel_size": self.dp,
            "expert_data_parallel_size": self.expert_dp,
            "num_microbatches": self.num_microbatches,
            "padded_vocab_size": self.padded_vocab_size,
            "num_query_groups": self.num_query_groups,
            "kv_channels": self.kv_channels,
            "expert_tensor_parallel_size": self.etp,
            "attention_mask": self.attention_mask,
            "mask_token_id": self.mask_token_id,
            "cross_entropy": self.cross_entropy,
            "transformer_impl": self.transformer_impl,
            "transformer_impl_reason": self.transformer_impl_reason,
            "train_iters": self.train_iters,
            "tokens_per_step": self.tokens_per_step,
            "parameters": {
                "total": self.params.total,
                "active": self.params.active,
                "embedding": self.params.embedding,
                "non_embedding": self.params.non_embedding,
                "total_padded_vocab": self.params_padded.total,
            },
        }
