"""Hugging Face ``config.json`` <-> :class:`~dlmspec.backends.convert.dims.ModelDims`: which family a
config is (:func:`detect_family`), the checks of its values (:func:`check_hf_config`), reading its
dimensions (:func:`dims_from_hf_config`: the ``transformers`` families through their config class,
LLaDA and Dream from their own keys) and writing one for given dimensions
(:func:`hf_config_from_dims`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlmspec.backends.convert.dims import MOE_FAMILIES, ModelDims, padded_vocab_size
from dlmspec.backends.convert.errors import ConversionError

#: HF ``model_type`` -> dlmspec family.
MODEL_TYPES: dict[str, str] = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "mixtral": "mixtral",
    "llada": "llada",
    "Dream": "dream",
    "dream": "dream",
}

#: ``architectures`` entry written into config.json per family.
ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "llada": "LLaDAModelLM",
    "dream": "DreamModel",
}

#: Families whose config class ships with ``transformers`` (others are remote code).
TRANSFORMERS_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral"})


def detect_family(config: Mapping[str, Any]) -> str:
    """The dlmspec family of a Hugging Face ``config.json`` dict.

    Raises:
        ConversionError: ``model_type`` missing or not one of :data:`MODEL_TYPES`.
    """
    if not isinstance(config, Mapping):
        check_hf_config(config)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise ConversionError(
            f"unknown model family: config model_type={model_type!r} "
            f"(architectures={config.get('architectures')}); known: {sorted(MODEL_TYPES)}",
            tensor="model_type",
            expected=sorted(MODEL_TYPES),
            hint=f"convert a checkpoint whose config.json has model_type one of {', '.join(sorted(MODEL_TYPES))}",
        )
    return MODEL_TYPES[model_type]


def _fail(key: str, message: str, expected: object) -> ConversionError:
    return ConversionError(message, tensor=key, expected=expected)


def _rope_from_parameters(rope: Mapping[str, Any] | None, fallback_theta: float | None) -> tuple[float, float | None]:
    """(rope theta, llama3 scaling factor or None) from a ``rope_parameters`` dict."""
    rope = dict(rope or {})
    theta = rope.get("rope_theta", fallback_theta)
    if theta is None:
        raise _fail("rope_theta", "config has no rope_theta", "a float")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type == "llama3":
        wanted = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        for key, value in wanted.items():
            if float(rope.get(key, value)) != float(value):
                raise _fail(
                    f"rope_scaling.{key}",
                    f"llama3 rope scaling with {key}={rope.get(key)} cannot be represented: "
                    f"megatron-core's RotaryEmbedding hard-codes {key}={value}",
                    value,
                )
        return float(theta), float(rope.get("factor", 8.0))
    raise _fail("rope_scaling", f"rope scaling type {rope_type!r} is not supported", ("default", "llama3"))


#: What each ``config.json`` key the converter reads must hold, per family group:
#: key -> (kind, what it is). Kinds: ``int`` (positive integer), ``int?`` (positive integer or
#: null), ``num`` (positive finite number), ``bool``, ``dict?`` (an object or null). Keys absent
#: from the file are not checked (``transformers`` fills its defaults; the required keys of the
#: remote-code families are in :data:`_REQUIRED_KEYS`).
_CONFIG_KEYS: dict[str, dict[str, tuple[str, str]]] = {
    "transformers": {
        "hidden_size": ("int", "the model width"),
        "intermediate_size": ("int", "the MLP width"),
        "num_hidden_layers": ("int", "the number of decoder layers"),
        "num_attention_heads": ("int", "the number of query heads"),
        "num_key_value_heads": ("int?", "the number of key/value heads"),
        "head_dim": ("int?", "the width of one attention head"),
        "vocab_size": ("int", "the rows of the embedding table"),
        "max_position_embeddings": ("int", "the longest sequence the model is configured for"),
        "rms_norm_eps": ("num", "the RMSNorm epsilon"),
        "rope_theta": ("num", "the RoPE base"),
        "rope_parameters": ("dict?", "the RoPE settings"),
        "rope_scaling": ("dict?", "the RoPE scaling settings"),
        "tie_word_embeddings": ("bool", "whether the output layer shares the embedding"),
        "attention_bias": ("bool", "whether the attention projections have biases"),
        "mlp_bias": ("bool", "whether the MLP projections have biases"),
        "num_experts": ("int", "the number of routed experts"),
        "num_local_experts": ("int", "the number of routed experts"),
        "num_experts_per_tok": ("int", "the experts chosen per token"),
        "moe_intermediate_size": ("int", "the width of one expert"),
        "decoder_sparse_step": ("int", "the MoE layer frequency"),
        "norm_topk_prob": ("bool", "whether the top-k router probabilities are renormalised"),
    },
    "llada": {
        "d_model": ("int", "the model width"),
        "n_layers": ("int", "the number of decoder layers"),
        "n_heads": ("int", "the number of query heads"),
        "n_kv_heads": ("int?", "the number of key/value heads"),
        "mlp_hidden_size": ("int?", "the MLP width"),
        "mlp_ratio": ("int?", "the MLP width as a multiple of d_model"),
        "vocab_size": ("int", "the tokenizer's vocabulary"),
        "embedding_size": ("int?", "the rows of the embedding table"),
        "max_sequence_length": ("int", "the longest sequence the model is configured for"),
        "rope_theta": ("num", "the RoPE base"),
        "rms_norm_eps": ("num", "the RMSNorm epsilon"),
        "weight_tying": ("bool", "whether the output layer shares the embedding"),
        "include_qkv_bias": ("bool", "whether q/k/v have biases"),
    },
}

#: Dream's config.json is a Qwen2 config: the transformers keys, less the bias and MoE ones.
_CONFIG_KEYS["dream"] = {key: _CONFIG_KEYS["transformers"][key] for key in (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_parameters",
    "tie_word_embeddings")}

#: MoE keys, checked for the MoE families only.
_MOE_KEYS = frozenset({"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                       "decoder_sparse_step", "norm_topk_prob"})

#: Keys the remote-code families' configs must have (they have no ``transformers`` defaults).
_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "llada": ("d_model", "n_layers", "n_heads", "vocab_size"),
    "dream": ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"),
}

#: The ``config.json`` keys holding head counts, width and layers, per family group.
_SHAPE_KEYS: dict[str, dict[str, str]] = {
    "transformers": {"heads": "num_attention_heads", "groups": "num_key_value_heads", "hidden": "hidden_size",
                     "head_dim": "head_dim", "layers": "num_hidden_layers"},
    "llada": {"heads": "n_heads", "groups": "n_kv_heads", "hidden": "d_model", "head_dim": "", "layers": "n_layers"},
    "dream": {"heads": "num_attention_heads", "groups": "num_key_value_heads", "hidden": "hidden_size",
              "head_dim": "head_dim", "layers": "num_hidden_layers"},
}

_KIND_TEXT = {"int": "a positive integer", "int?": "a positive integer or null", "num": "a positive number",
              "bool": "true or false", "dict?": "an object or null"}


def _group(family: str) -> str:
    return family if family in ("llada", "dream") else "transformers"


def config_key(family: str, what: str) -> str:
    """The ``config.json`` key of ``family`` holding ``what`` (``"layers"``, ``"heads"``, ``"groups"``,
    ``"hidden"``, ``"head_dim"``), for messages."""
    return _SHAPE_KEYS[_group(family)][what]


def _value_ok(kind: str, value: Any) -> bool:
    if kind in ("int", "int?"):
        if value is None:
            return kind == "int?"
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    if kind == "num":
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
                and value != float("inf"))
    if kind == "bool":
        return isinstance(value, bool)
    return value is None or isinstance(value, dict)


def check_hf_config(config: Any, family: str | None = None) -> None:
    """Refuse a ``config.json`` whose values the converter would misread or crash on.

    Checks the top level is an object, each key of :data:`_CONFIG_KEYS` present for the family
    has the right type and range (``hidden_size: "big"``, ``num_attention_heads: 0``,
    ``num_hidden_layers: 1e9``, ``head_dim: 0``, ``max_position_embeddings: -5`` are refused),
    the remote-code families' required keys are there, the key/value heads divide the query heads,
    and, without ``head_dim``, the heads divide the width.

    Args:
        config: the parsed ``config.json``.
        family: its dlmspec family (default: from ``model_type``).

    Raises:
        ConversionError: naming the key, its value, why and a value that works.
    """
    if not isinstance(config, Mapping):
        raise _fail("config.json", f"the top level is a {type(config).__name__}, expected a JSON object ({{...}}) "
                    "with model_type and the model's sizes. Fix: restore config.json from the original checkpoint",
                    "a JSON object")
    family = family or detect_family(config)
    group = _group(family)
    for key in _REQUIRED_KEYS.get(group, ()):
        if key not in config:
            kind, what = _CONFIG_KEYS[group][key]
            raise _fail(key, f"config.json has no {key} ({what}), which a {family} config needs. "
                        f"Fix: add {key} = {_KIND_TEXT[kind]}", _KIND_TEXT[kind])
    for key, (kind, what) in _CONFIG_KEYS[group].items():
        if key in _MOE_KEYS and family not in MOE_FAMILIES:
            continue
        if key in config and not _value_ok(kind, config[key]):
            value = config[key]
            hint = f"set {key} to the checkpoint's value ({_KIND_TEXT[kind]})"
            if kind.endswith("?"):
                hint += ", or remove it"
            why = "is not an integer" if kind.startswith("int") and isinstance(value, float) else f"must be {_KIND_TEXT[kind]}"
            raise _fail(key, f"{key} = {value!r} {why} ({what}). Fix: {hint}", _KIND_TEXT[kind])
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key) or {}
        for sub in ("rope_theta", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if sub in rope and not _value_ok("num", rope[sub]):
                raise _fail(f"{key}.{sub}", f"{key}.{sub} = {rope[sub]!r} must be a positive number. "
                            f"Fix: restore {key} from the original checkpoint", "a positive number")
    names = _SHAPE_KEYS[group]
    heads = config.get(names["heads"])
    groups = config.get(names["groups"]) or heads
    if isinstance(heads, int) and isinstance(groups, int) and heads % groups:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        raise _fail(names["groups"], f"{names['groups']} = {groups} does not divide {names['heads']} = {heads} "
                    f"(each key/value head serves a whole group of query heads). Fix: one of "
                    f"{', '.join(map(str, divisors))}", divisors)
    hidden = config.get(names["hidden"])
    if (isinstance(hidden, int) and isinstance(heads, int) and hidden % heads
            and not (names["head_dim"] and config.get(names["head_dim"]))):
        raise _fail(names["hidden"], f"{names['hidden']} = {hidden} is not divisible by {names['heads']} = {heads} "
                    f"and the config sets no head width. Fix: set {names['head_dim'] or names['heads']} to the "
                    "checkpoint's value", "a multiple of the head count")


def dims_from_hf_config(
    config: Mapping[str, Any],
    *,
    make_vocab_size_divisible_by: int = 128,
    tp: int = 1,
    padded_vocab: int | None = None,
    source: str | None = None,
) -> ModelDims:
    """:class:`ModelDims` from a Hugging Face ``config.json`` dict.

    Args:
        config: the parsed ``config.json`` (checked first, :func:`check_hf_config`).
        make_vocab_size_divisible_by: Megatron's vocabulary padding multiple.
        tp: tensor-parallel size used for padding.
        padded_vocab: explicit padded vocabulary size (overrides the two above).
        source: the file ``config`` was read from; every message then starts with it.

    Returns:
        The dimensions; ``vocab_size`` is the HF table's row count (LLaDA:
        ``embedding_size`` when set).

    Raises:
        ConversionError: unknown family (``model_type``), a value of the wrong type or range
            (:func:`check_hf_config`), or a config feature megatron's GPT layout here cannot
            represent (named by key): biases on ``o_proj``/MLP, mixed dense/MoE layers,
            unsupported rope scaling, LLaDA non-llama blocks, etc.
    """
    try:
        check_hf_config(config)
        family = detect_family(config)
        if family in TRANSFORMERS_FAMILIES:
            fields = _fields_from_transformers(family, config)
        elif family == "llada":
            fields = _fields_from_llada(config)
        else:
            fields = _fields_from_dream(config)
        vocab = fields["vocab_size"]
        fields["padded_vocab_size"] = (
            padded_vocab if padded_vocab is not None else padded_vocab_size(vocab, make_vocab_size_divisible_by, tp)
        )
        return ModelDims(family=family, **fields)
    except ConversionError as exc:
        if source is None:
            raise
        raise ConversionError(f"{source}: {exc}", tensor=exc.tensor, expected=exc.expected, hint=exc.hint) from None


def _transformers_config_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError]
    try:
        from huggingface_hub.errors import StrictDataclassError

        errors.append(StrictDataclassError)
    except ImportError:  # older huggingface_hub: transformers raises the built-in types above
        pass
    return tuple(errors)


#: What ``AutoConfig.for_model`` raises for values it refuses (after :func:`check_hf_config`).
_TRANSFORMERS_CONFIG_ERRORS = _transformers_config_errors()


def _fields_from_transformers(family: str, config: Mapping[str, Any]) -> dict[str, Any]:
    from transformers import AutoConfig

    cfg_dict = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version")}
    try:
        cfg = AutoConfig.for_model(config["model_type"], **cfg_dict)
    except _TRANSFORMERS_CONFIG_ERRORS as exc:
        detail = " ".join(str(exc).split())
        raise _fail("config.json", f"transformers refuses it as a {family} config: {detail}. Fix: restore "
                    "config.json from the original checkpoint", "a config transformers loads") from None
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if getattr(cfg, "mlp_bias", False):
        raise _fail("mlp_bias", "mlp_bias=True is not supported (megatron add_bias_linear)", False)
    if family in ("llama", "qwen3", "qwen3_moe") and getattr(cfg, "attention_bias", False):
        raise _fail(
            "attention_bias",
            f"{family} with attention_bias=True has an o_proj bias; megatron add_qkv_bias covers q/k/v only",
            False,
        )
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise _fail("hidden_act", f"hidden_act={cfg.hidden_act!r} is not supported", "silu")
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    theta, factor = _rope_from_parameters(rope, getattr(cfg, "rope_theta", None))
    fields: dict[str, Any] = dict(
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.intermediate_size,
        num_attention_heads=heads,
        num_query_groups=getattr(cfg, "num_key_value_heads", None) or heads,
        kv_channels=head_dim,
        vocab_size=cfg.vocab_size,
        tied=bool(cfg.tie_word_embeddings),
        qk_layernorm=family in ("qwen3", "qwen3_moe"),
        add_qkv_bias=family == "qwen2",
        rotary_base=theta,
        rope_scaling_factor=factor,
        norm_epsilon=float(cfg.rms_norm_eps),
        max_position_embeddings=int(cfg.max_position_embeddings),
    )
    if family == "qwen3_moe":
        if cfg.decoder_sparse_step != 1 or list(cfg.mlp_only_layers or []):
            raise _fail(
                "mlp_only_layers",
                f"qwen3_moe with dense layers (decoder_sparse_step={cfg.decoder_sparse_step}, "
                f"mlp_only_layers={cfg.mlp_only_layers}) is not supported; every layer must be MoE",
                "decoder_sparse_step=1, mlp_only_layers=[]",
            )
        fields.update(
            num_experts=cfg.num_experts,
            moe_ffn_hidden_size=cfg.moe_intermediate_size,
            moe_router_topk=cfg.num_experts_per_tok,
            moe_router_norm_topk=bool(cfg.norm_topk_prob),
        )
    elif family == "mixtral":
        fields.update(
            num_experts=cfg.num_local_experts,
            moe_ffn_hidden_size=cfg.intermediate_size,
            moe_router_topk=cfg.num_experts_per_tok,
            moe_router_norm_topk=True,
        )
    return fields


def _fields_from_llada(config: Mapping[str, Any]) -> dict[str, Any]:
    must = {
        "block_type": "llama",
        "activation_type": "silu",
        "include_bias": False,
        "alibi": False,
        "rope": True,
        "attention_layer_norm": False,
        "input_emb_norm": False,
        "scale_logits": False,
        "layer_norm_type": "rms",
    }
    for key, value in must.items():
        if key in config and config[key] != value:
            raise _fail(key, f"LLaDA config {key}={config[key]!r} is not supported", value)
    heads = int(config["n_heads"])
    d_model = int(config["d_model"])
    mlp = config.get("mlp_hidden_size") or int(config.get("mlp_ratio", 4)) * d_model
    return dict(
        num_layers=int(config["n_layers"]),
        hidden_size=d_model,
        ffn_hidden_size=int(mlp),
        num_attention_heads=heads,
        num_query_groups=int(config.get("n_kv_heads") or heads),
        kv_channels=d_model // heads,
        vocab_size=int(config.get("embedding_size") or config["vocab_size"]),
        tied=bool(config.get("weight_tying", False)),
        add_qkv_bias=bool(config.get("include_qkv_bias", False)),
        rotary_base=float(config.get("rope_theta", 10000.0)),
        norm_epsilon=float(config.get("rms_norm_eps", 1e-5)),
        max_position_embeddings=int(config.get("max_sequence_length", 4096)),
    )


def _fields_from_dream(config: Mapping[str, Any]) -> dict[str, Any]:
    if config.get("rope_scaling"):
        raise _fail("rope_scaling", f"Dream rope_scaling={config['rope_scaling']!r} is not supported", None)
    if config.get("hidden_act", "silu") != "silu":
        raise _fail("hidden_act", f"hidden_act={config['hidden_act']!r} is not supported", "silu")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    rope = config.get("rope_parameters") or {}
    return dict(
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(config["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=int(config.get("num_key_value_heads") or heads),
        kv_channels=int(config.get("head_dim") or hidden // heads),
        vocab_size=int(config["vocab_size"]),
        tied=bool(config.get("tie_word_embeddings", False)),
        add_qkv_bias=True,
        rotary_base=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
        norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
    )


def hf_config_from_dims(dims: ModelDims, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A ``config.json`` dict for ``dims``.

    For families in ``transformers`` the dict comes from the family's config class
    (``AutoConfig.for_model(...).to_dict()``), so ``AutoModelForCausalLM.from_pretrained``
    loads it. LLaDA and Dream (remote-code models) get their own key sets. ``base`` (for
    example the source checkpoint's config) supplies everything the dimensions do not
    (token ids, ``auto_map``, ...); the dimensions always win.

    Raises:
        ConversionError: ``base`` belongs to another family, or ``transformers`` refuses its values.
    """
    base = dict(base or {})
    if base and detect_family(base) != dims.family:
        raise ConversionError(
            f"base config is {detect_family(base)!r}, dims are {dims.family!r}",
            tensor="model_type",
            expected=dims.family,
        )
    for key in ("transformers_version", "_name_or_path", "model_type"):
        base.pop(key, None)
    base["architectures"] = base.get("architectures") or [ARCHITECTURES[dims.family]]
    if dims.family == "llada":
        base.update(
            model_type="llada",
            d_model=dims.hidden_size,
            n_layers=dims.num_layers,
            n_heads=dims.num_attention_heads,
            n_kv_heads=dims.num_query_groups,
            mlp_hidden_size=dims.ffn_hidden_size,
            vocab_size=min(int(base.get("vocab_size", dims.vocab_size)), dims.vocab_size),
            embedding_size=dims.vocab_size,
            weight_tying=dims.tied,
            include_bias=False,
            include_qkv_bias=dims.add_qkv_bias,
            rope=True,
            rope_theta=dims.rotary_base,
            rms_norm_eps=dims.norm_epsilon,
            max_sequence_length=dims.max_position_embeddings,
            block_type="llama",
            activation_type="silu",
            layer_norm_type="rms",
        )
        return base
    if dims.family == "dream":
        base.update(
            model_type="Dream",
            hidden_size=dims.hidden_size,
            num_hidden_layers=dims.num_layers,
            num_attention_heads=dims.num_attention_heads,
            num_key_value_heads=dims.num_query_groups,
            intermediate_size=dims.ffn_hidden_size,
            vocab_size=dims.vocab_size,
            tie_word_embeddings=dims.tied,
            rope_theta=dims.rotary_base,
            rms_norm_eps=dims.norm_epsilon,
            max_position_embeddings=dims.max_position_embeddings,
            hidden_act="silu",
        )
        return base
    from transformers import AutoConfig

    for key in ("rope_parameters", "rope_scaling", "rope_theta"):
        base.pop(key, None)
    base.update(
        vocab_size=dims.vocab_size,
        hidden_size=dims.hidden_size,
        intermediate_size=dims.moe_ffn_hidden_size if dims.family == "mixtral" else dims.ffn_hidden_size,
        num_hidden_layers=dims.num_layers,
        num_attention_heads=dims.num_attention_heads,
        num_key_value_heads=dims.num_query_groups,
        head_dim=dims.kv_channels,
        tie_word_embeddings=dims.tied,
        rms_norm_eps=dims.norm_epsilon,
        max_position_embeddings=dims.max_position_embeddings,
        rope_theta=dims.rotary_base,
    )
    if dims.rope_scaling_factor is not None:
        base["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": dims.rope_scaling_factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    if dims.family == "qwen3_moe":
        base.update(
            num_experts=dims.num_experts,
            moe_intermediate_size=dims.moe_ffn_hidden_size,
            num_experts_per_tok=dims.moe_router_topk,
            norm_topk_prob=dims.moe_router_norm_topk,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    elif dims.family == "mixtral":
        base.update(num_local_experts=dims.num_experts, num_experts_per_tok=dims.moe_router_topk)
    model_type = {"qwen3_moe": "qwen3_moe"}.get(dims.family, dims.family)
    try:
        return AutoConfig.for_model(model_type, **base).to_dict()
    except _TRANSFORMERS_CONFIG_ERRORS as exc:
        detail = " ".join(str(exc).split())
        raise _fail("hf_config", f"the base config.json does not load as a {dims.family} config: {detail}",
                    "a config transformers loads") from None
