"""Attention masks as data: what an attention call must apply, lowered to what each backend takes.

A mask object says which keys each query sees; it never holds an ``s x s`` tensor itself. Each
lowers to

* SDPA (:meth:`AttentionMask.sdpa`): ``(attn_mask, is_causal)`` for
  ``torch.nn.functional.scaled_dot_product_attention``: ``None`` (bidirectional), ``is_causal``
  (causal, square), or a dense bool ``[b | 1, 1, sq, sk]`` tensor, ``True`` = attended;
* FlexAttention (:meth:`AttentionMask.block_mask`): a ``BlockMask`` of
  ``torch.nn.attention.flex_attention.create_block_mask`` over the mask's
  :meth:`~AttentionMask.mask_mod`, cached per shape and device for masks that hold no data
  (causal, block-causal, a ``mask_mod`` function);
* Transformer Engine (:meth:`AttentionMask.te`): ``(attn_mask_type, attention_mask)`` with a
  megatron-core ``AttnMaskType`` name (``no_mask``, ``causal``, ``padding``,
  ``padding_causal``) and the ``[b, 1, 1, s]`` key-padding tensor TE reads, or ``ValueError``
  for a mask TE's fused kernels do not run.

The kinds and which backend runs which: :mod:`dlmspec.attention` (the table validate reads).
Two conventions meet here: megatron-core's ``attention_mask`` tensors are ``True`` where a key
is *hidden*; SDPA's bool ``attn_mask`` and FlexAttention's ``mask_mod`` are ``True`` where it is
*attended*. :meth:`AttentionMask.dense` gives megatron's form (what
``ObjectiveBatch.attention_mask`` carried before), :func:`from_megatron` reads it back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Hashable, Optional, Tuple

import torch
from torch import Tensor

from dlmspec.attention import MASK_KINDS  # noqa: F401  (the kinds' names: AttentionMask.kind)

#: FlexAttention's tile (``create_block_mask``'s ``BLOCK_SIZE``, PyTorch's default 128).
FLEX_TILE = 128

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


def _flex():
    """``torch.nn.attention.flex_attention`` (imported on first use: PyTorch >= 2.5)."""
    from torch.nn.attention import flex_attention

    return flex_attention


class AttentionMask:
    """Base of the mask objects. Subclasses define :attr:`kind`, :meth:`mask_mod` and
    :meth:`cache_key`; the lowering to each backend is shared.

    Attributes:
        kind: One of :data:`dlmspec.attention.MASK_KINDS` (a combination: its parts' kinds).
        block_size: The mask's own block length (block-causal, a ``mask_mod``'s block), or
            ``None``; FlexAttention tiles are :data:`FLEX_TILE` regardless.
    """

    kind: ClassVar[str] = ""
    block_size: Optional[int] = None

    # -- what subclasses define ---------------------------------------------------------------
    def mask_mod(self) -> MaskMod:
        """``f(b, h, q_idx, kv_idx) -> bool``, ``True`` where query ``q_idx`` of row ``b``, head
        ``h`` attends key ``kv_idx`` (FlexAttention's ``mask_mod`` signature; index tensors)."""
        raise NotImplementedError

    def cache_key(self) -> Optional[Hashable]:
        """A key identifying the mask when it holds no per-batch data (its ``BlockMask`` is then
        cached per shape and device), else ``None``."""
        return None

    @property
    def batch(self) -> Optional[int]:
        """Rows the mask differs by (``None``: the same for every row)."""
        return None

    @property
    def kinds(self) -> Tuple[str, ...]:
        """The mask kinds it applies (one, or a combination's parts)."""
        return (self.kind,)

    @property
    def per_query(self) -> bool:
        """Whether a query's keys depend on the query beyond causality (a dense SDPA mask is
        ``[.., sq, sk]`` and may hide every key of a query)."""
        return self.kind in ("block_causal", "document", "mask_mod")

    @property
    def guards_empty_rows(self) -> bool:
        """Whether each query also sees its own key (:func:`guard_empty_rows`): for dense
        per-query tensors, whose rows may be empty (a document wholly in a truncated tail), as
        ``SDPACoreAttention`` has always done for them; mask objects define non-empty rows."""
        return False

    def __and__(self, other: "AttentionMask") -> "AttentionMask":
        return combine(self, other)

    # -- lowering -----------------------------------------------------------------------------
    def allowed(self, sq: int, sk: int, device=None) -> Tensor:
        """Dense bool, broadcastable to ``[b, 1, sq, sk]`` (key padding: ``[b, 1, 1, sk]``),
        ``True`` = attended (SDPA's convention)."""
        b = self.batch or 1
        bi = torch.arange(b, device=device).view(b, 1, 1, 1)
        hi = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
        qi = torch.arange(sq, device=device).view(1, 1, sq, 1)
        ki = torch.arange(sk, device=device).view(1, 1, 1, sk)
        out = self.mask_mod()(bi, hi, qi, ki)
        return out.expand(b, 1, sq, sk).to(torch.bool)

    def dense(self, sq: int, sk: Optional[int] = None, device=None) -> Tensor:
        """:meth:`allowed` in megatron-core's convention: ``True`` = hidden."""
        return ~self.allowed(sq, sq if sk is None else sk, device)

    def sdpa(self, sq: int, sk: int, device=None) -> Tuple[Optional[Tensor], bool]:
        """``(attn_mask, is_causal)`` for ``scaled_dot_product_attention``: ``attn_mask`` bool,
        ``True`` = attended, broadcastable to ``[b, h, sq, sk]``, or ``None``.

        A dense per-query tensor may hide every key of a query, and SDPA would return NaN there;
        such a query sees itself too (square masks only, :attr:`guards_empty_rows`), as
        ``SDPACoreAttention`` does for dense document masks; :meth:`block_mask` does the same.
        """
        mask = self.allowed(sq, sk, device)
        if self.guards_empty_rows and sq == sk:
            mask = mask | torch.eye(sq, dtype=torch.bool, device=device)
        return mask, False

    def block_mask(self, sq: int, sk: int, device, *, tile: int = FLEX_TILE):
        """The FlexAttention ``BlockMask`` of this mask for ``[*, sq]`` queries and ``[*, sk]``
        keys on ``device`` (``create_block_mask`` with ``B = batch``, ``H = None``); cached per
        ``(cache_key, sq, sk, device, tile)`` for masks without data.

        Raises:
            ValueError: ``sq`` or ``sk`` < 1.
        """
        if sq < 1 or sk < 1:
            raise ValueError(f"query and key lengths must be >= 1, got {sq}, {sk}")
        key = self.cache_key()
        mod = guard_empty_rows(self.mask_mod()) if self.guards_empty_rows and sq == sk else self.mask_mod()
        if key is None:
            return _build_block_mask(mod, self.batch, sq, sk, str(torch.device(device)), tile)
        return _cached_block_mask(key, mod, sq, sk, str(torch.device(device)), tile)

    def te(self) -> Tuple[str, Optional[Tensor]]:
        """``(attn_mask_type, attention_mask)`` for Transformer Engine: a megatron-core
        ``AttnMaskType`` name and ``None`` or a key-padding ``[b, 1, 1, s]`` bool (``True`` = hidden).

        Raises:
            ValueError: A kind Transformer Engine's fused attention does not run (block-causal,
                document, ``mask_mod``): use the local layers' ``sdpa`` or ``flex`` backend.
        """
        raise ValueError(
            f"Transformer Engine's fused attention runs no_mask, causal and key padding only, not a {self.kind} "
            "mask (TE's 'arbitrary' type runs only in its unfused attention): use the local layers "
            "(model.transformer_impl = 'local') with attention_backend 'sdpa' or 'flex'"
        )


def guard_empty_rows(mod: MaskMod) -> MaskMod:
    """``mod`` that also lets each query see its own position (``q_idx == kv_idx``), so no
    row of a square per-query mask is empty (SDPA would give NaN, FlexAttention 0)."""

    def guarded(b, h, q_idx, kv_idx):
        return mod(b, h, q_idx, kv_idx) | (q_idx == kv_idx)

    return guarded


def _build_block_mask(mod: MaskMod, batch: Optional[int], sq: int, sk: int, device: str, tile: int):
    return _flex().create_block_mask(mod, B=batch, H=None, Q_LEN=sq, KV_LEN=sk, device=device, BLOCK_SIZE=tile)


@functools.lru_cache(maxsize=64)
def _cached_block_mask_impl(key: Hashable, sq: int, sk: int, device: str, tile: int, holder: "_ModHolder"):
    return _build_block_mask(holder.mod, None, sq, sk, device, tile)


@dataclass(frozen=True)
class _ModHolder:
    """Carries a mask_mod into the cache without making it part of the key (the key is the
    mask's :meth:`AttentionMask.cache_key`)."""

    mod: MaskMod = field(compare=False, hash=False)


def _cached_block_mask(key: Hashable, mod: MaskMod, sq: int, sk: int, device: str, tile: int):
    return _cached_block_mask_impl(key, sq, sk, device, tile, _ModHolder(mod))


def clear_block_mask_cache() -> None:
    """Forget every cached ``BlockMask`` (tests; a process that changes devices)."""
    _cached_block_mask_impl.cache_clear()


# ---------------------------------------------------------------------------------------------
# The kinds


@dataclass(frozen=True)
class Bidirectional(AttentionMask):
    """Every query sees every key (masked diffusion: LLaDA, MDLM)."""

    kind: ClassVar[str] = "bidirectional"

    def mask_mod(self) -> MaskMod:
        return _all_keys

    def cache_key(self):
        return ("bidirectional",)

    def sdpa(self, sq, sk, device=None):
        return None, False

    def te(self):
        return "no_mask", None


def _all_keys(b, h, q_idx, kv_idx):
    return (q_idx >= 0) & (kv_idx >= 0)


@dataclass(frozen=True)
class Causal(AttentionMask):
    """Query ``i`` sees keys ``j <= i`` (next-token prediction)."""

    kind: ClassVar[str] = "causal"

    def mask_mod(self) -> MaskMod:
        return _causal

    def cache_key(self):
        return ("causal",)

    def sdpa(self, sq, sk, device=None):
        if sq == sk:
            return None, True
        return self.allowed(sq, sk, device), False

    def te(self):
        return "causal", None


def _causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


@dataclass(frozen=True)
class BlockCausal(AttentionMask):
    """``j // block_size <= i // block_size``: full attention inside a block, causal across
    blocks (block diffusion over one sequence, Arriola et al. 2025). ``block_size = 1`` is
    causal, ``block_size >= s`` bidirectional.

    Raises:
        ValueError: ``block_size < 1``.
    """

    block_size: int = 1
    kind: ClassVar[str] = "block_causal"

    def __post_init__(self):
        if int(self.block_size) < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")

    def mask_mod(self) -> MaskMod:
        n = int(self.block_size)

        def block_causal(b, h, q_idx, kv_idx):
            return (kv_idx // n) <= (q_idx // n)

        return block_causal

    def cache_key(self):
        return ("block_causal", int(self.block_size))


@dataclass(frozen=True, eq=False)
class KeyPadding(AttentionMask):
    """Keys past each row's length are hidden (variable-length sequences).

    Args:
        padded: bool ``[b, s]``, ``True`` at padded (hidden) keys.

    Raises:
        ValueError: ``padded`` not a 2-D bool tensor.
    """

    padded: Tensor = None
    kind: ClassVar[str] = "key_padding"

    def __post_init__(self):
        if not isinstance(self.padded, Tensor) or self.padded.dim() != 2 or self.padded.dtype != torch.bool:
            raise ValueError("KeyPadding needs a bool [b, s] tensor, True at padded keys")

    @property
    def batch(self):
        return int(self.padded.shape[0])

    def mask_mod(self) -> MaskMod:
        padded = self.padded

        def key_padding(b, h, q_idx, kv_idx):
            return ~padded[b, kv_idx]

        return key_padding

    def allowed(self, sq, sk, device=None):
        if sk != self.padded.shape[1]:
            raise ValueError(f"key padding of {self.padded.shape[1]} keys for {sk} keys")
        return (~self.padded).to(device).view(self.batch, 1, 1, sk)

    def te(self):
        return "padding", self.padded.view(self.batch, 1, 1, -1)


@dataclass(frozen=True, eq=False)
class Document(AttentionMask):
    """A query sees only keys of its own segment (``data.reset_attention_mask``, packed SFT
    sequences; :func:`dlmspec.backends.megatron.sft.segment_attention_mask` is its dense form).

    Args:
        segment_ids: integer ``[b, s]``, equal within a segment.

    Raises:
        ValueError: ``segment_ids`` not a 2-D integer tensor.
    """

    segment_ids: Tensor = None
    kind: ClassVar[str] = "document"

    def __post_init__(self):
        s = self.segment_ids
        if not isinstance(s, Tensor) or s.dim() != 2 or s.dtype.is_floating_point or s.dtype == torch.bool:
            raise ValueError("Document needs an integer [b, s] tensor of segment ids")

    @property
    def batch(self):
        return int(self.segment_ids.shape[0])

    def mask_mod(self) -> MaskMod:
        seg = self.segment_ids

        def document(b, h, q_idx, kv_idx):
            return seg[b, q_idx] == seg[b, kv_idx]

        return document


@dataclass(frozen=True, eq=False)
class MaskFunction(AttentionMask):
    """A general mask: ``fn(b, h, q_idx, kv_idx) -> bool`` (``True`` = attended) over index
    tensors, FlexAttention's ``mask_mod`` signature, with the mask's own block length.

    ``fn`` must be written with tensor operations (no Python branching on values) so that it
    broadcasts (SDPA's dense form) and traces (FlexAttention). It holds no per-batch data unless
    ``batch`` is given, so its ``BlockMask`` is cached by ``(fn, block_size, name)``.

    Args:
        fn: The mask function.
        block_size: The mask's block length (e.g. block diffusion's block), or ``None``.
        name: Shown in messages.
        rows: Rows the function differs by (it reads per-row data), else ``None``.
    """

    fn: MaskMod = None
    block_size: Optional[int] = None
    name: str = "mask_mod"
    rows: Optional[int] = None
    kind: ClassVar[str] = "mask_mod"

    def __post_init__(self):
        if not callable(self.fn):
            raise ValueError("MaskFunction needs a callable fn(b, h, q_idx, kv_idx) -> bool")
        if self.block_size is not None and int(self.block_size) < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")

    @property
    def batch(self):
        return self.rows

    def mask_mod(self) -> MaskMod:
        return self.fn

    def cache_key(self):
        return None if self.rows is not None else ("mask_mod", self.fn, self.block_size, self.name)


@dataclass(frozen=True, eq=False)
class Combined(AttentionMask):
    """Keys every part allows (AND): e.g. key padding with block-causal attention."""

    parts: Tuple[AttentionMask, ...] = ()
    kind: ClassVar[str] = "combined"

    @property
    def kinds(self):
        return tuple(k for p in self.parts for k in p.kinds)

    @property
    def per_query(self):
        return any(p.per_query for p in self.parts)

    @property
    def guards_empty_rows(self):
        return any(p.guards_empty_rows for p in self.parts)

    @property
    def batch(self):
        rows = {p.batch for p in self.parts if p.batch is not None}
        if len(rows) > 1:
            raise ValueError(f"masks of different batch sizes combined: {sorted(rows)}")
        return rows.pop() if rows else None

    @property
    def block_size(self):
        sizes = [p.block_size for p in self.parts if p.block_size is not None]
        return sizes[0] if sizes else None

    def mask_mod(self) -> MaskMod:
        mods = [p.mask_mod() for p in self.parts]

        def combined(b, h, q_idx, kv_idx):
            out = mods[0](b, h, q_idx, kv_idx)
            for m in mods[1:]:
                out = out & m(b, h, q_idx, kv_idx)
            return out

        return combined

    def cache_key(self):
        keys = [p.cache_key() for p in self.parts]
        return None if any(k is None for k in keys) else ("and", *keys)

    def allowed(self, sq, sk, device=None):
        out = None
        for p in self.parts:
            a = p.allowed(sq, sk, device)
            out = a if out is None else out & a
        return out

    def sdpa(self, sq, sk, device=None):
        rest = [p for p in self.parts if not isinstance(p, Bidirectional)]
        if not rest:
            return None, False
        if len(rest) == 1:
            return rest[0].sdpa(sq, sk, device)
        return AttentionMask.sdpa(self, sq, sk, device)

    def te(self):
        kinds = set(self.kinds) - {"bidirectional"}
        pads = [p for p in self.parts if isinstance(p, KeyPadding)]
        if kinds <= {"causal", "key_padding"} and len(pads) <= 1:
            causal = "causal" in kinds
            if not pads:
                return ("causal" if causal else "no_mask"), None
            return ("padding_causal" if causal else "padding"), pads[0].te()[1]
        return AttentionMask.te(self)


def combine(*masks: Optional[AttentionMask]) -> AttentionMask:
    """The AND of ``masks`` (``None`` entries and bidirectional parts of a combination left out);
    :class:`Bidirectional` when nothing is left."""
    parts = []
    for m in masks:
        if m is None or isinstance(m, Bidirectional):
            continue
        parts.extend(m.parts if isinstance(m, Combined) else (m,))
    if not parts:
        return Bidirectional()
    return parts[0] if len(parts) == 1 else Combined(tuple(parts))


def structural(mode: str, block_size: Optional[int] = None) -> AttentionMask:
    """The mask of a layer's attention pattern (``objective.attention_mask``): ``bidirectional``,
    ``causal`` or ``block_causal`` (with ``block_size``).

    Raises:
        ValueError: An unknown mode, or ``block_causal`` without ``block_size >= 1``.
    """
    if mode == "bidirectional":
        return Bidirectional()
    if mode == "causal":
        return Causal()
    if mode == "block_causal":
        if block_size is None:
            raise ValueError("block_causal attention needs block_size >= 1")
        return BlockCausal(int(block_size))
    raise ValueError(f"attention mode must be one of bidirectional, causal, block_causal, got {mode!r}")


@dataclass(frozen=True, eq=False)
class DenseMask(AttentionMask):
    """A megatron-convention dense tensor taken as it is (``True`` = hidden), broadcastable to
    ``[b, 1, sq, sk]``: what callers that build tensors (document masks of the data pipeline)
    hand the layers. Kind ``key_padding`` for ``[b, 1, 1, s]``, else ``document`` (per query)."""

    hidden: Tensor = None

    def __post_init__(self):
        if not isinstance(self.hidden, Tensor) or self.hidden.dtype != torch.bool or self.hidden.dim() != 4:
            raise ValueError("attention_mask must be a bool [b, 1, 1 | sq, sk] tensor, True = not attended")

    @property
    def kind(self):  # type: ignore[override]
        return "key_padding" if self.hidden.shape[-2] == 1 else "document"

    @property
    def per_query(self):
        return self.hidden.shape[-2] != 1

    @property
    def guards_empty_rows(self):
        return self.per_query

    @property
    def batch(self):
        return int(self.hidden.shape[0])

    def mask_mod(self) -> MaskMod:
        hidden = self.hidden
        if hidden.shape[-2] == 1:
            def dense_key_padding(b, h, q_idx, kv_idx):
                return ~hidden[b, 0, 0, kv_idx]
            return dense_key_padding

        def dense_mask(b, h, q_idx, kv_idx):
            return ~hidden[b, 0, q_idx, kv_idx]

        return dense_mask

    def allowed(self, sq, sk, device=None):
        return ~self.hidden.to(device)

    def te(self):
        if self.hidden.shape[-2] == 1:
            return "padding", self.hidden
        return AttentionMask.te(self)


def from_megatron(attention_mask: Optional[Tensor]) -> Optional[AttentionMask]:
    """A megatron-convention ``attention_mask`` (bool, ``True`` = hidden, ``[b, 1, 1, s]`` key
    padding or ``[b, 1, s, s]`` per query) as a mask object; ``None`` stays ``None``; a mask
    object is returned as it is.

    Raises:
        ValueError: Not a bool 4-D tensor.
    """
    if attention_mask is None or isinstance(attention_mask, AttentionMask):
        return attention_mask
    if isinstance(attention_mask, Tensor) and attention_mask.dim() == 4 and attention_mask.shape[-2] == 1 \
            and attention_mask.shape[1] == 1 and attention_mask.dtype == torch.bool:
        return KeyPadding(attention_mask[:, 0, 0, :])
    return DenseMask(attention_mask)


def block_diffusion(seq_len: int, block_size: int, *, clean_causal: bool = False) -> MaskFunction:
    """Block diffusion's mask over the input x_t ⊕ x_0 of length ``2 * seq_len`` (BD3-LM,
    Arriola et al. 2025, eq. 8 and kuleshov-group/bd3lms ``block_diff_mask``): a noised block
    attends to itself (block-diagonal within x_t) and to the clean blocks before it (offset
    block-causal from x_t to x_0); the clean half is block-causal in itself, or causal with
    ``clean_causal`` (Megatron-Bridge ``diffusion/common/dllm.py compute_block_mask``, the form a
    next-token loss on x_0 needs: ``objective.ar_loss_weight``).

    Query ``q`` and key ``k`` in ``[0, 2n)``: half ``h(i) = i >= n``, block ``blk(i) = (i mod n) //
    block_size``; attended iff ``h(q) = h(k) = x_t and blk(q) = blk(k)``, or ``h(q) = x_t, h(k) = x_0
    and blk(q) > blk(k)``, or ``h(q) = h(k) = x_0 and blk(q) >= blk(k)`` (``q >= k`` causal). It is
    a :class:`MaskFunction` without per-row data: FlexAttention's ``BlockMask`` is built once per
    length and device and skips the masked tiles; no ``2n x 2n`` tensor is made on that path.

    Raises:
        ValueError: ``block_size < 1`` or ``seq_len`` not a multiple of it.
    """
    n, bs = int(seq_len), int(block_size)
    if bs < 1 or n < 1 or n % bs:
        raise ValueError(f"seq_len ({n}) must be a positive multiple of block_size ({bs})")
    name = f"block_diffusion(n={n}, block={bs}{', causal x_0' if clean_causal else ''})"
    return MaskFunction(_bd3_mod(n, bs, bool(clean_causal)), block_size=bs, name=name)


@functools.lru_cache(maxsize=None)
def _bd3_mod(n: int, bs: int, clean_causal: bool = False) -> MaskMod:
    # One function per (n, block, clean_causal): the BlockMask cache keys on it.
    def bd3(b, h, q_idx, kv_idx):
        x0_q, x0_kv = q_idx >= n, kv_idx >= n
        block_q = torch.where(x0_q, q_idx - n, q_idx) // bs
        block_kv = torch.where(x0_kv, kv_idx - n, kv_idx) // bs
        diagonal = (block_q == block_kv) & ~x0_q & ~x0_kv
        offset_causal = (block_q > block_kv) & x0_kv & ~x0_q
        if clean_causal:
            clean = (q_idx >= kv_idx) & x0_kv & x0_q
        else:
            clean = (block_q >= block_kv) & x0_kv & x0_q
        return diagonal | offset_causal | clean

    return bd3


@dataclass(frozen=True, eq=False)
class AnnealedCausal(AttentionMask):
    """The causal mask with keys above the diagonal opened at random: query ``i`` attends key ``j``
    iff ``j <= i`` or ``opened[i, j]`` (attention annealing from causal to bidirectional,
    DiffuLLaMA; the schedule and its source: :mod:`dlmspec.objectives.attention_anneal`). One
    ``opened`` for every row and head of a micro-batch (the paper's code expands one ``[s, s]``
    mask over the batch). Kind ``mask_mod``: SDPA takes it dense, FlexAttention as a ``BlockMask``
    (every tile holds opened keys, so none is skipped), Transformer Engine refuses it.

    Its data is per micro-batch, so it has no cache key; instead each instance keeps the
    ``BlockMask`` and the SDPA tensor it built, so the layers of one forward pass share them (built
    once per micro-batch, not once per layer).

    Args:
        opened: bool ``[s, s]``, ``True`` where a key is attended beyond the causal mask.

    Raises:
        ValueError: ``opened`` not a square 2-D bool tensor.
    """

    opened: Tensor = None
    ratio: float = 0.0
    _built: dict = field(default_factory=dict, repr=False)
    kind: ClassVar[str] = "mask_mod"

    def __post_init__(self):
        o = self.opened
        if not isinstance(o, Tensor) or o.dim() != 2 or o.shape[0] != o.shape[1] or o.dtype != torch.bool:
            raise ValueError("AnnealedCausal needs a square bool [s, s] tensor, True at opened keys")

    def mask_mod(self) -> MaskMod:
        opened = self.opened

        def annealed_causal(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) | opened[q_idx, kv_idx]

        return annealed_causal

    def _check(self, sq: int, sk: int) -> None:
        s = int(self.opened.shape[0])
        if sq != s or sk != s:
            raise ValueError(f"an annealed causal mask of {s} positions for {sq} queries and {sk} keys")

    def allowed(self, sq, sk, device=None):
        self._check(sq, sk)
        key = ("allowed", str(torch.device(device)) if device is not None else None)
        if key not in self._built:
            causal = torch.ones(sq, sk, dtype=torch.bool, device=device).tril()
            self._built[key] = (causal | self.opened.to(device)).view(1, 1, sq, sk)
        return self._built[key]

    def block_mask(self, sq: int, sk: int, device, *, tile: int = FLEX_TILE):
        self._check(sq, sk)
        key = ("block_mask", str(torch.device(device)), tile)
        if key not in self._built:
            self._built[key] = _build_block_mask(self.mask_mod(), None, sq, sk, str(torch.device(device)), tile)
        return self._built[key]


def annealed_causal(seq_len: int, ratio: float, generator: Optional[torch.Generator] = None,
                    device=None) -> Optional[AnnealedCausal]:
    """The attention-annealing mask of one micro-batch at ratio ``r`` (``r_k`` of
    :func:`dlmspec.objectives.attention_anneal.anneal_ratio`): ``U ~ U(0, 1)^{s x s}`` drawn from
    ``generator`` (float32, on ``device``) and ``opened = U < r`` (HKUNLP/DiffuLLaMA
    ``get_anneal_attn_mask``: ``bernoulli(r)`` OR the causal mask). ``r >= 1``: ``None`` (full
    attention; nothing drawn). ``r <= 0``: the causal mask as an :class:`AnnealedCausal` with
    nothing opened (the ``s x s`` uniforms are still drawn, so the stream does not depend on ``r``).

    Raises:
        ValueError: ``seq_len < 1`` or a ratio that is not a number.
    """
    r = float(ratio)
    if r != r:
        raise ValueError("the annealing ratio is nan")
    if int(seq_len) < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    if r >= 1.0:
        return None
    s = int(seq_len)
    u = torch.rand(s, s, generator=generator, device=device, dtype=torch.float32)
    return AnnealedCausal(u < r, ratio=r)
