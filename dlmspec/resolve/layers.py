"""The layer path (``transformer_impl``) and the cross entropy a spec runs on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlmspec import objectives
from dlmspec.resolve.stage import sft_attention_mask

if TYPE_CHECKING:
    from dlmspec.spec.models import Spec


def effective_cross_entropy(setting: str, tensor_parallel: int, fsdp: str = "none") -> str:
    """``"fused_linear"`` or ``"megatron"``: what ``[kernels] cross_entropy = setting`` runs at
    TP = ``tensor_parallel`` with ``[parallel] fsdp``. ``"auto"`` fuses where the output layer is
    whole on the rank: TP = 1 and no Megatron-FSDP (which gathers the sharded output weight only
    inside the model's forward, while the fused loss uses it outside)."""
    if setting == "auto":
        return "fused_linear" if tensor_parallel == 1 and fsdp != "megatron" else "megatron"
    return setting


#: ``[parallel] cp_comm_type`` values the local layers implement: SDPA core attention all-gathers
#: keys and values over the context-parallel group (``dlmspec.backends.megatron.attention.CP_COMM_TYPES``,
#: megatron-core's spelling ``"all_gather"``); ``p2p``, ``a2a`` and ``a2a+p2p`` need Transformer
#: Engine's attention.
LOCAL_CP_COMM_TYPES = ("allgather",)


def layer_path_needs(spec: Spec, attention_mask: str, cp: int) -> tuple[list[str], list[str]]:
    """The spec's features that only one layer path runs, as ``"key = value"`` texts.

    Returns:
        ``(local_only, te_only)``. Local only (the Transformer Engine path refuses them): document
        masks, a per-query attention mask that the TE layers do not take
        (``dlmspec.backends.megatron.checks.check_masks_supported``), block-causal attention
        (``dlmspec.backends.megatron.layers.build_layer_spec``), and SFT batches with segment
        masks (:func:`sft_attention_mask`), attention annealing (its random mask per call), and a
        local core attention named by
        ``model.attention_backend`` (``sdpa``, ``flex``). Transformer Engine only: fp8
        (megatron-core runs fp8 in TE layers), grouped-GEMM experts (``build_layer_spec``) and
        context parallelism with a ``cp_comm_type`` outside :data:`LOCAL_CP_COMM_TYPES`
        (``dlmspec.backends.megatron.attention``). Variable-length sequences run on both paths
        (:func:`layer_path_prefers`).
    """
    data, par = spec.data, spec.parallel
    local = [text for text, on in (
        ("data.reset_attention_mask = true", data.reset_attention_mask),
        ("objective.attention_mask = 'block_causal'", attention_mask == "block_causal"),
        (f"objective.kind = {spec.objective.kind!r} (a mask function per call)",
         objectives.get(spec.objective.kind).block_diffusion),
        (f"objective.attention_anneal_iters = {spec.objective.attention_anneal_iters!r} (an annealed mask per call)",
         spec.objective.attention_anneal_iters is not None),
        (sft_attention_mask(spec) or "", sft_attention_mask(spec) is not None),
        (f"model.attention_backend = {spec.model.attention_backend!r}",
         spec.model.attention_backend in ("sdpa", "flex")),  # a core attention of the local layers
    ) if on]
    te = [text for text, on in (
        (f"precision.fp8 = {spec.precision.fp8!r}", spec.precision.fp8 != "none"),
        ("model.moe_grouped_gemm = true", spec.model.moe_grouped_gemm),
        (f"parallel.cp_comm_type = {par.cp_comm_type!r} with context_parallel_size = {cp}",
         cp > 1 and par.cp_comm_type not in LOCAL_CP_COMM_TYPES),
    ) if on]
    return local, te


def layer_path_prefers(spec: Spec) -> list[str]:
    """The spec's features that ``auto`` runs on the local layers unless a Transformer Engine-only
    feature is there, as ``"key = value"`` texts: variable-length MDM sequences cut one by one
    (``objective.variable_length = "sequence"``; a ``"micro_batch"`` cut is a dense shorter
    micro-batch). Both paths run them (TE through its padding mask,
    ``dlmspec.backends.megatron.attention.with_key_padding``); the local one is where they were
    measured and planned, so ``auto`` keeps them there."""
    obj = spec.objective
    return [f"objective.variable_length_prob = {obj.variable_length_prob!r}"] if (
        objectives.get(obj.kind).masked_variable_length_prob(obj) > 0
    ) else []


def layer_path(spec: Spec, attention_mask: str, cp: int) -> tuple[str, str]:
    """``(transformer_impl, reason)``: the layer path train.py asks for.

    ``"local"`` or ``"transformer_engine"`` as ``model.transformer_impl`` says; for ``"auto"``
    the path the features need (:func:`layer_path_needs`): local when one needs it (then a
    Transformer Engine-only feature is reported by the validator against the local path), else
    Transformer Engine when one needs it, else local when one prefers it
    (:func:`layer_path_prefers`), else ``"auto"``: the runtime takes Transformer Engine where it
    imports on the GPU machine, else the local layers.
    """
    impl = spec.model.transformer_impl
    if impl != "auto":
        return impl, f"model.transformer_impl = {impl!r}"
    local, te = layer_path_needs(spec, attention_mask, cp)
    if local:
        return "local", (f"auto: {', '.join(local)} {'needs' if len(local) == 1 else 'need'} the local layers, "
                         "which the Transformer Engine path does not run")
    if te:
        return "transformer_engine", f"auto: {', '.join(te)} {'needs' if len(te) == 1 else 'need'} Transformer Engine"
    prefers = layer_path_prefers(spec)
    if prefers:
        return "local", (f"auto: {', '.join(prefers)} keeps the local layers, where it is measured; "
                         "model.transformer_impl = 'transformer_engine' runs it through TE's padding mask")
    return "auto", ("Transformer Engine where it imports on the GPU machine, else local; no feature of this "
                    "spec needs either")
