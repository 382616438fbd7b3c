"""Load a trained model for generation and scoring: :func:`load_model` -> :class:`LoadedModel`.

What :func:`load_model` accepts (``path``), looked at in this order:

1. a checkpoint the dlmspec runtime wrote (``iter_0000300/`` holding ``dlmspec.json`` with the spec
   record, :mod:`dlmspec.backends.megatron.spec_record`), a save folder with its ``latest`` tracker
   (``runs/demo-dlm/checkpoints``), or a run folder holding ``checkpoints/latest``
   (``runs/demo-dlm``): the ``GPTModel`` is built the way the runtime builds it
   (:func:`dlmspec.backends.megatron.layers.build_layer_spec` / ``build_model``, every value from
   the record) and its weights are read with ``dist_checkpointing``
   (:func:`dlmspec.backends.megatron.init_from.load_model_weights`, any TP/PP layout on disk);
2. a Hugging Face checkpoint (``config.json`` + ``*.safetensors``) or a megatron-core checkpoint
   written by ``dlmspec convert hf-to-mcore`` (``dlmspec_convert.json``): the weights go through
   :mod:`dlmspec.backends.convert` into the same runtime ``GPTModel`` (local layers).

The result is stable API (the lm-eval wrapper and the ``generate`` / ``eval`` commands call it):
``logits_fn`` (:class:`~dlmspec.backends.generate.sampler.LogitsFn`), ``kind`` (``"mdm"`` /
``"ar"``), the token ids, the tokenizer, and the spec record. Megatron-core runs on a CUDA device
or, for the tests, on CPU (the three CUDA-only spots of megatron-core 0.16.1 patched as
:func:`dlmspec.backends.convert.mcore_model.enable_cpu_forward` does; dense models only). Tensor
parallelism: run under ``torchrun`` with ``tensor_model_parallel_size`` processes; every rank
runs the sampler with the same seed and :func:`dlmspec.backends.generate.models.gpt_logits_fn`
gathers the vocabulary-parallel logits (tested at TP = 2 on CPU, gloo). AR models decode
with megatron-core's KV cache (:meth:`LoadedModel.ar_step_fn`,
:class:`~dlmspec.backends.generate.models.GPTKVCacheStep`) where the model's layers allow it
(the local layer spec), else with full recompute (``kv_cache_fallback`` says why). docs/generate.md.

Finding the checkpoint and the refusals (:class:`LoadError`) are in
:mod:`dlmspec.backends.generate.checkpoint`; the ``TransformerConfig`` of a record is
:func:`dlmspec.backends.model_config.transformer_config_from_record`, the one ``convert`` builds.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional

import torch

from dlmspec import objectives
from dlmspec.objectives.schedules import LINEAR, MaskingSchedule
from dlmspec.backends.generate.checkpoint import (  # noqa: F401 - LoadError, find_checkpoint: part of this module's API
    MAX_RECORD_BYTES,
    METADATA_FILENAME,
    OUT_OF_MEMORY_FIX,
    LoadError,
    _read_json,
    _safetensors_errors,
    checkpoint_read_errors,
    describe_read_error,
    find_checkpoint,
    is_out_of_memory,
)

#: Hugging Face families trained as masked-diffusion LMs (their ``kind`` is ``"mdm"``).
MDM_FAMILIES = ("llada", "dream")


@dataclass
class LoadedModel:
    """A model ready for :func:`~dlmspec.backends.generate.sampler.generate` and the likelihoods.

    Attributes:
        logits_fn: ``(tokens [B, L], attention_mask [B, L] bool or None) -> logits [B, L, V]``
            (float32, ``V`` the tokenizer's vocabulary ``model.vocab_size``: the columns of the
            padded vocabulary, and a mask token placed there, are dropped).
        kind: ``"mdm"`` (bidirectional, masked diffusion) or ``"ar"`` (causal).
        mask_token_id: the mask token (MDM; ``None`` for AR).
        eos_token_id: end of sequence / document (the run's ``data.eod_id``; ``None`` if unknown).
        pad_token_id: the id written at left padding (``eos_token_id``, else 0; hidden from attention).
        vocab_size: ``V``, the tokenizer's vocabulary (the logits' last dimension).
        tokenizer: an object with ``tokenize(text) -> list[int]`` and ``detokenize(ids) -> str``
            (:func:`dlmspec.tokenizers.build_tokenizer`), or ``None`` when the run's tokenizer
            files cannot be found (then ``tokenizer_error`` says why).
        tokenizer_error: why ``tokenizer`` is ``None``.
        record: the spec record (``{"model.hidden_size": 768, ...}``) the checkpoint holds, or the
            values derived from a converted checkpoint.
        generate_table: the ``[generate]`` table of the checkpoint's ``spec.lock.toml``, if any.
        source: ``"dlmspec"`` (a runtime checkpoint), ``"mcore"`` (a converted one) or ``"hf"``.
        path: the checkpoint folder loaded.
        iteration: the training step of the checkpoint (``None`` when not recorded).
        device: where the model runs.
        model: the ``GPTModel`` (eval mode).
        max_length: the longest sequence the model takes (``max_position_embeddings``).
        chat_tokens: ``{id: text}`` of the chat special tokens an SFT run's dataset record gave
            ids beyond the tokenizer's vocabulary (``<|im_start|>`` = 50258 with GPT-2); the
            logits keep their columns (so a tuned model can end its turn), ``V`` grows to cover
            them, and every other column past the tokenizer's vocabulary (the mask) is ``-inf``.
        noise_schedule: the masking schedule the model was trained with (:func:`record_schedule`;
            linear for AR and for records without one): hand it to ``generate(noise_schedule=...)``
            and ``elbo_nll(schedule=...)``.
        kv_cache_fallback: why :meth:`ar_step_fn` gives no KV cache (a diffusion LM, Transformer
            Engine layers, ...: :func:`~dlmspec.backends.generate.models.kv_cache_unsupported`), or
            ``None`` when it gives one.
    """

    logits_fn: Callable[..., torch.Tensor]
    kind: str
    mask_token_id: Optional[int]
    eos_token_id: Optional[int]
    pad_token_id: int
    vocab_size: int
    tokenizer: Any
    tokenizer_error: Optional[str]
    record: Dict[str, Any]
    generate_table: Optional[Dict[str, Any]]
    source: str
    path: str
    iteration: Optional[int]
    device: torch.device
    model: Any
    max_length: Optional[int] = None
    chat_tokens: Dict[int, str] = field(default_factory=dict)
    kv_cache_fallback: Optional[str] = None
    noise_schedule: MaskingSchedule = LINEAR
    _columns: Optional[Callable[[torch.Tensor], torch.Tensor]] = field(default=None, repr=False)
    _cleanup: List[Callable[[], None]] = field(default_factory=list, repr=False)

    def ar_step_fn(self, max_new_tokens: int) -> Optional[Callable[..., torch.Tensor]]:
        """A fresh KV-cache ``ARStepFn`` for :func:`~dlmspec.backends.generate.sampler.generate_ar`
        (:class:`~dlmspec.backends.generate.models.GPTKVCacheStep` over the loaded ``GPTModel``, its
        logits cut to :attr:`vocab_size` columns as :attr:`logits_fn`'s are), or ``None`` when the
        model cannot be decoded with one (:attr:`kv_cache_fallback` says why; decode with
        ``full_recompute(logits_fn)``, ``generate_ar``'s default).

        Args:
            max_new_tokens: tokens decoded after the prompt (``gen_length``): the cache's room.
        """
        if self.kv_cache_fallback is not None:
            return None
        from dlmspec.backends.generate.models import GPTKVCacheStep

        return GPTKVCacheStep(self.model, max_new_tokens=max_new_tokens, columns=self._columns)

    def encode(self, text: str) -> List[int]:
        """Token ids of ``text`` (no BOS/EOS added).

        Raises:
            LoadError: the model has no tokenizer (``tokenizer_error`` says why).
        """
        if self.tokenizer is None:
            raise LoadError(self.path, f"no tokenizer ({self.tokenizer_error})",
                            "run from the folder the training ran in, so the tokenizer files it names are found")
        return list(self.tokenizer.tokenize(text))

    def decode(self, ids: List[int]) -> str:
        """Text of ``ids`` (``str(ids)`` without a tokenizer). Chat tokens an SFT dataset gave ids
        beyond the tokenizer's vocabulary (:attr:`chat_tokens`) decode to their text; any other id
        the tokenizer does not have decodes to ``<id:N>``."""
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        limit = int(self.record.get("model.vocab_size") or self.vocab_size)
        out: List[str] = []
        run: List[int] = []
        for i in (int(x) for x in ids):
            if i < limit:
                run.append(i)
                continue
            if run:
                out.append(self.tokenizer.detokenize(run))
                run = []
            out.append(self.chat_tokens.get(i, f"<id:{i}>"))
        if run:
            out.append(self.tokenizer.detokenize(run))
        return "".join(out)

    def close(self) -> None:
        """Release what :func:`load_model` set up (the process group and model-parallel state it
        created, the CPU patches); the model must not be called afterwards."""
        while self._cleanup:
            self._cleanup.pop()()


# --------------------------------------------------------------------------- megatron-core set-up


def _pick_device(device: Any) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LoadError(str(device), "no CUDA device is visible", "use device 'cpu' (tiny models) or run on a GPU machine")
    return dev


def _setup_parallel(tp: int, device: torch.device, cleanup: List[Callable[[], None]]) -> None:
    """A process group and megatron-core's model-parallel state (created only if absent)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if device.type == "cuda":
        torch.cuda.set_device(device.index if device.index is not None else torch.cuda.current_device())
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        else:
            dist.init_process_group("gloo" if device.type == "cpu" else "nccl", store=dist.HashStore(), rank=0,
                                    world_size=1)
        cleanup.append(dist.destroy_process_group)
    world = dist.get_world_size()
    if world % tp:
        raise LoadError("tensor_model_parallel_size", f"{tp} does not divide the {world} processes",
                        f"start {tp} processes (torchrun --nproc-per-node {tp})")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tp, 1)
        cleanup.append(parallel_state.destroy_model_parallel)
    elif parallel_state.get_tensor_model_parallel_world_size() != tp:
        raise LoadError("tensor_model_parallel_size", "megatron-core's model-parallel state is set up for TP = "
                        f"{parallel_state.get_tensor_model_parallel_world_size()}", f"load with TP = {tp}")


def _cpu_patches(cleanup: List[Callable[[], None]]) -> None:
    """megatron-core 0.16.1 asks ``torch.cuda.current_device()`` (RoPE, buffers) and calls
    ``torch.cuda.synchronize()`` (checkpoint loading): on a CPU-only torch both become no-ops
    while the model is loaded (undone by :meth:`LoadedModel.close`)."""
    if torch.cuda.is_available():
        return
    saved = (torch.cuda.current_device, torch.cuda.synchronize)
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]

    def undo() -> None:
        torch.cuda.current_device, torch.cuda.synchronize = saved  # type: ignore[assignment]

    cleanup.append(undo)


def _dtype(record: Dict[str, Any], device: torch.device, dtype: Optional[str]) -> str:
    if dtype is not None:
        return dtype
    if device.type == "cpu":
        return "fp32"  # bf16 matmuls on CPU are slow and the tests compare numbers
    return record.get("precision.dtype") or "bf16"


def build_transformer_config(record: Dict[str, Any], *, tp: int, dtype: str, cpu: bool) -> Any:
    """megatron-core's ``TransformerConfig`` from a spec record for inference:
    :func:`dlmspec.backends.model_config.transformer_config_from_record` (no dropout, no fusions
    that need CUDA kernels; MoE tokens dispatched by all-gather).

    Raises:
        LoadError: a record value the loader cannot map (named).
    """
    from dlmspec.backends.model_config import PARAMS_DTYPES, RecordValueError, transformer_config_from_record

    try:
        return transformer_config_from_record(record, tp=tp, params_dtype=PARAMS_DTYPES[dtype], cpu=cpu,
                                              moe_token_dispatcher="allgather")
    except RecordValueError as exc:
        raise LoadError(exc.key, exc.why, exc.fix) from None


_REQUIRED = ("objective.kind", "objective.attention_mask", "model.num_layers", "model.hidden_size",
             "model.ffn_hidden_size", "model.num_attention_heads", "model.num_query_groups", "model.kv_channels",
             "model.normalization", "model.activation", "model.gated_linear_unit", "model.add_bias_linear",
             "model.add_qkv_bias", "model.qk_layernorm", "model.padded_vocab_size", "model.vocab_size")


#: Record keys that must be whole numbers >= 1 (sizes), and their largest sane value: a record
#: edited to ``hidden_size = 10**9`` is refused before a tensor is allocated.
_SIZES = {"model.num_layers": 1 << 10, "model.hidden_size": 1 << 17, "model.ffn_hidden_size": 1 << 19,
          "model.num_attention_heads": 1 << 12, "model.num_query_groups": 1 << 12, "model.kv_channels": 1 << 12,
          "model.padded_vocab_size": 1 << 24, "model.vocab_size": 1 << 24, "model.max_position_embeddings": 1 << 24}


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_record(where: str, record: Dict[str, Any]) -> None:
    """Refuse a spec record whose values cannot describe a model: the kind, the sizes (whole
    numbers in ``1 .. _SIZES[key]``; ``max_position_embeddings`` may be absent), the vocabulary
    (``vocab_size <= padded_vocab_size``) and the token ids (``objective.mask_token_id`` of a
    diffusion LM, ``data.eod_id``: whole numbers below ``padded_vocab_size``).

    Raises:
        LoadError: naming ``where`` (the record's file), the key, the value and why.
    """
    fix = "load a checkpoint the dlmspec runtime wrote, with its dlmspec.json unchanged"
    kind = record.get("objective.kind")
    if kind not in objectives.kinds():
        raise LoadError(where, f"objective.kind = {repr(kind)[:40]} is not mdm or ar", fix)
    for key, top in _SIZES.items():
        value = record.get(key)
        if value is None and key == "model.max_position_embeddings":
            continue
        if not _whole(value) or not 1 <= value <= top:
            raise LoadError(where, f"{key} = {repr(value)[:40]} is not a whole number in 1..{top}", fix)
    padded = record["model.padded_vocab_size"]
    if record["model.vocab_size"] > padded:
        raise LoadError(where, f"model.vocab_size = {record['model.vocab_size']} exceeds model.padded_vocab_size = "
                        f"{padded}", fix)
    ids = [("data.eod_id", record.get("data.eod_id"))]
    if objectives.is_diffusion(kind):
        ids.append(("objective.mask_token_id", record.get("objective.mask_token_id")))
    for key, value in ids:
        if value is None and key == "data.eod_id":
            continue
        if not _whole(value) or not 0 <= value < padded:
            raise LoadError(where, f"{key} = {repr(value)[:40]} is not a token id of the model's {padded} embeddings "
                            f"(a whole number in 0..{padded - 1})", fix)
    record_schedule(where, record)


def record_schedule(where: str, record: Dict[str, Any]) -> MaskingSchedule:
    """The masking schedule ``alpha(t)`` a record names (``objective.noise_schedule`` and
    ``..._exponent``, written by the runtime for a schedule other than linear; absent: linear, as
    every record written before schedules), through the objective's registration
    (:mod:`dlmspec.objectives`): the sampler's transfer schedule and the ELBO's ``"time"`` draws
    follow it.

    Raises:
        LoadError: an unknown schedule or a bad exponent, naming ``where``.
    """
    name, exponent = record.get("objective.noise_schedule"), record.get("objective.noise_schedule_exponent")
    settings = SimpleNamespace(noise_schedule=name, noise_schedule_exponent=exponent)
    try:
        return objectives.get(record.get("objective.kind")).schedule(settings)
    except (KeyError, TypeError, ValueError) as exc:
        raise LoadError(where, f"objective.noise_schedule = {repr(name)[:40]}, objective.noise_schedule_exponent = "
                        f"{repr(exponent)[:40]}: {str(exc)[:160]}",
                        "load a checkpoint the dlmspec runtime wrote, with its dlmspec.json unchanged") from None


def _tokenizer(record: Dict[str, Any]) -> tuple[Any, Optional[str]]:
    from dlmspec.tokenizers import TokenizerError, build_tokenizer

    kind = record.get("data.tokenizer.type")
    if not kind:
        return None, "the checkpoint records no [data.tokenizer]"
    try:
        return build_tokenizer(kind, tokenizer_model=record.get("data.tokenizer.model"),
                               vocab_file=record.get("data.tokenizer.vocab_file"),
                               merge_file=record.get("data.tokenizer.merge_file"),
                               vocab_size=record.get("data.tokenizer.vocab_size")), None
    except (TokenizerError, OSError, ImportError) as exc:
        return None, f"{kind}: {exc} (relative paths are relative to {os.getcwd()})"


def _lock_generate_table(folder: str) -> Optional[Dict[str, Any]]:
    """The ``[generate]`` table of the checkpoint's ``spec.lock.toml``; ``None`` when the
    checkpoint has no lock file or the lock no such table.

    Raises:
        LoadError: the lock is not a regular file (a FIFO, a link to a device), larger than
            :data:`MAX_RECORD_BYTES`, not UTF-8, or not TOML (named, with the fix).
    """
    from dlmspec.files import FileRefused, read_toml

    lock = os.path.join(folder, "spec.lock.toml")
    if not os.path.lexists(lock):
        return None
    try:
        data = read_toml(lock, limit=MAX_RECORD_BYTES, what="spec lock")
    except FileRefused as exc:
        raise LoadError(lock, exc.why, f"{exc.hint}: copy the run's spec.lock.toml (`dlmspec compile` writes it) "
                        "into the checkpoint folder, or delete it to generate with the default settings") from None
    table = data.get("generate")
    return dict(table) if isinstance(table, dict) else None


def _finish(model: Any, record: Dict[str, Any], *, source: str, folder: str, iteration: Optional[int],
            device: torch.device, tp: int, cleanup: List[Callable[[], None]], tokenizer: Any = None,
            tokenizer_error: Optional[str] = None, generate_table: Optional[Dict[str, Any]] = None) -> LoadedModel:
    from dlmspec.backends.generate.models import gpt_logits_fn

    kind = record["objective.kind"]
    chat = chat_tokens(record)
    vocab = int(record["model.vocab_size"])
    logits_fn, columns, vocab = _columns(gpt_logits_fn(model, tensor_model_parallel_size=tp), vocab, chat)

    # the tokenizer's vocabulary only: the padded columns (and a mask token placed in the padding, the
    # demo's 50257 of GPT-2's 50257 ids) are never data; the softmax over the rest stays a distribution
    mask = record.get("objective.mask_token_id") if objectives.is_diffusion(kind) else None
    eos = record.get("data.eod_id")
    from dlmspec.backends.generate.models import kv_cache_unsupported

    no_cache = kv_cache_unsupported(model)
    return LoadedModel(
        logits_fn=logits_fn, kind=kind, mask_token_id=mask, eos_token_id=eos,
        pad_token_id=eos if eos is not None else 0, vocab_size=vocab, tokenizer=tokenizer,
        tokenizer_error=tokenizer_error, record=record, generate_table=generate_table, source=source,
        path=folder, iteration=iteration, device=device, model=model,
        max_length=record.get("model.max_position_embeddings"), chat_tokens=chat, kv_cache_fallback=no_cache,
        noise_schedule=record_schedule(folder, record), _columns=columns, _cleanup=cleanup,
    )


def chat_tokens(record: Dict[str, Any]) -> Dict[int, str]:
    """``{id: text}`` of the chat tokens the SFT dataset records (``dlmspec data prepare --sft``,
    the ``"sft"`` section's ``special_tokens``) of the run's training data gave ids beyond the
    vocabulary; ``{}`` for a pre-training run, or when no record is found from the current folder
    (the data paths are the run's, relative to where it was launched)."""
    from dlmspec.data.record import RecordError, read_record

    prefixes: List[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            prefixes.append(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    walk(record.get("data.train"))
    for prefix in prefixes:
        try:
            body = read_record(prefix)
        except (RecordError, OSError):
            continue
        sft = (body or {}).get("sft")
        if isinstance(sft, dict) and isinstance(sft.get("special_tokens"), dict):
            return {int(i): str(t) for t, i in sft["special_tokens"].items()}
    return {}


def logits_columns(base: Callable[..., torch.Tensor], vocab: int, chat: Dict[int, str]
                   ) -> tuple[Callable[..., torch.Tensor], int]:
    """The logits a sampler sees: the tokenizer's ``vocab`` columns, plus the columns up to the
    largest chat-token id when ``chat`` has any, where every added column that is not a chat token
    (the mask token, unused padding) is ``-inf``. Returns ``(logits_fn, V)``."""
    logits_fn, _, width = _columns(base, vocab, chat)
    return logits_fn, width


def _columns(base: Callable[..., torch.Tensor], vocab: int, chat: Dict[int, str]
             ) -> tuple[Callable[..., torch.Tensor], Callable[[torch.Tensor], torch.Tensor], int]:
    """:func:`logits_columns` and the column selection itself (``logits [..., V_padded] -> [..., V]``),
    which the KV-cache step applies to its last-column logits."""
    width = max(vocab, max(chat) + 1) if chat else vocab
    blocked = [i for i in range(vocab, width) if i not in chat]

    blocked_ids: Dict[Any, torch.Tensor] = {}  # device -> LongTensor of ``blocked``, made once (not per step)

    def select(out: torch.Tensor) -> torch.Tensor:
        out = out[..., :width]
        if blocked:
            ids = blocked_ids.get(out.device)
            if ids is None:
                ids = blocked_ids[out.device] = torch.tensor(blocked, dtype=torch.int64, device=out.device)
            out = out.clone().index_fill_(-1, ids, float("-inf"))
        return out

    def logits_fn(tokens: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return select(base(tokens, attention_mask))

    select.width, select.blocked = width, tuple(blocked)  # type: ignore[attr-defined]  # for a vocabulary shard
    if hasattr(base, "block_logits"):  # the block sampler's path (current block's logits, block KV cache)
        logits_fn.block_logits = lambda config: base.block_logits(config, columns=select)  # type: ignore[attr-defined]
    return logits_fn, select, width


def _seed_model_parallel_rng() -> None:
    """megatron-core initialises GPU weights inside its model-parallel RNG fork, which fails
    ("cuda rng state model-parallel-rng is not added") until the tracker holds that state; the
    checkpoint's weights replace the initial ones, so the seed (0) changes nothing that is used."""
    from megatron.core import tensor_parallel

    if "model-parallel-rng" not in tensor_parallel.get_cuda_rng_tracker().get_states():
        tensor_parallel.model_parallel_cuda_manual_seed(0)


def _prepare_forward(model: Any, device: torch.device) -> None:
    if device.type != "cpu":
        return
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)  # dropout's CUDA RNG fork: a no-op


def _load_runtime(folder: str, device: torch.device, dtype: Optional[str], tp: int,
                  cleanup: List[Callable[[], None]]) -> LoadedModel:
    from megatron.core.utils import unwrap_model

    from dlmspec.backends.megatron.init_from import load_model_weights
    from dlmspec.backends.megatron.layers import build_layer_spec, build_model

    meta = _read_json(os.path.join(folder, METADATA_FILENAME))
    if not isinstance(meta, dict):
        raise LoadError(os.path.join(folder, METADATA_FILENAME), f"holds a JSON {type(meta).__name__}, not an object",
                        "pass a checkpoint the dlmspec runtime wrote")
    spec_meta = meta.get("spec")
    record = spec_meta.get("record") if isinstance(spec_meta, dict) else None
    if not isinstance(record, dict):
        raise LoadError(folder, f"{METADATA_FILENAME} holds no spec record (written before the runtime recorded specs)",
                        "load a checkpoint of a run compiled by this dlmspec, or convert it with `dlmspec convert`")
    missing = [k for k in _REQUIRED if k not in record]
    if missing:
        raise LoadError(folder, f"the spec record lacks {', '.join(missing)}", "load a checkpoint of this dlmspec's runtime")
    if record.get("objective.attention_mask") == "block_causal":
        raise LoadError(folder, "a block-causal model is not sampled by the masked-diffusion sampler yet",
                        "load an mdm (bidirectional) or ar (causal) checkpoint")
    check_record(os.path.join(folder, METADATA_FILENAME), record)
    generate_table = _lock_generate_table(folder)  # a bad lock is refused before the weights are read
    _cpu_patches(cleanup) if device.type == "cpu" else None
    _setup_parallel(tp, device, cleanup)
    from dlmspec.backends.megatron.layers import transformer_engine_available

    try:
        config = build_transformer_config(record, tp=tp, dtype=_dtype(record, device, dtype), cpu=device.type == "cpu")
        te = meta.get("layer_spec") == "transformer_engine" and device.type == "cuda"
        spec = build_layer_spec(attention=record["objective.attention_mask"],
                                block_size=record.get("objective.block_size"),
                                num_experts=record.get("model.num_experts") or None, qk_layernorm=config.qk_layernorm,
                                normalization=config.normalization,
                                use_transformer_engine=te and transformer_engine_available())
        if device.type == "cuda":
            _seed_model_parallel_rng()
        chunks = build_model(
            config, layer_spec=spec, vocab_size=int(record["model.padded_vocab_size"]),
            max_sequence_length=int(record.get("model.max_position_embeddings") or 4096),
            position_embedding_type=record.get("model.position_embedding_type") or "rope",
            rotary_base=int(record.get("model.rotary_base") or 10000),
            rotary_percent=float(record.get("model.rotary_percent") or 1.0),
            share_embeddings_and_output_weights=not record.get("model.untie_embeddings_and_output_weights", False),
        )
    except (TypeError, ValueError, AssertionError, KeyError, OverflowError) as exc:
        raise LoadError(os.path.join(folder, METADATA_FILENAME), f"its spec record does not build a model "
                        f"({type(exc).__name__}: {str(exc)[:200]})",
                        "load a checkpoint the dlmspec runtime wrote, with its dlmspec.json unchanged") from None
    from dlmspec.backends.checkpoint_safety import CheckpointRefused

    try:
        load_model_weights(folder, chunks)
    except CheckpointRefused as exc:  # a checkpoint file that would run code: the file and the global
        raise LoadError(exc.path, exc.why, exc.hint) from None
    except checkpoint_read_errors() as exc:
        if is_out_of_memory(exc):  # not a damaged checkpoint: the GPU is full (other processes, a large model)
            raise LoadError(folder, f"the GPU ran out of memory while the weights were read "
                            f"({describe_read_error(exc)})", OUT_OF_MEMORY_FIX) from None
        raise LoadError(folder, f"the weights cannot be read into the model its record describes "
                        f"({describe_read_error(exc)})",
                        "load a complete, undamaged checkpoint (one `latest` names; copy it again if it was "
                        "cut short)") from None
    model = chunks[0].to(device).eval()
    _prepare_forward(unwrap_model(model), device)
    tokenizer, why = _tokenizer(record)
    iteration = meta.get("iteration")
    return _finish(model, record, source="dlmspec", folder=folder,
                   iteration=iteration if isinstance(iteration, int) and not isinstance(iteration, bool) else None,
                   device=device, tp=tp, cleanup=cleanup, tokenizer=tokenizer, tokenizer_error=why,
                   generate_table=generate_table)


def converted_mask_token_id(folder: str, config: Dict[str, Any]) -> Optional[int]:
    """The mask token of a converted masked-diffusion model: ``mask_token_id`` of its
    ``config.json`` (LLaDA's 126336, Dream's 151666), else the id of the ``mask_token`` its
    tokenizer files in ``folder`` name (:func:`dlmspec.tokenizers.hf_special_token`); None when
    neither says."""
    value = config.get("mask_token_id")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    from dlmspec.tokenizers import hf_special_token

    found = hf_special_token(folder, "mask_token")
    return found[1] if found is not None else None


def _load_converted(source: str, folder: str, device: torch.device, dtype: Optional[str], tp: int,
                    kind: Optional[str], mask_token_id: Optional[int], cleanup: List[Callable[[], None]]) -> LoadedModel:
    from dlmspec.backends.convert import hf_io, mcore_io, mcore_model
    from dlmspec.backends.convert.errors import ConversionError
    from dlmspec.backends.convert.hf_config import dims_from_hf_config
    from dlmspec.backends.convert.state_dict import hf_to_mcore_state_dict
    from dlmspec.backends.model_config import PARAMS_DTYPES, record_from_dims, transformer_config_from_record
    from dlmspec.backends.megatron.layers import build_layer_spec, build_model

    if tp != 1:
        raise LoadError(folder, "converted checkpoints load at tensor_model_parallel_size = 1", "use TP = 1")
    try:
        if source == "hf":
            config = hf_io.read_hf_config(folder)
            dims = dims_from_hf_config(config, source=os.path.join(folder, hf_io.CONFIG_NAME))
            state = hf_to_mcore_state_dict(hf_io.SafetensorsReader(folder), dims)
        else:
            config = (mcore_io.read_sidecar(folder) or {}).get("hf_config") or {}
            with mcore_io.process_group():
                state, dims = mcore_io.load_mcore_checkpoint(folder, None)
    except ConversionError as exc:
        raise LoadError(folder, str(exc), "pass a checkpoint `dlmspec convert verify` accepts") from None
    except checkpoint_read_errors() + _safetensors_errors() as exc:
        raise LoadError(folder, f"the checkpoint's files cannot be read ({describe_read_error(exc)})",
                        "pass a complete, undamaged checkpoint (copy it again if it was cut short)") from None
    family_kind = "mdm" if dims.family in MDM_FAMILIES else "ar"
    kind = kind or family_kind
    if objectives.is_diffusion(kind) and mask_token_id is None:
        mask_token_id = converted_mask_token_id(folder, config)
        if mask_token_id is None:
            raise LoadError(folder, f"a {dims.family} model sampled as mdm needs its mask token id: neither its "
                            "config.json (mask_token_id) nor its tokenizer (tokenizer_config.json mask_token) "
                            "names one", "give the mask token id (--mask-token-id)")
    if mask_token_id is not None and not 0 <= mask_token_id < dims.padded_vocab_size:
        raise LoadError(folder, f"mask token id {mask_token_id} is outside the padded vocabulary of "
                        f"{dims.padded_vocab_size}", "give the model's mask token id (--mask-token-id)")
    eos = config.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) and eos else eos
    record = record_from_dims(dims, kind, mask_token_id, eos if isinstance(eos, int) else None)
    if device.type == "cpu":
        _cpu_patches(cleanup)
    _setup_parallel(1, device, cleanup)
    want = _dtype({"precision.dtype": "bf16"}, device, dtype)
    tconfig = transformer_config_from_record(record, tp=1, params_dtype=PARAMS_DTYPES[want], cpu=device.type == "cpu")
    spec = build_layer_spec(attention=record["objective.attention_mask"], num_experts=dims.num_experts or None,
                            qk_layernorm=dims.qk_layernorm, use_transformer_engine=False)
    gpt_kwargs = mcore_model.gpt_model_kwargs(dims)
    if gpt_kwargs.pop("rope_scaling", False):
        raise LoadError(folder, "RoPE scaling (Llama 3.1's) is not built by the runtime's model", "load a model without rope_scaling")
    gpt_kwargs.pop("rope_scaling_factor", None)
    if device.type == "cuda":
        _seed_model_parallel_rng()
    (chunk,) = build_model(tconfig, layer_spec=spec, **gpt_kwargs)
    from megatron.core.utils import unwrap_model

    try:
        mcore_model.load_into_model(unwrap_model(chunk), state)
    except ConversionError as exc:
        raise LoadError(folder, str(exc), "pass a checkpoint `dlmspec convert verify` accepts") from None
    model = chunk.to(device).eval()
    _prepare_forward(unwrap_model(model), device)
    tokenizer, why = None, "no tokenizer files in the checkpoint folder"
    # a Hugging Face folder, or a `convert hf-to-mcore` folder (which copies the source's tokenizer files)
    if any(os.path.isfile(os.path.join(folder, n)) for n in ("tokenizer.json", "tokenizer_config.json")):
        from dlmspec.tokenizers import TokenizerError, build_tokenizer

        try:
            tokenizer, why = build_tokenizer("HuggingFaceTokenizer", tokenizer_model=folder), None
        except (TokenizerError, OSError, ImportError, ValueError) as exc:
            tokenizer, why = None, str(exc)
    return _finish(model, record, source=source, folder=folder, iteration=None, device=device, tp=1,
                   cleanup=cleanup, tokenizer=tokenizer, tokenizer_error=why)


def load_model(path: str, *, device: Any = None, dtype: Optional[str] = None, tensor_model_parallel_size: int = 1,
               kind: Optional[str] = None, mask_token_id: Optional[int] = None) -> LoadedModel:
    """Load a model for generation and scoring (the module docstring lists what ``path`` may be).

    Args:
        path: a run folder, a save folder with ``latest``, one ``iter_*`` checkpoint folder, a
            ``dlmspec convert hf-to-mcore`` folder or a Hugging Face folder.
        device: ``"cuda"``, ``"cuda:1"``, ``"cpu"``, a ``torch.device``, or ``None`` / ``"auto"``
            (the current CUDA device, else CPU).
        dtype: ``"bf16"``, ``"fp16"`` or ``"fp32"``; default: the run's ``precision.dtype`` on a GPU,
            fp32 on CPU.
        tensor_model_parallel_size: TP of the loaded model (processes of the run; 1 here).
        kind: converted checkpoints only: ``"mdm"`` or ``"ar"`` (default: ``"mdm"`` for the LLaDA
            and Dream families, else ``"ar"``). A runtime checkpoint's kind is its record's.
        mask_token_id: converted checkpoints only: the mask token (default: its config.json's ``mask_token_id``, else its tokenizer's ``mask_token``, :func:`converted_mask_token_id`).

    Returns:
        A :class:`LoadedModel`; call :meth:`LoadedModel.close` when done (it releases the process
        group and model-parallel state that loading created).

    Raises:
        LoadError: the path is not a checkpoint, its record is missing or unusable, the weights do
            not load, no CUDA device for ``device="cuda"`` (each with ``path``, ``why``, ``fix``).
    """
    source, folder = find_checkpoint(path)
    dev = _pick_device(device)
    if dtype is not None and dtype not in ("bf16", "fp16", "fp32"):
        raise LoadError(str(dtype), "not a dtype", "one of bf16, fp16, fp32")
    cleanup: List[Callable[[], None]] = []
    try:
        with warnings.catch_warnings():  # megatron-core's and torch.distributed.checkpoint's deprecation notes
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            if source == "dlmspec":
                return _load_runtime(folder, dev, dtype, tensor_model_parallel_size, cleanup)
            return _load_converted(source, folder, dev, dtype, tensor_model_parallel_size, kind, mask_token_id,
                                   cleanup)
    except BaseException:
        while cleanup:
            cleanup.pop()()
        raise
