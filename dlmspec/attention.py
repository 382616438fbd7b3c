"""Attention mask kinds and the backends that run them: one plain table both sides read.

The compiler (:mod:`dlmspec.check.mask`'s attention rules) and the runtime
(``dlmspec.backends.megatron.masks`` and ``attention``) read the same names from here, so a
combination validate accepts is one the runtime runs. Nothing here imports torch.

Mask kinds (what an attention call must apply; a run may need several at once, they combine by
AND):

* ``bidirectional``: every query sees every key (masked diffusion).
* ``causal``: query ``i`` sees keys ``j <= i`` (next-token prediction).
* ``block_causal``: ``j // block <= i // block`` (full inside a block, causal across blocks).
* ``key_padding``: keys past each row's length are hidden (variable-length sequences).
* ``document``: a query sees only keys of its own segment (``data.reset_attention_mask``,
  packed SFT sequences): per query, ``[b, s, s]`` as a dense tensor.
* ``mask_mod``: any function ``(b, h, q_idx, kv_idx) -> bool`` with a block length, e.g.
  block diffusion's x_t ⊕ x_0 mask (Arriola et al. 2025).

Backends (the core attention of a layer):

* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on megatron-core's local layers
  (``SDPACoreAttention``): every kind, the per-query ones (``block_causal``, ``document``,
  ``mask_mod``) as a dense bool ``[b, 1, s, s]`` tensor, which takes SDPA off its flash and cuDNN
  kernels; context parallelism (``all_gather``) for the structural kinds only.
* ``flex``: ``torch.nn.attention.flex_attention`` with a ``BlockMask`` on the local layers
  (``FlexCoreAttention``): every kind without a dense ``s x s`` tensor; no context parallelism
  and no attention dropout.
* ``te``: Transformer Engine's ``DotProductAttention`` (megatron-core's TE layer spec):
  ``no_mask``, ``causal`` and, for a key-padding mask, ``padding``/``padding_causal``; TE's
  ``arbitrary`` mask type runs only in its unfused attention, which the layers do not use.
  Context parallelism for ``bidirectional`` and ``causal`` (TE's ``get_attention_backend``).

megatron-core's ``TransformerConfig.attention_backend`` (``AttnBackend``: ``flash``, ``fused``,
``unfused``, ``local``, ``auto``) chooses among Transformer Engine's kernels, or megatron's own
``DotProductAttention`` (``local``); ``sdpa`` and ``flex`` both replace that ``local`` core
attention (:data:`MCORE_ATTN_BACKEND`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Every mask kind, in the order messages list them.
MASK_KINDS: tuple[str, ...] = ("bidirectional", "causal", "block_causal", "key_padding", "document", "mask_mod")

#: The structural kinds a layer is built with (``objective.attention_mask``).
STRUCTURAL_KINDS: tuple[str, ...] = ("bidirectional", "causal", "block_causal")

#: ``model.attention_backend`` values: a backend of the local layers, or ``auto``
#: (:func:`choose_backend`). Unset: ``sdpa``.
SPEC_ATTENTION_BACKENDS: tuple[str, ...] = ("sdpa", "flex", "auto")

#: The default of ``model.attention_backend`` (measured faster at bidirectional 4k: docs/attention.md).
DEFAULT_ATTENTION_BACKEND = "sdpa"


@dataclass(frozen=True)
class BackendMasks:
    """What one attention backend runs.

    Attributes:
        name: ``sdpa``, ``flex`` or ``te``.
        layer_path: ``local`` (megatron-core's local layer spec) or ``transformer_engine``.
        runs: The mask kinds it applies.
        dense: The kinds it applies only through a dense ``[b, 1, s, s]`` tensor (memory
            ``b * s * s`` bytes, and no flash/cuDNN kernel).
        context_parallel: The kinds it runs with ``context_parallel_size > 1``.
        dropout: Whether it applies attention dropout.
        source: Where the capability is implemented or documented.
    """

    name: str
    layer_path: str
    runs: frozenset[str]
    dense: frozenset[str]
    context_parallel: frozenset[str]
    dropout: bool
    source: str


#: The table: which backend runs which mask kind.
BACKENDS: dict[str, BackendMasks] = {
    "sdpa": BackendMasks(
        "sdpa", "local", frozenset(MASK_KINDS), frozenset({"block_causal", "document", "mask_mod"}),
        frozenset(STRUCTURAL_KINDS), True,
        "backends/megatron/attention.py SDPACoreAttention (torch.nn.functional.scaled_dot_product_attention)",
    ),
    "flex": BackendMasks(
        "flex", "local", frozenset(MASK_KINDS), frozenset(), frozenset(), False,
        "backends/megatron/attention.py FlexCoreAttention (torch.nn.attention.flex_attention with a BlockMask)",
    ),
    "te": BackendMasks(
        "te", "transformer_engine", frozenset({"bidirectional", "causal", "key_padding"}), frozenset(),
        frozenset({"bidirectional", "causal"}), True,
        "transformer_engine.pytorch DotProductAttention (no_mask, causal, padding, padding_causal; "
        "utils.get_attention_backend: context parallelism with no_mask/causal only)",
    ),
}

#: megatron-core ``AttnBackend`` name each backend corresponds to (``TransformerConfig.attention_backend``).
MCORE_ATTN_BACKEND: dict[str, str] = {"sdpa": "local", "flex": "local", "te": "auto"}


def refused_kinds(backend: str, kinds: tuple[str, ...] | list[str], *, context_parallel: bool = False,
                  dropout: bool = False) -> list[str]:
    """The kinds of ``kinds`` that ``backend`` does not run (in :data:`MASK_KINDS` order), plus
    ``"dropout"`` when attention dropout is asked of a backend without it.

    Raises:
        KeyError: For a backend not in :data:`BACKENDS`.
    """
    entry = BACKENDS[backend]
    allowed = entry.context_parallel if context_parallel else entry.runs
    out = [k for k in MASK_KINDS if k in kinds and k not in allowed]
    if dropout and not entry.dropout:
        out.append("dropout")
    return out


def backends_running(kinds: tuple[str, ...] | list[str], *, context_parallel: bool = False,
                     dropout: bool = False, layer_path: str | None = None) -> list[str]:
    """The backends (table order) that run every kind of ``kinds`` under these conditions,
    optionally only those of one ``layer_path`` (``local`` / ``transformer_engine``)."""
    return [name for name, entry in BACKENDS.items()
            if (layer_path is None or entry.layer_path == layer_path)
            and not refused_kinds(name, kinds, context_parallel=context_parallel, dropout=dropout)]


#: Mask kinds for which ``auto`` takes FlexAttention over SDPA: SDPA must materialise them as a
#: dense tensor and falls back to its memory-efficient kernel; FlexAttention skips masked blocks.
#: Measured on one H100 80 GB, forward + backward at Qwen3-1.7B's attention shape, sequence 4096
#: (bench/results/attention/2026-12-06-h100-flex-vs-sdpa.json): block-causal 5.5 ms against
#: 12.9 ms; a mask function (block diffusion's x_t (+) x_0, 8192 long) 10.9 against 49.5 ms.
#: Bidirectional and causal attention stay on SDPA (7.4 against 9.9 ms; 4.1 against 5.7 ms).
FLEX_FASTER_KINDS: frozenset[str] = frozenset({"block_causal", "mask_mod"})


def choose_backend(requested: str | None, kinds: tuple[str, ...] | list[str], *, context_parallel: bool = False,
                   dropout: bool = False) -> str:
    """The local-path backend ``model.attention_backend`` names: ``sdpa`` when unset, the named
    one, or for ``auto`` SDPA unless the layer's pattern is one FlexAttention runs faster
    (:data:`FLEX_FASTER_KINDS`: block-causal, or a ``mask_mod`` whose dense ``s x s`` tensor a
    block-diffusion run must not build) or SDPA cannot run a kind, then FlexAttention when that
    runs them.

    Raises:
        ValueError: For a value outside :data:`SPEC_ATTENTION_BACKENDS`.
    """
    if requested is None:
        return DEFAULT_ATTENTION_BACKEND
    if requested not in SPEC_ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {SPEC_ATTENTION_BACKENDS}, got {requested!r}")
    if requested != "auto":
        return requested
    sdpa_ok = not refused_kinds("sdpa", kinds, context_parallel=context_parallel, dropout=dropout)
    flex_ok = not refused_kinds("flex", kinds, context_parallel=context_parallel, dropout=dropout)
    if flex_ok and (not sdpa_ok or FLEX_FASTER_KINDS & set(kinds)):
        return "flex"
    return "sdpa"
