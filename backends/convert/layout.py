"""Tensor layouts megatron-core expects, and their inverses.

Pure tensor functions, no I/O and no megatron import:

* **Fused QKV** (``self_attention.linear_qkv``). Rows are grouped by query group ``g`` (a
  key/value head): ``[q heads of group g, k_g, v_g]`` for ``g = 0 .. G-1``, each head
  ``kv_channels`` rows, query heads of group ``g`` being heads ``g*H/G .. (g+1)*H/G - 1``.
  Total rows ``G * (H/G + 2) * d``. This is the layout
  ``SelfAttention.get_query_key_value_tensors`` splits (``[sq, b, ng, (np/ng + 2) * hn]``).
* **Fused fc1** (``mlp.linear_fc1`` of a gated MLP): ``cat([gate, up], dim=0)``; megatron's
  ``MLP.forward`` chunks the output in two and computes ``silu(first) * second``.
* **Tensor parallelism**: megatron shards column-parallel weights along dim 0 in contiguous
  chunks, row-parallel ones along dim 1, and a gated fc1 per rank as
  ``[gate_r; up_r]`` (its ``ColumnParallelLinear`` is built with ``stride=2``; the
  checkpoint factory ``apply_swiglu_sharded_factory`` stores the two halves separately).
* **Vocabulary padding**: rows appended (zeros) up to ``padded_vocab_size``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch

from dlmspec.backends.convert.errors import ConversionError

#: TP sharding kinds of megatron parameters.
COLUMN = "column"  # split along dim 0 into contiguous chunks
ROW = "row"  # split along dim 1 into contiguous chunks
GATED_COLUMN = "gated_column"  # fc1 of a gated MLP: rank r holds [gate_r; up_r]
REPLICATED = "replicated"  # every rank holds the full tensor
TP_KINDS = (COLUMN, ROW, GATED_COLUMN, REPLICATED)


def _check_rows(t: torch.Tensor, rows: int, name: str) -> None:
    if t.dim() < 1 or t.shape[0] != rows:
        raise ConversionError(
            f"{name} has shape {tuple(t.shape)}, expected {rows} rows",
            tensor=name,
            expected=rows,
        )


def fuse_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_attention_heads: int,
    num_query_groups: int,
    kv_channels: int,
) -> torch.Tensor:
    """Interleave separate q, k, v projections into megatron's ``linear_qkv`` layout.

    Works for weights (``[rows, hidden]``) and biases (``[rows]``) alike.

    Args:
        q: ``[num_attention_heads * kv_channels, ...]``, heads in order.
        k: ``[num_query_groups * kv_channels, ...]``.
        v: ``[num_query_groups * kv_channels, ...]``.
        num_attention_heads: query heads ``H``.
        num_query_groups: key/value heads ``G`` (divides ``H``).
        kv_channels: head width ``d``.

    Returns:
        ``[G * (H/G + 2) * d, ...]``: for each group ``g`` the ``H/G`` query heads of the
        group, then ``k_g``, then ``v_g``.

    Raises:
        ConversionError: row counts that disagree with the head counts, ``G`` not dividing
            ``H``, or mismatched trailing dimensions.
    """
    if num_attention_heads % num_query_groups:
        raise ConversionError(
            f"num_query_groups={num_query_groups} does not divide "
            f"num_attention_heads={num_attention_heads}",
            tensor="linear_qkv",
            expected="G divides H",
        )
    _check_rows(q, num_attention_heads * kv_channels, "q")
    _check_rows(k, num_query_groups * kv_channels, "k")
    _check_rows(v, num_query_groups * kv_channels, "v")
    if not (q.shape[1:] == k.shape[1:] == v.shape[1:]):
        raise ConversionError(
            f"q/k/v trailing shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}",
            tensor="linear_qkv",
            expected="equal trailing dimensions",
        )
    rest = tuple(q.shape[1:])
    hpg = num_attention_heads // num_query_groups
    qg = q.reshape(num_query_groups, hpg * kv_channels, *rest)
    kg = k.reshape(num_query_groups, kv_channels, *rest)
    vg = v.reshape(num_query_groups, kv_channels, *rest)
    fused = torch.cat([qg, kg, vg], dim=1)
    return fused.reshape(num_query_groups * (hpg + 2) * kv_channels, *rest).contiguous()


def split_qkv(
    qkv: torch.Tensor, num_attention_heads: int, num_query_groups: int, kv_channels: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv`.

    Args:
        qkv: ``[G * (H/G + 2) * d, ...]`` in megatron's grouped layout.
        num_attention_heads: ``H``.
        num_query_groups: ``G``.
        kv_channels: ``d``.

    Returns:
        ``(q [H*d, ...], k [G*d, ...], v [G*d, ...])``, contiguous.

    Raises:
        ConversionError: ``qkv`` has the wrong number of rows or ``G`` does not divide ``H``.
    """
    if num_attention_heads % num_query_groups:
        raise ConversionError(
            f"num_query_groups={num_query_groups} does not divide "
            f"num_attention_heads={num_attention_heads}",
            tensor="linear_qkv",
            expected="G divides H",
        )
    hpg = num_attention_heads // num_query_groups
    _check_rows(qkv, num_query_groups * (hpg + 2) * kv_channels, "linear_qkv")
    rest = tuple(qkv.shape[1:])
    grouped = qkv.reshape(num_query_groups, (hpg + 2) * kv_channels, *rest)
    q, k, v = torch.split(grouped, [hpg * kv_channels, kv_channels, kv_channels], dim=1)
    return (
        q.reshape(num_attention_heads * kv_channels, *rest).contiguous(),
        k.reshape(num_query_groups * kv_channels, *rest).contiguous(),
        v.reshape(num_query_groups * kv_channels, *rest).contiguous(),
    )


def fuse_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Megatron's gated ``linear_fc1`` from separate gate and up projections.

    Args:
        gate: ``[ffn, hidden]`` (the branch that goes through SiLU).
        up: ``[ffn, hidden]``.

    Returns:
        ``[2 * ffn, hidden]`` = ``cat([gate, up], dim=0)``.

    Raises:
        ConversionError: ``gate`` and ``up`` shapes differ.
    """
    if gate.shape != up.shape:
        raise ConversionError(
            f"gate {tuple(gate.shape)} and up {tuple(up.shape)} projections differ in shape",
            tensor="linear_fc1",
            expected=tuple(gate.shape),
        )
    return torch.cat([gate, up], dim=0).contiguous()


def split_gate_up(fc1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_gate_up`: ``[2 * ffn, hidden] -> ([ffn, hidden], [ffn, hidden])``.

    Raises:
        ConversionError: an odd number of rows.
    """
    if fc1.dim() < 1 or fc1.shape[0] % 2:
        raise ConversionError(
            f"linear_fc1 has shape {tuple(fc1.shape)}, expected an even number of rows",
            tensor="linear_fc1",
            expected="2 * ffn rows",
        )
    gate, up = torch.chunk(fc1, 2, dim=0)
    return gate.contiguous(), up.contiguous()


# --------------------------------------------------------------------------------------
# Vocabulary padding
def pad_vocab(table: torch.Tensor, padded_vocab_size: int, name: str = "embedding") -> torch.Tensor:
    """Append zero rows so ``table`` has ``padded_vocab_size`` rows.

    Args:
        table: ``[vocab, hidden]`` embedding or output matrix.
        padded_vocab_size: target rows (``>= vocab``).
        name: tensor name for error messages.

    Returns:
        ``[padded_vocab_size, hidden]``; the first ``vocab`` rows are ``table`` unchanged.

    Raises:
        ConversionError: ``table`` already has more rows than ``padded_vocab_size``.
    """
    rows = table.shape[0]
    if rows > padded_vocab_size:
        raise ConversionError(
            f"{name} has {rows} rows, more than padded_vocab_size={padded_vocab_size}",
            tensor=name,
            expected=f"<= {padded_vocab_size} rows",
        )
    if rows == padded_vocab_size:
        return table
    pad = table.new_zeros((padded_vocab_size - rows, *table.shape[1:]))
    return torch.cat([table, pad], dim=0)


def unpad_vocab(table: torch.Tensor, vocab_size: int, name: str = "embedding") -> torch.Tensor:
    """First ``vocab_size`` rows of a padded ``[padded_vocab, hidden]`` table.

    Raises:
        ConversionError: ``table`` has fewer than ``vocab_size`` rows.
    """
    if table.shape[0] < vocab_size:
        raise ConversionError(
            f"{name} has {table.shape[0]} rows, fewer than vocab_size={vocab_size}",
            tensor=name,
            expected=f">= {vocab_size} rows",
        )
    return table[:vocab_size].contiguous()


# --------------------------------------------------------------------------------------
# Tensor parallelism
_COLUMN_RE = re.compile(
    r"(^embedding\.word_embeddings\.weight$|^output_layer\.weight$|"
    r"linear_qkv\.(weight|bias)$)"
)
_GATED_RE = re.compile(r"linear_fc1\.(weight|bias)$")
_ROW_RE = re.compile(r"(linear_proj|linear_fc2)\.weight$")


def tp_kind(name: str, gated: bool = True) -> str:
    """How megatron-core shards the parameter ``name`` across tensor-parallel ranks.

    Args:
        name: a GPTModel state-dict name (local or Transformer Engine spec), e.g.
            ``decoder.layers.3.mlp.experts.local_experts.1.linear_fc1.weight``.
        gated: the MLPs are gated (SwiGLU); every family here is.

    Returns:
        One of :data:`TP_KINDS`: :data:`COLUMN` for the embedding, output layer and
        ``linear_qkv``; :data:`GATED_COLUMN` for ``linear_fc1`` (dense, expert and shared
        expert); :data:`ROW` for ``linear_proj`` and ``linear_fc2`` weights; otherwise
        :data:`REPLICATED` (norms, q/k norms, the router, row-parallel biases).
    """
    if _COLUMN_RE.search(name):
        return COLUMN
    if _GATED_RE.search(name):
        return GATED_COLUMN if gated else COLUMN
    if _ROW_RE.search(name):
        return ROW
    return REPLICATED


def _chunks(t: torch.Tensor, dim: int, tp: int, name: str) -> list[torch.Tensor]:
    if t.dim() <= dim or t.shape[dim] % tp:
        raise ConversionError(
            f"{name}: dimension {dim} of shape {tuple(t.shape)} is not divisible by TP={tp}",
            tensor=name,
            expected=f"dim {dim} divisible by {tp}",
        )
    return [c.contiguous() for c in torch.chunk(t, tp, dim=dim)]


def tp_split(tensor: torch.Tensor, kind: str, tp: int, name: str = "tensor") -> list[torch.Tensor]:
    """Split a full (TP=1) megatron tensor into the ``tp`` per-rank shards megatron holds.

    Args:
        tensor: the full tensor, e.g. fused ``linear_qkv`` ``[G*(H/G+2)*d, h]`` or gated
            ``linear_fc1`` ``[2*ffn, h]``.
        kind: one of :data:`TP_KINDS` (see :func:`tp_kind`).
        tp: tensor-parallel size.
        name: tensor name for error messages.

    Returns:
        ``tp`` tensors; rank ``r`` gets: COLUMN ``tensor[r*n/tp:(r+1)*n/tp]``; ROW the same
        along dim 1; GATED_COLUMN ``cat([gate_r, up_r])`` where ``gate_r``/``up_r`` are the
        ``r``-th contiguous chunks of the gate and up halves; REPLICATED a copy each.

    Raises:
        ConversionError: unknown ``kind``, ``tp < 1`` or a split dimension not divisible by
            ``tp`` (for GATED_COLUMN: ``ffn`` not divisible).
    """
    if tp < 1:
        raise ConversionError(f"TP size must be >= 1, got {tp}", tensor=name, expected=">= 1")
    if kind == COLUMN:
        return _chunks(tensor, 0, tp, name)
    if kind == ROW:
        return _chunks(tensor, 1, tp, name)
    if kind == GATED_COLUMN:
        gate, up = split_gate_up(tensor)
        return [
            torch.cat([g, u], dim=0)
            for g, u in zip(_chunks(gate, 0, tp, name), _chunks(up, 0, tp, name))
        ]
    if kind == REPLICATED:
        return [tensor.clone() for _ in range(tp)]
    raise ConversionError(f"unknown TP kind {kind!r} for {name}", tensor=name, expected=TP_KINDS)


def tp_merge(shards: Sequence[torch.Tensor], kind: str, name: str = "tensor") -> torch.Tensor:
    """Inverse of :func:`tp_split`: the full tensor from the per-rank shards, rank order.

    Raises:
        ConversionError: no shards, unknown ``kind``, or (REPLICATED) shards that differ.
    """
    if not shards:
        raise ConversionError(f"no shards given for {name}", tensor=name, expected=">= 1 shard")
    if kind == COLUMN:
        return torch.cat(list(shards), dim=0)
    if kind == ROW:
        return torch.cat(list(shards), dim=1)
    if kind == GATED_COLUMN:
        halves = [split_gate_up(s) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    if kind == REPLICATED:
        first = shards[0]
        for rank, s in enumerate(shards[1:], start=1):
            if not torch.equal(s, first):
                raise ConversionError(
                    f"replicated tensor {name} differs between rank 0 and rank {rank}",
                    tensor=name,
                    expected="identical copies",
                )
        return first
    raise ConversionError(f"unknown TP kind {kind!r} for {name}", tensor=name, expected=TP_KINDS)


def shard_state_dict(
    state_dict: Mapping[str, torch.Tensor | None], tp: int
) -> list[dict[str, torch.Tensor | None]]:
    """Per-TP-rank megatron state dicts from a full (TP=1) one.

    Args:
        state_dict: GPTModel state-dict names to full tensors (``None`` values, such as
            ``_extra_state``, are copied to every rank).
        tp: tensor-parallel size.

    Returns:
        ``tp`` dicts with the same keys, each tensor split per :func:`tp_kind`.

    Raises:
        ConversionError: a dimension not divisible by ``tp`` (names the tensor).
    """
    out: list[dict[str, torch.Tensor | None]] = [{} for _ in range(tp)]
    for name, t in state_dict.items():
        if t is None or not isinstance(t, torch.Tensor):
            for rank in range(tp):
                out[rank][name] = t
            continue
        for rank, shard in enumerate(tp_split(t, tp_kind(name), tp, name)):
            out[rank][name] = shard
    return out


def merge_state_dicts(
    shards: Sequence[Mapping[str, torch.Tensor | None]],
) -> dict[str, torch.Tensor | None]:
    """Inverse of :func:`shard_state_dict`.

    Raises:
        ConversionError: ranks disagree on the key set, or replicated tensors differ.
    """
    if not shards:
        raise ConversionError("no TP shards given", tensor="state_dict", expected=">= 1 shard")
    keys = list(shards[0].keys())
    for rank, sd in enumerate(shards[1:], start=1):
        if set(sd.keys()) != set(keys):
            diff = sorted(set(sd.keys()) ^ set(keys))
            raise ConversionError(
                f"TP rank {rank} has different tensors than rank 0: {diff[:5]}",
                tensor=diff[0],
                expected="the same names on every rank",
            )
    merged: dict[str, torch.Tensor | None] = {}
    for name in keys:
        values = [sd[name] for sd in shards]
        if not isinstance(values[0], torch.Tensor):
            merged[name] = values[0]
            continue
        merged[name] = tp_merge(values, tp_kind(name), name)
    return merged
