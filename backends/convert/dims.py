"""Plain model dimensions shared by the converter and the dlmspec compiler.

:class:`ModelDims` is deliberately a frozen stdlib dataclass of ints, floats, bools and one
string, so the compiler can build one from its (pydantic) spec without either side importing
the other's types. Everything the converter needs to know about a model's *shape* is here;
the family says which Hugging Face names and config class go with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dlmspec.backends.convert.errors import ConversionError

#: Families the converter knows, by their dlmspec name.
FAMILIES: tuple[str, ...] = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "mixtral",
    "llada",
    "dream",
)

#: Families whose MLP is a mixture of experts in every layer.
MOE_FAMILIES: frozenset[str] = frozenset({"qwen3_moe", "mixtral"})


def padded_vocab_size(vocab_size: int, make_vocab_size_divisible_by: int = 128, tp: int = 1) -> int:
    """Vocabulary size rounded up the way Megatron pads it.

    Megatron pads the embedding table (and an untied output layer) to a multiple of
    ``make_vocab_size_divisible_by * tensor_model_parallel_size`` so every TP rank holds the
    same number of rows.

    Args:
        vocab_size: rows of the unpadded table (the tokenizer's size or the HF table's rows).
        make_vocab_size_divisible_by: Megatron's ``--make-vocab-size-divisible-by`` (128).
        tp: tensor-parallel size the model will run with.

    Returns:
        The smallest multiple of ``make_vocab_size_divisible_by * tp`` that is ``>= vocab_size``.

    Raises:
        ConversionError: a non-positive argument.
    """
    if vocab_size <= 0 or make_vocab_size_divisible_by <= 0 or tp <= 0:
        raise ConversionError(
            f"padded_vocab_size needs positive sizes, got vocab_size={vocab_size}, "
            f"make_vocab_size_divisible_by={make_vocab_size_divisible_by}, tp={tp}",
            tensor="vocab_size",
            expected="positive integers",
        )
    multiple = make_vocab_size_divisible_by * tp
    return -(-vocab_size // multiple) * multiple


#: How :meth:`ModelDims.from_dict` words each field annotation's type.
_TYPE_TEXT = {"str": "a string", "int": "an integer", "bool": "true or false", "float": "a finite number",
              "float | None": "a finite number or null"}


def _has_type(value: Any, annotation: str) -> bool:
    """Whether a JSON value fits a :class:`ModelDims` field annotation (bools are not ints)."""
    if annotation == "float | None" and value is None:
        return True
    if annotation == "str":
        return isinstance(value, str)
    if annotation == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if annotation == "int":
        return isinstance(value, int)
    return isinstance(value, (int, float)) and abs(value) != float("inf") and value == value


@dataclass(frozen=True)
class ModelDims:
    """Dimensions of a decoder-only transformer, in megatron-core's vocabulary.

    Attributes:
        family: one of :data:`FAMILIES`; picks Hugging Face names and the config class.
        num_layers: decoder layers.
        hidden_size: model width ``h``.
        ffn_hidden_size: width of one dense MLP branch (gate and up each have this many rows;
            megatron's fused ``linear_fc1`` has ``2 * ffn_hidden_size`` rows). For MoE
            families this is unused by the weights but kept for the config.
        num_attention_heads: query heads.
        num_query_groups: key/value heads (GQA groups); equal to ``num_attention_heads`` for
            MHA. Must divide ``num_attention_heads``.
        kv_channels: per-head width (``head_dim``); Qwen3 sets it independently of
            ``hidden_size / num_attention_heads``.
        vocab_size: rows of the Hugging Face embedding table (unpadded).
        padded_vocab_size: rows of megatron's embedding table (``>= vocab_size``), see
            :func:`padded_vocab_size`.
        tied: output layer shares the embedding matrix (``tie_word_embeddings``).
        qk_layernorm: per-head RMSNorm on queries and keys (Qwen3).
        add_qkv_bias: biases on the q/k/v projections (Qwen2, Dream).
        num_experts: routed experts per MoE layer; 0 for a dense model.
        moe_ffn_hidden_size: width of one routed expert's gate/up branch.
        moe_router_topk: experts chosen per token.
        moe_router_norm_topk: top-k probabilities renormalised to sum to one (Mixtral: always;
            Qwen3-MoE: ``norm_topk_prob``). Maps to megatron ``moe_router_pre_softmax=False``.
        shared_expert_ffn_hidden_size: width of the shared expert MLP; 0 for none.
        rotary_base: RoPE theta.
        rope_scaling_factor: Llama-3 style RoPE scaling factor, or ``None`` for none.
        norm_epsilon: RMSNorm epsilon.
        max_position_embeddings: longest sequence the config advertises.
    """

    family: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int
    padded_vocab_size: int
    tied: bool = False
    qk_layernorm: bool = False
    add_qkv_bias: bool = False
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    moe_router_topk: int = 0
    moe_router_norm_topk: bool = True
    shared_expert_ffn_hidden_size: int = 0
    rotary_base: float = 10000.0
    rope_scaling_factor: float | None = None
    norm_epsilon: float = 1e-6
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConversionError(
                f"unknown model family {self.family!r}; known families: {', '.join(FAMILIES)}",
                tensor="family",
                expected=FAMILIES,
            )
        for name in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_query_groups",
            "kv_channels",
            "vocab_size",
            "padded_vocab_size",
        ):
            if int(getattr(self, name)) <= 0:
                raise ConversionError(
                    f"{name} must be positive, got {getattr(self, name)}", tensor=name, expected="> 0"
                )
        if self.num_attention_heads % self.num_query_groups:
            raise ConversionError(
                f"num_query_groups={self.num_query_groups} must divide "
                f"num_attention_heads={self.num_attention_heads}",
                tensor="num_query_groups",
                expected=f"a divisor of {self.num_attention_heads}",
            )
        if self.padded_vocab_size < self.vocab_size:
            raise ConversionError(
                f"padded_vocab_size={self.padded_vocab_size} is smaller than "
                f"vocab_size={self.vocab_size}",
                tensor="padded_vocab_size",
                expected=f">= {self.vocab_size}",
            )
        if self.family in MOE_FAMILIES and self.num_experts <= 0:
            raise ConversionError(
                f"family {self.family!r} is a mixture of experts but num_experts={self.num_experts}",
                tensor="num_experts",
                expected="> 0",
            )
        if self.family not in MOE_FAMILIES and self.num_experts:
            raise ConversionError(
                f"family {self.family!r} is dense but num_experts={self.num_experts}",
                tensor="num_experts",
                expected=0,
            )
        if self.is_moe:
            if self.moe_ffn_hidden_size <= 0 or not 0 < self.moe_router_topk <= self.num_experts:
                raise ConversionError(
                    f"MoE needs moe_ffn_hidden_size > 0 and 0 < moe_router_topk <= num_experts, "
                    f"got moe_ffn_hidden_size={self.moe_ffn_hidden_size}, "
                    f"moe_router_topk={self.moe_router_topk}, num_experts={self.num_experts}",
                    tensor="moe_ffn_hidden_size",
                    expected="positive expert width and a valid top-k",
                )
        elif self.ffn_hidden_size <= 0:
            raise ConversionError(
                f"ffn_hidden_size must be positive, got {self.ffn_hidden_size}",
                tensor="ffn_hidden_size",
                expected="> 0",
            )

    # ----------------------------------------------------------------------------------
    # Derived sizes
    @property
    def is_moe(self) -> bool:
        """True when every layer's MLP is a mixture of experts."""
        return self.num_experts > 0

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head."""
        return self.num_attention_heads // self.num_query_groups

    @property
    def q_rows(self) -> int:
        """Rows of the query projection: ``num_attention_heads * kv_channels``."""
        return self.num_attention_heads * self.kv_channels

    @property
    def kv_rows(self) -> int:
        """Rows of the key (or value) projection: ``num_query_groups * kv_channels``."""
        return self.num_query_groups * self.kv_channels

    @property
    def qkv_rows(self) -> int:
        """Rows of megatron's fused ``linear_qkv``: ``q_rows + 2 * kv_rows``."""
        return self.q_rows + 2 * self.kv_rows

    # ----------------------------------------------------------------------------------
    # Serialisation
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{field: value}``."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelDims":
        """Inverse of :meth:`to_dict`.

        Raises:
            ConversionError: ``data`` not a dict, an unknown key, a value of the wrong type
                (``"big"``, ``1e9`` or ``true`` for an int), or values :class:`ModelDims` rejects.
        """
        if not isinstance(data, dict):
            raise ConversionError(f"dims is a {type(data).__name__}, expected an object of ModelDims fields",
                                  tensor="dims", expected="an object")
        fields = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        unknown = sorted((k for k in data if k not in fields), key=str)
        if unknown:
            raise ConversionError(
                f"unknown ModelDims keys {unknown}", tensor=str(unknown[0]), expected=sorted(fields)
            )
        for name, annotation in fields.items():
            if name in data and not _has_type(data[name], annotation):
                raise ConversionError(
                    f"dims.{name} = {data[name]!r} must be {_TYPE_TEXT[annotation]}",
                    tensor=name,
                    expected=_TYPE_TEXT[annotation],
                )
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise ConversionError(f"bad ModelDims: {exc}", tensor="ModelDims") from exc

    def with_padded_vocab(self, make_vocab_size_divisible_by: int = 128, tp: int = 1) -> "ModelDims":
        """A copy whose ``padded_vocab_size`` is :func:`padded_vocab_size` of ``vocab_size``."""
        return dataclasses.replace(
            self,
            padded_vocab_size=padded_vocab_size(self.vocab_size, make_vocab_size_divisible_by, tp),
        )
