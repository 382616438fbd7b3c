"""The converter's public API: ``hf_to_mcore``, ``mcore_to_hf``, ``verify``.

Everything runs on CPU in one process; importing this module needs neither CUDA nor an
initialised ``torch.distributed``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dlmspec.backends.convert import hf_io, mcore_io, mcore_model
from dlmspec.backends.convert._atomic import check_separate
from dlmspec.backends.convert.checks import check_hf_checkpoint
from dlmspec.backends.convert.dims import ModelDims
from dlmspec.backends.convert.errors import ConversionError
from dlmspec.backends.convert.hf_config import dims_from_hf_config, hf_config_from_dims
from dlmspec.backends.convert.objective import checkpoint_objective, diffusion_hf_config, resolve_objective
from dlmspec.backends.convert.state_dict import hf_to_mcore_state_dict, mcore_to_hf_state_dict

PathLike = str | os.PathLike[str]

#: The tokenizer files of a Hugging Face checkpoint folder (transformers' ``AutoTokenizer`` reads
#: them from the folder): ``hf_to_mcore`` copies those present into the converted folder, where
#: ``dlmspec generate`` / ``eval`` (:mod:`dlmspec.backends.generate.load`) find them. Code files
#: (``tokenization_*.py``) are never copied.
TOKENIZER_NAMES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja", "chat_template.json")
#: Patterns of SentencePiece / tiktoken model files copied as well (``tokenizer.model``, ``spiece.model``).
TOKENIZER_PATTERNS = ("*.model", "*.tiktoken")
#: Largest tokenizer file copied: the largest published ones are tens of MiB.
MAX_TOKENIZER_BYTES = 512 << 20


def tokenizer_files(src: PathLike) -> list[Path]:
    """The tokenizer files in the folder ``src`` (:data:`TOKENIZER_NAMES`, :data:`TOKENIZER_PATTERNS`),
    sorted by name; a symbolic link or anything but a regular file is left out."""
    folder = Path(src)
    if not folder.is_dir():
        return []
    found = {folder / name for name in TOKENIZER_NAMES}
    for pattern in TOKENIZER_PATTERNS:
        found.update(folder.glob(pattern))
    return sorted((p for p in found if p.is_file() and not p.is_symlink()), key=lambda p: p.name)


def read_tokenizer_files(src: PathLike) -> dict[str, bytes]:
    """The tokenizer files of ``src`` (:func:`tokenizer_files`): name -> bytes, read before anything
    is written, so a file that cannot be read stops the conversion before it starts.

    Raises:
        ConversionError: a tokenizer file that is not a regular file, or larger than
            :data:`MAX_TOKENIZER_BYTES`, named.
    """
    from dlmspec.files import FileRefused, read_bytes

    out = {}
    for path in tokenizer_files(src):
        try:
            out[path.name] = read_bytes(path, limit=MAX_TOKENIZER_BYTES, what="tokenizer file")
        except FileRefused as exc:
            raise ConversionError(f"{path}: {exc.why}", tensor=path.name, hint=exc.hint) from None
    return out


def write_tokenizer_files(files: dict[str, bytes], dst: PathLike) -> list[str]:
    """Write ``files`` (:func:`read_tokenizer_files`) into the folder ``dst``, each atomically
    (:func:`dlmspec.files.write_atomic`: never through a link at the target); returns the names."""
    from dlmspec.files import write_atomic

    for name, data in files.items():
        write_atomic(Path(dst) / name, data)
    return sorted(files)


def _dims_for(config: dict[str, Any], dims: ModelDims | None, *, make_vocab_size_divisible_by: int, tp: int,
              padded_vocab: int | None, source: str | None = None) -> ModelDims:
    derived = dims_from_hf_config(
        config, make_vocab_size_divisible_by=make_vocab_size_divisible_by, tp=tp, padded_vocab=padded_vocab,
        source=source,
    )
    if dims is None:
        return derived
    if dims.family != derived.family:
        raise ConversionError(
            f"dims.family={dims.family!r} but the checkpoint config is {derived.family!r}",
            tensor="family",
            expected=derived.family,
        )
    return dims


def hf_to_mcore(
    src: PathLike,
    dst: PathLike,
    *,
    dims: ModelDims | None = None,
    make_vocab_size_divisible_by: int = 128,
    tp: int = 1,
    padded_vocab: int | None = None,
    dtype: torch.dtype | None = None,
    spec: str = "local",
    layer_layout: str = "stacked",
    overwrite: bool = False,
) -> ModelDims:
    """Convert a Hugging Face safetensors checkpoint into a megatron-core dist checkpoint.

    Args:
        src: HF checkpoint directory (``config.json`` + ``model.safetensors`` or shards with
            ``model.safetensors.index.json``).
        dst: dist-checkpoint directory to create (written to a temporary sibling, then renamed).
        dims: target dimensions; default: derived from ``src/config.json``. When given, the
            checkpoint's tensors are checked against them (a shape disagreeing with the target
            config raises).
        make_vocab_size_divisible_by: vocabulary padding multiple (with ``tp``) when ``dims``
            is derived.
        tp: the tensor-parallel size padding is computed for (the checkpoint itself loads
            at any TP).
        padded_vocab: explicit padded vocabulary size when ``dims`` is derived.
        dtype: cast floating-point tensors (default: keep the stored dtype).
        spec: layer-norm naming used internally (``"local"``/``"te"``); the files are the same.
        layer_layout: ``"stacked"`` (megatron default) or ``"per_layer"``.
        overwrite: write into an existing ``dst``, replacing only the files convert writes.

    Returns:
        The :class:`ModelDims` written into the checkpoint's sidecar. The tokenizer files of
        ``src`` (:func:`tokenizer_files`) are copied beside it, so ``dlmspec generate`` on ``dst``
        finds the tokenizer (with ``overwrite``, over those already there).

    Raises:
        ConversionError: ``dst`` is, holds or sits inside ``src``; a tokenizer file that is not
            a regular file or is too large; unknown family, a config
            value of the wrong type or range, unsupported config feature, a corrupt safetensors
            file, a missing/unexpected tensor or a tensor whose shape disagrees with the target
            config, a weight that is not floating point or holds NaN/Inf (named), ``dst`` exists.
        Interrupted: SIGTERM while writing (the temporary folder is removed).
    """
    check_separate(src, dst)
    config = hf_io.read_hf_config(src)
    dims = _dims_for(config, dims, make_vocab_size_divisible_by=make_vocab_size_divisible_by, tp=tp,
                     padded_vocab=padded_vocab, source=str(Path(src) / hf_io.CONFIG_NAME))
    tokenizer = read_tokenizer_files(src)
    reader = hf_io.SafetensorsReader(src)
    state = hf_to_mcore_state_dict(reader, dims, spec=spec)
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    mcore_io.save_mcore_checkpoint(dst, state, dims, spec=spec, layer_layout=layer_layout, hf_config=config,
                                   overwrite=overwrite)
    write_tokenizer_files(tokenizer, dst)
    return dims


def mcore_to_hf(
    src: PathLike,
    dst: PathLike,
    *,
    dims: ModelDims | None = None,
    hf_config: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = hf_io.DEFAULT_MAX_SHARD_BYTES,
    overwrite: bool = False,
    objective: str | None = None,
    mask_token_id: int | None = None,
    block_size: int | None = None,
) -> ModelDims:
    """Convert a megatron-core dist checkpoint into a Hugging Face safetensors checkpoint.

    A masked-diffusion LM is written with ``"is_causal": false`` and a ``"dlmspec"`` record in
    ``config.json`` (:func:`~dlmspec.backends.convert.objective.diffusion_hf_config`), so stock
    ``transformers`` runs it with bidirectional attention; an AR model is written causal.

    Args:
        src: dist-checkpoint directory (or a Megatron-LM save dir with
            ``latest_checkpointed_iteration.txt``).
        dst: HF directory to create (temporary sibling, then renamed).
        dims: model dimensions; default: the sidecar ``hf_to_mcore`` wrote.
        hf_config: ``config.json`` to start from (token ids, ``auto_map``...); default: the
            one remembered in the sidecar. Dimensions always come from ``dims``.
        dtype: cast floating-point tensors (default: keep the stored dtype).
        max_shard_bytes: safetensors shard size limit.
        overwrite: write into an existing ``dst``, replacing only the files convert writes.
        objective: ``"mdm"`` or ``"ar"``; default: the checkpoint's
            (:func:`~dlmspec.backends.convert.objective.checkpoint_objective`: a training
            checkpoint's ``dlmspec.json`` record, else the remembered Hugging Face config, else AR).
        mask_token_id: the diffusion LM's mask token, recorded in ``config.json`` (default: the
            checkpoint's record); implies ``objective = "mdm"`` when that is not given.
        block_size: a block-diffusion LM's block (``objective = "bd3lm"``; default: the
            checkpoint's record), written into ``config.json``'s ``dlmspec`` record with the input
            and mask convention (docs/block-diffusion.md, "Hugging Face export").

    Returns:
        The :class:`ModelDims` used.

    Raises:
        ConversionError: ``dst`` is, holds or sits inside ``src``; no dims available, a corrupt
            sidecar or truncated checkpoint file, a tensor missing from the checkpoint or shaped
            unlike ``dims``, a weight that is not floating point or holds NaN/Inf (named),
            ``dst`` exists; an unknown ``objective``, a mask token for an AR model, a
            block-causal diffusion LM (no Hugging Face flag for it).
        Interrupted: SIGTERM while writing (the temporary folder is removed).
    """
    check_separate(src, dst)
    check_separate(mcore_io.resolve_checkpoint_dir(src), dst)
    sidecar = mcore_io.read_sidecar(src) or {}
    found = checkpoint_objective(mcore_io.resolve_checkpoint_dir(src), sidecar)
    chosen = resolve_objective(found, objective, mask_token_id, block_size)
    state, dims = mcore_io.load_mcore_checkpoint(src, dims)
    hf_state = mcore_to_hf_state_dict(state, dims)
    base = hf_config if hf_config is not None else sidecar.get("hf_config") or None
    config = diffusion_hf_config(hf_config_from_dims(dims, base), chosen, dims.family)
    hf_io.write_hf_checkpoint(dst, hf_state, config, dtype=dtype, max_shard_bytes=max_shard_bytes,
                              overwrite=overwrite)
    return dims


def megatron_checkpoint_logits(
    mcore_path: PathLike, tokens: torch.Tensor, *, dims: ModelDims | None = None, causal: bool = True
) -> torch.Tensor:
    """Logits of megatron's GPTModel (local spec, fp32, CPU, world size 1) loaded from a dist
    checkpoint, with causal attention (``causal=False``: bidirectional, a diffusion LM's).

    Args:
        mcore_path: dist-checkpoint directory.
        tokens: ``[batch, seq]`` int64 token ids.
        dims: dimensions (default: the checkpoint's sidecar).
        causal: causal (default) or bidirectional attention.

    Returns:
        ``[batch, seq, vocab_size]`` fp32 logits (padding columns dropped).

    Raises:
        ConversionError: MoE models (:data:`dlmspec.backends.convert.mcore_model.MOE_CPU_REASON`),
            checkpoints that disagree with ``dims``.
    """
    from megatron.core import parallel_state

    state, dims = mcore_io.load_mcore_checkpoint(mcore_path, dims)
    if dims.is_moe:
        raise ConversionError(mcore_model.MOE_CPU_REASON, tensor="mlp.router.weight", expected="a CUDA device")
    batch, seq_len = tokens.shape
    with mcore_io.process_group():
        own_mp = not parallel_state.model_parallel_is_initialized()
        if own_mp:
            parallel_state.initialize_model_parallel(1, 1)
        try:
            model = mcore_model.build_gpt_model(dims, params_dtype=torch.float32, cpu=True)
            mcore_model.load_into_model(model, state)
            mcore_model.enable_cpu_forward(model, batch, seq_len)
            return mcore_model.megatron_logits(model, tokens, causal=causal)[..., : dims.vocab_size].float()
        finally:
            mcore_model.disable_cpu_forward()
            if own_mp:
                parallel_state.destroy_model_parallel()


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of :func:`verify`.

    Attributes:
        family: model family.
        max_abs_diff: ``max |hf_logits - megatron_logits|`` over ``[batch, seq, vocab]``.
        atol: tolerance used.
        ok: ``max_abs_diff <= atol``.
        reference: what produced the Hugging Face logits (class name).
        tokens: the ``[batch, seq]`` token ids used.
        attention: ``"causal"`` or ``"bidirectional"`` (a diffusion LM exported with
            ``is_causal: false``), the attention both models ran with.
    """

    family: str
    max_abs_diff: float
    atol: float
    ok: bool
    reference: str
    tokens: list[list[int]]
    attention: str = "causal"


#: LLaDA and Dream are remote-code models; their computation (with causal attention) is that
#: of these transformers classes, which serve as the logit reference.
_STAND_INS = {"llada": "llama", "dream": "qwen2"}


def hf_reference_model(hf_path: PathLike, dims: ModelDims) -> torch.nn.Module:
    """The fp32 ``transformers`` model whose logits :func:`verify` compares against.

    Families in ``transformers`` load with ``AutoModelForCausalLM.from_pretrained``. LLaDA
    loads into ``LlamaForCausalLM`` and Dream into ``Qwen2ForCausalLM`` (same math with causal
    attention; their own bidirectional attention is a runtime choice, not a weight property).

    Raises:
        ConversionError: the checkpoint does not match ``dims``.
    """
    from transformers import AutoModelForCausalLM

    if dims.family not in _STAND_INS:
        return AutoModelForCausalLM.from_pretrained(str(hf_path), dtype=torch.float32, trust_remote_code=False).eval()
    stand_in = dataclasses.replace(dims, family=_STAND_INS[dims.family], qk_layernorm=False)
    mcore_state = hf_to_mcore_state_dict(hf_io.SafetensorsReader(hf_path), dims)
    state = mcore_to_hf_state_dict(mcore_state, stand_in)
    config = hf_config_from_dims(stand_in)
    from transformers import AutoConfig

    model_type = config.pop("model_type")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **config), dtype=torch.float32)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    missing = [k for k in missing if not (dims.tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ConversionError(f"stand-in model mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}",
                              tensor=(missing or unexpected)[0], expected=None)
    if dims.tied:
        model.tie_weights()
    return model.eval()


def verify(
    hf_path: PathLike,
    mcore_path: PathLike,
    *,
    dims: ModelDims | None = None,
    batch: int = 2,
    seq_len: int = 16,
    seed: int = 0,
    atol: float = 1e-4,
) -> VerifyResult:
    """Compare logits of the HF checkpoint and the megatron checkpoint on the same tokens.

    Builds megatron's GPTModel (local spec, fp32, CPU, world size 1) with the checkpoint's
    weights and the fp32 HF reference (:func:`hf_reference_model`), feeds both the same
    random tokens and compares logits over the real vocabulary. Attention is causal, or
    bidirectional in both when the HF config says ``"is_causal": false`` (a diffusion LM's
    export, which ``transformers`` runs bidirectionally); LLaDA / Dream are compared causally
    through their stand-ins (attention is not a property of the weights).

    Args:
        hf_path: HF checkpoint directory.
        mcore_path: dist-checkpoint directory.
        dims: dimensions (default: the megatron checkpoint's sidecar, else the HF config).
        batch: sequences.
        seq_len: tokens per sequence.
        seed: token RNG seed.
        atol: tolerance on the max absolute logit difference.

    Returns:
        :class:`VerifyResult` (``ok`` tells whether the difference is within ``atol``).

    Raises:
        ConversionError: MoE models (megatron's router cannot run on CPU; use
            ``bench/convert/verify_gpu.py``), checkpoints that disagree with ``dims`` or with
            their own ``config.json``, corrupt files or config values (named).
    """
    reader = hf_io.SafetensorsReader(hf_path)
    hf_config = hf_io.read_hf_config(hf_path)
    hf_dims = dims_from_hf_config(hf_config, source=str(Path(hf_path) / hf_io.CONFIG_NAME))
    check_hf_checkpoint(reader, hf_dims)  # the reference model is built from this config
    if dims is None:
        sidecar = mcore_io.read_sidecar(mcore_path)
        dims = mcore_io.dims_from_sidecar(sidecar, mcore_path) if sidecar else hf_dims
    if dims.is_moe:
        raise ConversionError(mcore_model.MOE_CPU_REASON, tensor="mlp.router.weight", expected="a CUDA device")
    reference = hf_reference_model(hf_path, dims)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, dims.vocab_size, (batch, seq_len), generator=gen)
    with torch.no_grad():
        hf_logits = reference(input_ids=tokens).logits.float()
    causal = dims.family in _STAND_INS or hf_config.get("is_causal") is not False
    mc_logits = megatron_checkpoint_logits(mcore_path, tokens, dims=dims, causal=causal)
    diff = float((hf_logits - mc_logits).abs().max())
    return VerifyResult(
        family=dims.family,
        max_abs_diff=diff,
        atol=atol,
        ok=diff <= atol,
        reference=type(reference).__name__,
        tokens=tokens.tolist(),
        attention="causal" if causal else "bidirectional",
    )
