"""Core attention on ``torch.nn.functional.scaled_dot_product_attention`` (SDPA).

:class:`SDPACoreAttention` replaces megatron-core's ``DotProductAttention`` as the
``core_attention`` of the local (non Transformer-Engine) layer spec, with the patterns a
diffusion LM needs (``"bidirectional"``, ``"causal"``, ``"block_causal"``), a caller's
``attention_mask`` combined with them, and context parallelism as megatron's
``cp_comm_type = "all_gather"``. Tensors in megatron's layout (``[s, b, heads, dim]``). The
patterns, masks, kernels and the CP scheme: docs/runtime.md, "Attention".

:class:`FlexCoreAttention` is the same core attention computed with FlexAttention
(``torch.nn.attention.flex_attention``) and a ``BlockMask``, so a mask reaches the kernel without
an ``s x s`` tensor (block diffusion's x_t ⊕ x_0 mask). Both take, as ``attention_mask``,
megatron's bool tensors or a mask object of :mod:`dlmspec.backends.megatron.masks`; which
backend runs which mask kind: :data:`dlmspec.attention.BACKENDS` (docs/attention.md).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from megatron.core import parallel_state, tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide

from dlmspec.attention import BACKENDS as ATTENTION_BACKEND_TABLE

from . import masks as mask_objects

ATTENTION_MODES = ("bidirectional", "causal", "block_causal")

#: The megatron ``AttnMaskType`` that describes each mode (used for the spec's
#: ``self_attention`` params, which megatron also hands to Transformer Engine).
MODE_TO_MASK_TYPE = {
    "bidirectional": AttnMaskType.no_mask,
    "causal": AttnMaskType.causal,
    "block_causal": AttnMaskType.arbitrary,
}


#: The mask type Transformer Engine runs when a call brings a key-padding mask
#: (:func:`te_mask_type`): TE's ``padding`` / ``padding_causal`` (megatron ``AttnMaskType``).
TE_PADDING_MASK_TYPE = {
    AttnMaskType.no_mask: AttnMaskType.padding,
    AttnMaskType.causal: AttnMaskType.padding_causal,
    AttnMaskType.padding: AttnMaskType.padding,
    AttnMaskType.padding_causal: AttnMaskType.padding_causal,
}


def te_mask_type(mask_type: AttnMaskType, attention_mask: Optional[Tensor]) -> AttnMaskType:
    """The mask type a Transformer Engine attention call runs with: the layer's own without a
    mask, TE's padding type (:data:`TE_PADDING_MASK_TYPE`) with a key-padding mask.

    Variable-length MDM sequences (``variable_length = "sequence"``) hand the model a
    ``[b, 1, 1, s]`` bool mask, ``True`` beyond each row's length (the objective's key padding);
    Transformer Engine's ``DotProductAttention`` reads exactly that for ``attn_mask_type="padding"``
    in the ``sbhd`` layout (``True`` = masked out, one mask for queries and keys of self-attention;
    it derives each row's length, ``cu_seqlens``, from it), and ignores a mask under
    ``no_mask``/``causal``. A micro-batch with no row cut brings no mask and keeps the layer's type
    (TE's fastest kernels). Outputs at padded query positions differ from the local path's (TE
    zeroes them, SDPA lets them attend the valid keys), but nothing reads them: later layers mask
    those keys too and their loss weight is 0.

    Args:
        mask_type: The layer's ``attn_mask_type`` (``no_mask`` for MDM, ``causal`` for AR).
        attention_mask: ``None`` or a bool ``[b, 1, 1, s]`` key-padding mask.

    Raises:
        ValueError: For a mask that is not bool or not ``[b, 1, 1, s]`` key padding (a document
            mask ``[b, 1, s, s]`` needs TE's ``arbitrary`` type, run only by its unfused
            attention), or a mask on a layer whose type has no padding form (``arbitrary``).
    """
    if attention_mask is None:
        return mask_type
    if attention_mask.dtype != torch.bool:
        raise ValueError(f"attention_mask must be bool (True = not attended), got {attention_mask.dtype}")
    if attention_mask.dim() != 4 or attention_mask.shape[1] != 1 or attention_mask.shape[2] != 1:
        raise ValueError(
            "the Transformer Engine layers take a key-padding attention_mask [b, 1, 1, s] only "
            f"(variable-length sequences), got shape {tuple(attention_mask.shape)}; document masks "
            "(reset_attention_mask) need the local+sdpa layer spec (use_transformer_engine=False)"
        )
    if mask_type not in TE_PADDING_MASK_TYPE:
        raise ValueError(f"a key-padding mask cannot be combined with attn_mask_type {mask_type.name!r}")
    return TE_PADDING_MASK_TYPE[mask_type]


@functools.lru_cache(maxsize=None)
def with_key_padding(base: type) -> type:
    """A subclass of a Transformer Engine core attention (megatron-core's ``TEDotProductAttention``)
    whose ``forward`` runs TE's padding mask type when a key-padding mask comes
    (:func:`te_mask_type`), so variable-length sequences train on the TE path.

    Outputs at padded query positions are set to 0: TE's fused kernels need not write them, and
    a NaN there would make the loss NaN even at weight 0. One class per ``base`` (cached: layer
    specs built twice hold the same class). The class's ``key_padding_base`` names ``base``;
    :func:`takes_key_padding` tells such classes.

    Raises (from ``forward``):
        ValueError: From :func:`te_mask_type`.
        NotImplementedError: A key-padding mask together with ``packed_seq_params`` (THD).
    """

    def forward(self, query, key, value, attention_mask, attn_mask_type, *args, **kwargs):
        if isinstance(attention_mask, mask_objects.AttentionMask):
            # a mask object lowered to what TE takes (masks.AttentionMask.te: ValueError for the rest)
            te_type, attention_mask = attention_mask.te()
            if te_type in ("causal", "padding_causal") and attn_mask_type == AttnMaskType.no_mask:
                raise ValueError("a causal mask object on a Transformer Engine layer built bidirectional")
        packed = kwargs.get("packed_seq_params", args[1] if len(args) > 1 else None)
        if attention_mask is not None and packed is not None:
            raise NotImplementedError("a key-padding attention_mask together with packed_seq_params (THD)")
        attn_mask_type = te_mask_type(attn_mask_type, attention_mask)
        out = base.forward(self, query, key, value, attention_mask, attn_mask_type, *args, **kwargs)
        if attention_mask is not None and isinstance(out, Tensor) and out.dim() == 3:
            # [sq, b, np * hn]: zero the padded queries. TE's fused kernels need not write them, and a
            # NaN there would reach the loss (times a zero weight is still NaN); nothing else reads them.
            b, s = attention_mask.shape[0], attention_mask.shape[-1]
            out = out.masked_fill(attention_mask.reshape(b, s).transpose(0, 1).unsqueeze(-1), 0.0)
        return out

    forward.__doc__ = (f"``{base.__name__}.forward`` with the mask type of :func:`te_mask_type` "
                       "(a ``[b, 1, 1, s]`` key-padding mask runs TE's ``padding``).")
    return type(f"{base.__name__}WithKeyPadding", (base,), {
        "forward": forward, "key_padding_base": base, "__module__": __name__,
        "__doc__": f"{base.__name__} taking variable-length key-padding masks (:func:`with_key_padding`).",
    })


def takes_key_padding(module) -> bool:
    """True for a core attention that applies a ``[b, 1, 1, s]`` key-padding mask:
    :class:`SDPACoreAttention`, :class:`FlexCoreAttention` and :func:`with_key_padding` classes."""
    return module in (SDPACoreAttention, FlexCoreAttention) or getattr(module, "key_padding_base", None) is not None


#: ``sdpa_backend`` values: PyTorch's order, or one backend tried first.
SDPA_BACKENDS = ("auto", "flash", "cudnn", "efficient", "math")
_SDPA_PRIORITY = {
    "flash": [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "cudnn": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "efficient": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH],
    "math": [SDPBackend.MATH],
}


@functools.lru_cache(maxsize=None)
def auto_sdpa_backend(device: torch.device) -> str:
    """What ``sdpa_backend="auto"`` tries first for unmasked, non-causal attention on ``device``.

    ``"cudnn"`` on GPUs of compute capability 9.0 and above (Hopper, Blackwell): on one H200,
    Qwen3-1.7B at micro batch 10 x 4096 tokens, cuDNN's forward + backward took 10.9 ms per layer
    against flash's 15.5 ms (``bench/results/profile_h200x2_2026-11-30.json``), and the whole
    step was 12% faster (36.7k against 32.8k tokens/s,
    ``bench/results/throughput_qwen3_1.7b_h200_reference_vs_hf.json``). ``"auto"`` otherwise, which
    keeps PyTorch's own order; masked and causal attention keep it too.
    """
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0):
        return "cudnn"
    return "auto"


@functools.lru_cache(maxsize=None)
def initialise_sdpa_dispatch(device: torch.device) -> None:
    """Run one tiny SDPA forward on ``device`` outside any ``sdpa_kernel`` context, once per
    process and device, before the first real call.

    On PyTorch 2.11 (CUDA 13, one H200) the first ``scaled_dot_product_attention`` call of a
    process ignores the priority order ``sdpa_kernel(..., set_priority=True)`` sets around it:
    inside the context ``torch._C._get_sdp_priority_order()`` still reads the default
    ``[cuDNN, flash, efficient, math]``, so with ``sdpa_backend = "efficient"`` the first call took
    flash and every later one the efficient kernel (``bench/gpu/sdpa_choice.py``,
    ``bench/results/exact_resume_diag_h200.json``). A resumed run's first forward then differed
    from the uninterrupted run's forward of the same step in its first attention layer. After
    one call outside a context the order set by the context holds from the first real call on.
    CPU devices need nothing.
    """
    if device.type != "cuda":
        return
    t = torch.zeros(1, 1, 8, 64, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        F.scaled_dot_product_attention(t, t, t)


def block_causal_allowed(seq_len: int, block_size: int, device=None) -> Tensor:
    """Boolean ``[seq_len, seq_len]`` matrix, ``True`` where query i may attend key j.

    ``allowed[i, j] = (j // block_size) <= (i // block_size)``: full attention
    inside a block, causal across blocks (block diffusion, Arriola et al. 2025).
    ``block_size = 1`` gives the causal mask, ``block_size >= seq_len`` the full one.

    Raises:
        ValueError: If ``block_size < 1``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    blocks = torch.arange(seq_len, device=device) // block_size
    return blocks.unsqueeze(1) >= blocks.unsqueeze(0)


@functools.lru_cache(maxsize=8)
def _shared_pattern(seq_len: int, block_size: int, device: str) -> Tensor:
    # One copy per (length, block, device), shared by all layers.
    return block_causal_allowed(seq_len, block_size, device=torch.device(device))


#: ``cp_comm_type`` values :class:`SDPACoreAttention` implements (megatron-core's spelling,
#: ``TransformerConfig.cp_comm_type``); ``"p2p"``, ``"a2a"`` and ``"a2a+p2p"`` exist only in
#: Transformer Engine's attention.
CP_COMM_TYPES = ("all_gather",)


def cp_rank_positions(seq_local: int, cp_size: int, cp_rank: int, device=None) -> Tensor:
    """Global positions ``[seq_local]`` of the tokens context-parallel rank ``cp_rank`` holds.

    megatron-core ``utils.get_batch_on_this_cp_rank`` cuts the sequence of ``S = cp_size *
    seq_local`` tokens into ``2 * cp_size`` chunks of ``c = seq_local / 2`` and gives rank ``r``
    chunks ``r`` and ``2 * cp_size - 1 - r`` (load balance for causal attention), in that order;
    ``RotaryEmbedding.forward`` slices the rotary table the same way
    (``rope_utils.get_pos_emb_on_this_cp_rank``).

    Raises:
        ValueError: If ``seq_local`` is odd or ``cp_rank`` is outside ``[0, cp_size)``.
    """
    if seq_local % 2 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"need an even local length and 0 <= rank < {cp_size}, got {seq_local}, {cp_rank}")
    c = seq_local // 2
    base = torch.arange(c, device=device)
    return torch.cat([base + cp_rank * c, base + (2 * cp_size - 1 - cp_rank) * c])


@functools.lru_cache(maxsize=8)
def _cp_key_order(seq_local: int, cp_size: int, device: str) -> Tensor:
    """Indices ``[cp_size * seq_local]`` that put the all-gathered keys (rank order: rank 0's
    two chunks, then rank 1's, ...) in sequence order."""
    gathered = torch.cat([cp_rank_positions(seq_local, cp_size, r) for r in range(cp_size)])
    return torch.argsort(gathered).to(torch.device(device))


@functools.lru_cache(maxsize=32)
def _cp_chunk_mask(chunk: int, q_start: int, keys: int, block: int, device: str) -> Tuple[Optional[Tensor], bool]:
    """``(allowed [chunk, keys] or None, is_causal)`` for queries at positions ``q_start ..
    q_start + chunk - 1`` against keys ``0 .. keys - 1`` under the block pattern of ``block``
    (1 = causal): query i sees key j when ``j // block <= i // block``. The square causal
    case that starts the sequence is SDPA's ``is_causal`` (flash kernel); an all-true pattern
    is ``None``."""
    if block == 1 and q_start == 0 and keys == chunk:
        return None, True
    q = (torch.arange(chunk) + q_start) // block
    k = torch.arange(keys) // block
    allowed = k.unsqueeze(0) <= q.unsqueeze(1)
    if bool(allowed.all()):
        return None, False
    return allowed.to(torch.device(device)), False


class SDPACoreAttention(MegatronModule):
    """megatron-core ``core_attention`` module computed with PyTorch SDPA.

    The mask kinds it runs: ``mask_kinds`` (:data:`dlmspec.attention.BACKENDS` ``["sdpa"]``).

    The constructor accepts exactly the keywords megatron's ``SelfAttention``
    passes to ``DotProductAttention`` (``config``, ``layer_number``,
    ``attn_mask_type``, ``attention_type``, ``attention_dropout``,
    ``softmax_scale``, ``cp_comm_type``, ``pg_collection``) plus the
    spec-level keywords ``mode`` and ``block_size`` (set through
    ``ModuleSpec(params=...)`` by :func:`dlmspec.backends.megatron.layers.build_layer_spec`).

    Args:
        config: The model's ``TransformerConfig``; reads ``num_attention_heads``,
            ``num_query_groups``, ``kv_channels``, ``attention_dropout``,
            ``softmax_scale``, ``sequence_parallel``, ``context_parallel_size``.
        layer_number: 1-based layer index (kept for megatron's bookkeeping).
        attn_mask_type: megatron's mask type from the spec; informational - the
            pattern is ``mode``.
        attention_type: ``"self"`` (megatron passes it; unused).
        attention_dropout: Dropout probability on the attention weights;
            ``None`` uses ``config.attention_dropout``.
        softmax_scale: Scale of ``QK^T``; ``None`` uses ``1/sqrt(hn)``.
            (``config.apply_query_key_layer_scaling`` only changes where
            megatron's own kernel applies the scale, not the result, so it is
            not needed here.)
        cp_comm_type: Context-parallel communication type (megatron passes
            ``config.cp_comm_type`` when ``context_parallel_size > 1``); must be one of
            :data:`CP_COMM_TYPES` then.
        pg_collection: Process groups; ``tp`` gives the heads per partition, ``cp`` the
            context-parallel group (default: ``parallel_state``'s).
        mode: One of :data:`ATTENTION_MODES`.
        block_size: Block length for ``"block_causal"``.
        sdpa_backend: One of :data:`SDPA_BACKENDS`. ``"auto"``: cuDNN first for unmasked,
            non-causal attention on compute capability 9.0+ (:func:`auto_sdpa_backend`), else
            PyTorch's own order (flash, memory-efficient, math on CUDA); a named backend is tried first and
            PyTorch falls back to the others when it cannot take the inputs (e.g. a mask).
            cuDNN gets dense ``[b, h, s, d]`` copies of its operands (it refuses the strided
            views); memory-efficient attention gets keys and values expanded to every query
            head for GQA (its kernel takes no ``enable_gqa``).

    Raises:
        ValueError: On an unknown mode, a missing ``block_size``, context
            parallelism with a ``cp_comm_type`` outside :data:`CP_COMM_TYPES`,
            sliding-window attention or a non-vanilla softmax (features of
            megatron's attention this module does not implement).
    """

    #: The backend's name in :data:`dlmspec.attention.BACKENDS`.
    backend_name = "sdpa"
    mask_kinds = ATTENTION_BACKEND_TABLE["sdpa"].runs

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection: Optional[ProcessGroupCollection] = None,
        *,
        mode: str = "bidirectional",
        block_size: Optional[int] = None,
        sdpa_backend: str = "auto",
    ) -> None:
        super().__init__(config=config)
        if sdpa_backend not in SDPA_BACKENDS:
            raise ValueError(f"sdpa_backend must be one of {SDPA_BACKENDS}, got {sdpa_backend!r}")
        if mode not in ATTENTION_MODES:
            raise ValueError(f"mode must be one of {ATTENTION_MODES}, got {mode!r}")
        if mode == "block_causal" and (block_size is None or block_size < 1):
            raise ValueError("mode='block_causal' needs block_size >= 1")
        self.cp_size = int(config.context_parallel_size)
        if self.cp_size > 1 and cp_comm_type not in CP_COMM_TYPES:
            raise ValueError(
                f"SDPACoreAttention implements context parallelism with cp_comm_type in {CP_COMM_TYPES} "
                f"(keys and values all-gathered over the CP group), got {cp_comm_type!r}; "
                "'p2p', 'a2a' and 'a2a+p2p' need the Transformer Engine layer spec "
                "(megatron.core TransformerConfig.cp_comm_type)"
            )
        self.cp_comm_type = cp_comm_type
        if getattr(config, "window_size", None) is not None:
            raise ValueError("SDPACoreAttention does not implement sliding-window attention")
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            raise ValueError("SDPACoreAttention only implements the vanilla softmax")

        self.config = config
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        self.mode = mode
        self.block_size = block_size
        self.sdpa_backend = sdpa_backend

        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        self.pg_collection = pg_collection
        tp_size = pg_collection.tp.size()
        self._cp_group = getattr(pg_collection, "cp", None)

        projection_size = config.kv_channels * config.num_attention_heads
        self.hidden_size_per_partition = divide(projection_size, tp_size)
        self.hidden_size_per_attention_head = divide(projection_size, config.num_attention_heads)
        self.num_attention_heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.num_query_groups_per_partition = divide(config.num_query_groups, tp_size)

        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(self.hidden_size_per_attention_head)
        self.softmax_scale = float(softmax_scale)
        self.dropout_p = float(
            config.attention_dropout if attention_dropout is None else attention_dropout
        )

    def _pattern(self, sq: int, sk: int, device: torch.device) -> Optional[Tensor]:
        """Boolean ``[sq, sk]`` allowed-matrix of the mode, ``None`` for bidirectional."""
        if self.mode == "bidirectional":
            return None
        if sq != sk:
            raise ValueError(
                f"{self.mode} attention needs equal query and key lengths, got {sq} and {sk}"
            )
        block = 1 if self.mode == "causal" else int(self.block_size)
        return _shared_pattern(sq, block, str(device))

    def _sdpa_mask(
        self, attention_mask: Optional[Tensor], sq: int, sk: int, device: torch.device
    ) -> Tuple[Optional[Tensor], bool]:
        """Return ``(allowed_mask or None, is_causal)`` for SDPA (a mask object of
        :mod:`~dlmspec.backends.megatron.masks` is combined with the mode and lowered by its
        :meth:`~dlmspec.backends.megatron.masks.AttentionMask.sdpa`)."""
        if isinstance(attention_mask, mask_objects.AttentionMask):
            mask = mask_objects.combine(mask_objects.structural(self.mode, self.block_size), attention_mask)
            return mask.sdpa(sq, sk, device)
        if attention_mask is None:
            if self.mode == "bidirectional":
                return None, False
            if self.mode == "causal" and sq == sk:
                return None, True
            return self._pattern(sq, sk, device), False
        if attention_mask.dtype != torch.bool:
            raise ValueError(
                f"attention_mask must be bool (True = not attended), got {attention_mask.dtype}"
            )
        allowed = ~attention_mask
        pattern = self._pattern(sq, sk, device)
        if pattern is not None:
            allowed = allowed & pattern
        if attention_mask.dim() >= 2 and attention_mask.shape[-2] != 1 and sq == sk:
            # A per-query mask may empty a row (e.g. a document lying wholly in a
            # truncated tail); SDPA would return NaN there.  Let such queries see
            # themselves.  A broadcast key-padding mask ([b, 1, 1, sk]) is left
            # as is: it always keeps key 0.
            allowed = allowed | torch.eye(sq, dtype=torch.bool, device=device)
        return allowed, False

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Optional[Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[Tensor] = None,
        packed_seq_params: Optional[PackedSeqParams] = None,
    ) -> Tensor:
        """Attention over one tensor-parallel partition of the heads.

        Args:
            query: ``[sq, b, np, hn]``.
            key: ``[sk, b, ng, hn]``.
            value: ``[sk, b, ng, hn]``.
            attention_mask: ``None`` or bool, ``True`` = not attended,
                broadcastable to ``[b, np, sq, sk]`` (e.g. ``[b, 1, 1, sk]``
                key padding or ``[b, 1, sq, sk]`` document mask), or a mask object
                (:class:`~dlmspec.backends.megatron.masks.AttentionMask`), combined with the mode.
            attn_mask_type: Ignored (the pattern is the module's ``mode``).
            attention_bias: Must be ``None``.
            packed_seq_params: Must be ``None`` (THD packing needs TE).

        Returns:
            ``[sq, b, np * hn]`` in the dtype of ``query``.

        Raises:
            NotImplementedError: For ``attention_bias`` or ``packed_seq_params``.
            ValueError: For a non-bool mask or mismatched head counts.
        """
        del attn_mask_type
        if packed_seq_params is not None:
            raise NotImplementedError(
                "SDPACoreAttention does not take packed_seq_params (THD); use the TE layer spec"
            )
        if attention_bias is not None:
            raise NotImplementedError("SDPACoreAttention does not take an attention_bias")
        sq, b, np_, hn = query.shape
        sk, _, ng, _ = key.shape
        if np_ % ng != 0:
            raise ValueError(f"query heads ({np_}) not a multiple of key/value groups ({ng})")
        if self.cp_size > 1:
            return self._forward_context_parallel(query, key, value, attention_mask)
        mask, is_causal = self._sdpa_mask(attention_mask, sq, sk, query.device)
        return self._attend(query, key, value, mask, is_causal)

    def _context_parallel_group(self):
        """The CP group: ``pg_collection.cp``, else ``parallel_state``'s (looked up on first use)."""
        if self._cp_group is None:
            self._cp_group = parallel_state.get_context_parallel_group()
        return self._cp_group

    def _forward_context_parallel(
        self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor]
    ) -> Tensor:
        """Attention of this rank's queries over the whole sequence's keys (``cp_comm_type``
        ``"all_gather"``).

        ``query [s, b, np, hn]`` and ``key`` / ``value [s, b, ng, hn]`` hold this rank's two
        chunks of the sequence (:func:`cp_rank_positions`, ``s = S / cp``). Keys and values are
        concatenated to ``[s, b, 2*ng, hn]`` and all-gathered to ``[S, b, 2*ng, hn]`` (rank
        order) in one collective; its backward reduce-scatters their gradients, so each rank
        gets dK/dV of its own tokens summed over every rank's queries. Bidirectional: one SDPA
        call over all keys. Causal / block-causal: the keys are put in sequence order and each
        of the two query chunks attends to the keys up to the last one its pattern allows
        (:func:`_cp_chunk_mask`).

        Returns:
            ``[s, b, np * hn]``.

        Raises:
            ValueError: For an ``attention_mask`` (it would have to cover the gathered keys; the
                trainer refuses masks under context parallelism) or an odd local length.
        """
        if isinstance(attention_mask, mask_objects.AttentionMask):
            # Only what the layer's own pattern already applies runs under CP (dlmspec.attention table).
            extra = [k for k in attention_mask.kinds if k not in ("bidirectional", self.mode)]
            if extra:
                raise ValueError(
                    f"SDPACoreAttention with context parallelism runs the layer's {self.mode} pattern only "
                    f"(dlmspec.attention BACKENDS['sdpa'].context_parallel), not {extra} masks; use "
                    "context_parallel_size = 1 for them"
                )
            attention_mask = None
        if attention_mask is not None:
            raise ValueError(
                "SDPACoreAttention with context parallelism takes no attention_mask "
                "(variable-length / document masks); use context_parallel_size = 1 for them"
            )
        s, _, _, _ = query.shape
        ng = key.shape[2]
        if key.shape[0] != s or s % 2:
            raise ValueError(f"context parallelism needs equal, even local query/key lengths, got {s}, {key.shape[0]}")
        group = self._context_parallel_group()
        kv = torch.cat([key, value], dim=2)
        kv = tensor_parallel.gather_from_sequence_parallel_region(kv, tensor_parallel_output_grad=True, group=group)
        if self.mode == "bidirectional":
            return self._attend(query, kv[:, :, :ng], kv[:, :, ng:], None, False)
        cp, rank = self.cp_size, group.rank()
        kv = kv.index_select(0, _cp_key_order(s, cp, str(kv.device)))
        block = 1 if self.mode == "causal" else int(self.block_size)
        c, total = s // 2, s * cp
        outputs = []
        for half, chunk in enumerate((rank, 2 * cp - 1 - rank)):
            q_start = chunk * c
            keys = min(total, ((q_start + c - 1) // block + 1) * block)
            mask, is_causal = _cp_chunk_mask(c, q_start, keys, block, str(query.device))
            outputs.append(
                self._attend(query[half * c:(half + 1) * c], kv[:keys, :, :ng], kv[:keys, :, ng:], mask, is_causal)
            )
        return torch.cat(outputs, dim=0)

    def _attend(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Optional[Tensor], is_causal: bool
    ) -> Tensor:
        """SDPA on megatron-layout tensors: ``query [sq, b, np, hn]``, ``key`` / ``value``
        ``[sk, b, ng, hn]``, ``mask`` bool ``True`` = attended, broadcastable to
        ``[b, np, sq, sk]``, or ``None``; returns ``[sq, b, np * hn]``."""
        sq, b, np_, hn = query.shape
        ng = key.shape[2]
        q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
        k = key.permute(1, 2, 0, 3)  # [b, ng, sk, hn]
        v = value.permute(1, 2, 0, 3)

        backend = self.sdpa_backend
        if backend == "auto" and query.is_cuda and mask is None and not is_causal:
            backend = auto_sdpa_backend(query.device)
        if backend == "cudnn" and query.is_cuda:
            # cuDNN's kernel takes dense [b, h, s, d] operands; the permuted views above are
            # strided over the sequence and would make PyTorch fall back to another backend.
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        enable_gqa = False
        if np_ != ng:
            if mask is None and self.sdpa_backend != "efficient":
                enable_gqa = True
            else:
                k = k.repeat_interleave(np_ // ng, dim=1)
                v = v.repeat_interleave(np_ // ng, dim=1)

        dropout_p = self.dropout_p if self.training else 0.0

        def _sdpa() -> Tensor:
            return F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=self.softmax_scale,
                enable_gqa=enable_gqa,
            )

        backends = _SDPA_PRIORITY.get(backend) if query.is_cuda else None
        if backends:
            initialise_sdpa_dispatch(query.device)
        with (sdpa_kernel(backends, set_priority=True) if backends else contextlib.nullcontext()):
            if dropout_p > 0.0 and not self.config.sequence_parallel and query.is_cuda:
                # Heads are partitioned over TP ranks: draw dropout from megatron's
                # model-parallel RNG stream, as DotProductAttention does.
                with tensor_parallel.get_cuda_rng_tracker().fork():
                    context = _sdpa()
            else:
                context = _sdpa()

        # [b, np, sq, hn] -> [sq, b, np * hn]
        return context.permute(2, 0, 1, 3).reshape(sq, b, np_ * hn)


@functools.lru_cache(maxsize=None)
def compiled_flex_attention():
    """``torch.compile(flex_attention)``: FlexAttention's fused Triton kernels (forward and
    backward) on CUDA; one compiled function per process (PyTorch recompiles per shape)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_attention_eager(query: Tensor, key: Tensor, value: Tensor, block_mask, scale: float,
                         enable_gqa: bool) -> Tensor:
    """FlexAttention without compilation: PyTorch's reference implementation of the
    ``flex_attention`` operator (it computes the full ``[b, h, sq, sk]`` scores, masked by the
    ``BlockMask``'s ``mask_mod``), forward and backward, on any device.

    ``torch.nn.attention.flex_attention.flex_attention`` refuses inputs that require gradients on
    CPU (``_validate_device``) although its operator's eager forward and backward run there; for
    those this calls the operator itself (``torch._higher_order_ops.flex_attention``) with the
    options the public function would pass (PyTorch 2.13). Everything else goes through the
    public function. Used on CPU (tests) only; CUDA runs :func:`compiled_flex_attention`.

    Args:
        query: ``[b, hq, sq, d]``; key, value: ``[b, hkv, sk, d]``.
        block_mask: A ``BlockMask`` for ``(sq, sk)``.
        scale: Softmax scale.
        enable_gqa: ``hq`` is a multiple of ``hkv``.

    Returns:
        ``[b, hq, sq, d]``.
    """
    from torch.nn.attention import flex_attention as fa

    needs_grad = query.requires_grad or key.requires_grad or value.requires_grad
    if not (query.device.type == "cpu" and needs_grad and torch.is_grad_enabled()):
        return fa.flex_attention(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)
    from torch._higher_order_ops.flex_attention import flex_attention as flex_op

    if enable_gqa is False and query.size(1) != key.size(1):
        raise ValueError(f"query heads {query.size(1)} != key heads {key.size(1)} without enable_gqa")
    options = fa._apply_kernel_options(query, key, value, False, None, None)
    out, _, _ = flex_op(query, key, value, fa._identity, block_mask.as_tuple(), scale, options)
    return out


class FlexCoreAttention(SDPACoreAttention):
    """megatron-core ``core_attention`` module computed with FlexAttention
    (``torch.nn.attention.flex_attention``) and a ``BlockMask``.

    Built like :class:`SDPACoreAttention` (same keywords, ``mode`` and ``block_size``); the layer's
    pattern and the call's ``attention_mask`` (a megatron bool tensor, or a mask object of
    :mod:`~dlmspec.backends.megatron.masks`) are combined into one mask object, whose
    ``BlockMask`` (``create_block_mask``, 128 x 128 tiles) the kernel reads: tiles that no key of
    the mask reaches are skipped, so block-causal and block-diffusion masks cost their density,
    and a mask function needs no ``s x s`` tensor. Structural masks' ``BlockMask``s are cached
    per shape and device. On CUDA the kernel is ``torch.compile``'d
    (:func:`compiled_flex_attention`); elsewhere PyTorch's reference implementation
    (:func:`flex_attention_eager`).

    The mask kinds it runs: ``mask_kinds`` (:data:`dlmspec.attention.BACKENDS` ``["flex"]``).

    Raises:
        ValueError: As :class:`SDPACoreAttention`, and for context parallelism or attention
            dropout (FlexAttention has neither; the table's ``flex`` entry).
    """

    backend_name = "flex"
    mask_kinds = ATTENTION_BACKEND_TABLE["flex"].runs

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, cp_comm_type: Optional[str] = None,
                 pg_collection: Optional[ProcessGroupCollection] = None, *, mode: str = "bidirectional",
                 block_size: Optional[int] = None, sdpa_backend: str = "auto") -> None:
        if int(config.context_parallel_size) > 1 and not ATTENTION_BACKEND_TABLE["flex"].context_parallel:
            raise ValueError(
                "FlexCoreAttention has no context parallelism (dlmspec.attention BACKENDS['flex']); "
                "use attention_backend 'sdpa' (all_gather) or context_parallel_size = 1"
            )
        super().__init__(config, layer_number, attn_mask_type, attention_type, attention_dropout, softmax_scale,
                         None, pg_collection, mode=mode, block_size=block_size, sdpa_backend=sdpa_backend)
        if self.dropout_p > 0.0 and not ATTENTION_BACKEND_TABLE["flex"].dropout:
            raise ValueError(
                f"FlexCoreAttention has no attention dropout (got {self.dropout_p}); use attention_backend 'sdpa' "
                "or attention_dropout = 0"
            )

    def mask_for(self, attention_mask, sq: int, sk: int) -> "mask_objects.AttentionMask":
        """The layer's pattern AND the call's mask, as one mask object.

        Raises:
            ValueError: A tensor that is not bool ``[b, 1, 1 | sq, sk]``; a per-query pattern with
                ``sq != sk``.
        """
        if self.mode != "bidirectional" and sq != sk:
            raise ValueError(f"{self.mode} attention needs equal query and key lengths, got {sq} and {sk}")
        return mask_objects.combine(mask_objects.structural(self.mode, self.block_size),
                                    mask_objects.from_megatron(attention_mask))

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask,
                attn_mask_type: Optional[AttnMaskType] = None, attention_bias: Optional[Tensor] = None,
                packed_seq_params: Optional[PackedSeqParams] = None) -> Tensor:
        """Attention over one tensor-parallel partition of the heads (as
        :meth:`SDPACoreAttention.forward`): ``query [sq, b, np, hn]``, ``key`` / ``value``
        ``[sk, b, ng, hn]``, ``attention_mask`` ``None``, a megatron bool tensor (``True`` = not
        attended) or a mask object; returns ``[sq, b, np * hn]``.

        Raises:
            NotImplementedError: For ``attention_bias`` or ``packed_seq_params``.
            ValueError: For a mask that is neither, or mismatched head counts.
        """
        del attn_mask_type
        if packed_seq_params is not None:
            raise NotImplementedError("FlexCoreAttention does not take packed_seq_params (THD); use the TE layer spec")
        if attention_bias is not None:
            raise NotImplementedError("FlexCoreAttention does not take an attention_bias")
        sq, b, np_, hn = query.shape
        sk, _, ng, _ = key.shape
        if np_ % ng != 0:
            raise ValueError(f"query heads ({np_}) not a multiple of key/value groups ({ng})")
        mask = self.mask_for(attention_mask, sq, sk)
        if mask.batch is not None and mask.batch != b:
            raise ValueError(f"attention mask of {mask.batch} rows for a micro-batch of {b}")
        block_mask = mask.block_mask(sq, sk, query.device)
        q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
        k = key.permute(1, 2, 0, 3)  # [b, ng, sk, hn]
        v = value.permute(1, 2, 0, 3)
        if query.is_cuda:
            context = compiled_flex_attention()(q, k, v, block_mask=block_mask, scale=self.softmax_scale,
                                                enable_gqa=np_ != ng)
        else:
            context = flex_attention_eager(q, k, v, block_mask, self.softmax_scale, np_ != ng)
        return context.permute(2, 0, 1, 3).reshape(sq, b, np_ * hn)
