"""What a checkpoint records about the spec that wrote it, and the check made on resume.

Every checkpoint holds the run's lock file and :func:`spec_record` (the run's values by spec
key); :func:`check_resume` refuses a resume that changes what the weights were trained as
(:data:`REFUSED`, :class:`ResumeRefused`) and lists what else changed;
:func:`load_scheduler_state` lets a changed learning-rate schedule apply. Imports neither torch
nor megatron-core (the objects are read by attribute). Details: docs/runtime.md, "Spec record
and resume".
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from dlmspec import objectives
from dlmspec.names import CHECKPOINT_RECORD
from dlmspec.files import MAX_NESTING, FileRefused, nesting_exceeds, read_json, read_text

#: The lock file's name, beside train.py and inside each checkpoint.
LOCK_FILENAME = "spec.lock.toml"
#: A lock file is a few KiB; one larger than this is not one (``/dev/zero``, a wrong file).
LOCK_MAX_BYTES = 4 * 2**20
#: The checkpoint metadata file (``dlmspec.backends.megatron.training.METADATA_FILENAME``).
METADATA_FILENAME = CHECKPOINT_RECORD
#: Version of :func:`spec_record`'s layout.
RECORD_FORMAT = 1

#: Keys whose change a resume refuses: the checkpoint's weights were trained for them.
REFUSED = frozenset({
    "objective.kind", "objective.attention_mask", "objective.block_size", "objective.mask_token_id",
    "model.num_layers", "model.hidden_size", "model.ffn_hidden_size", "model.num_attention_heads",
    "model.num_query_groups", "model.kv_channels", "model.normalization", "model.activation",
    "model.gated_linear_unit", "model.add_bias_linear", "model.add_qkv_bias", "model.qk_layernorm",
    "model.num_experts", "model.moe_ffn_hidden_size", "model.moe_shared_expert_intermediate_size",
    "model.moe_layer_freq", "model.vocab_size", "model.padded_vocab_size", "model.position_embedding_type",
    "model.untie_embeddings_and_output_weights",
    "data.tokenizer.type", "data.eod_id",
    "train.seed",
})
#: Keys that hold a tensor shape (a changed one cannot take the checkpoint's weights at all).
SHAPE_KEYS = frozenset(k for k in REFUSED if k.startswith("model."))
#: Where a refused key's value comes from, when the spec key alone does not say it.
_NOTES = {
    "model.padded_vocab_size": "model.vocab_size padded to a multiple of model.make_vocab_size_divisible_by x "
                               "tensor-parallel size",
    "model.gated_linear_unit": "from model.activation",
    "objective.attention_mask": "the layer spec's attention",
    "train.seed": "the masking and data-order seed",
}
#: ``OptimizerParamScheduler.state_dict()`` keys -> the spec keys they come from.
SCHEDULER_KEYS = {
    "max_lr": "train.lr",
    "min_lr": "train.min_lr",
    "lr_warmup_steps": "train.lr_warmup_iters",
    "lr_decay_steps": "train.lr_decay_iters",
    "lr_decay_style": "train.lr_decay_style",
    "start_wd": "train.weight_decay (start)",
    "end_wd": "train.weight_decay (end)",
    "wd_incr_steps": "train.train_iters (weight-decay steps)",
    "wd_incr_style": "weight_decay_incr_style",
    "lr_points": "train.lr_points",  # PiecewiseParamScheduler only
}
#: Older names megatron-core's ``load_state_dict`` also reads.
_SCHEDULER_LEGACY = {"max_lr": "start_lr", "lr_warmup_steps": "warmup_steps", "lr_decay_steps": "decay_steps",
                     "lr_decay_style": "decay_style"}


# --------------------------------------------------------------------------- the lock


@dataclass
class SpecLock:
    """The spec a run was compiled from, as :func:`read_spec_lock` found it.

    Attributes:
        path: The lock file looked for (``None``: train() was given none).
        content_hash: ``RunConfig.spec_hash`` (train.py's), else the lock's own.
        text: The lock file's content when it belongs to this train.py, else ``None``.
        tokenizer: The lock's ``[data.tokenizer]`` table (``None`` without a readable lock).
        warnings: One sentence per problem (missing file, another compile's lock).
        error: Why the file there is no lock file at all (``file: why. Fix: ...``), else ``None``.
    """

    path: Optional[str] = None
    content_hash: Optional[str] = None
    text: Optional[str] = None
    tokenizer: Optional[Dict[str, Any]] = None
    warnings: List[str] = field(default_factory=list)
    error: Optional[str] = None


def _toml_parser() -> Any:
    """``tomllib`` (Python 3.11+), else ``tomli``, else ``None``."""
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            return None
    return tomllib


def _parse_toml(text: str) -> Optional[Dict[str, Any]]:
    """The TOML document ``text``; ``None`` when it is not TOML or no parser is installed."""
    parser = _toml_parser()
    if parser is None:  # pragma: no cover - Python 3.10 without tomli
        return None
    try:
        return parser.loads(text)
    except (ValueError, RecursionError):
        return None


def read_spec_lock(path: Optional[str], content_hash: Optional[str]) -> SpecLock:
    """Read the ``spec.lock.toml`` a compiled train.py names, if it is train.py's.

    Args:
        path: ``RunConfig.spec_lock_file``.
        content_hash: ``RunConfig.spec_hash`` (``"sha256:<hex>"``), the hash train.py was
            compiled with; the lock counts as train.py's only when its ``[lock] content_hash``
            equals it (a lock edited or written by another compile does not).

    Returns:
        A :class:`SpecLock`. A missing lock, or one of another compile, is a warning (the
        checkpoint then records the hash without the file); a lock that is there but is no lock
        file (a FIFO or device, larger than :data:`LOCK_MAX_BYTES`, not UTF-8, nested deeper than
        :data:`dlmspec.files.MAX_NESTING`, not TOML, no ``[lock] content_hash``) sets
        ``error``, which :func:`dlmspec.backends.megatron.checks.start_checks` refuses (exit 2).
    """
    out = SpecLock(path=path, content_hash=content_hash)
    if not path:
        return out
    if not os.path.lexists(path):
        out.warnings.append(f"{path} not found beside train.py: checkpoints record the spec's hash "
                            f"({content_hash}) but not its lock file; compile again to restore it")
        return out
    recompile = "compile the spec again (`dlmspec compile`), which writes spec.lock.toml beside train.py"
    try:
        text = read_text(path, limit=LOCK_MAX_BYTES, what="spec lock file")
    except FileRefused as exc:
        out.error = f"{exc.path}: {exc.why}. Fix: {recompile}"
        return out
    if nesting_exceeds(text, MAX_NESTING, toml=True):
        out.error = f"{path}: the spec lock file nests more than {MAX_NESTING} levels deep. Fix: {recompile}"
        return out
    data = _parse_toml(text)
    if data is not None:
        lock_table = data.get("lock")
        found = lock_table.get("content_hash") if isinstance(lock_table, dict) else None
    else:
        match = re.search(r'(?m)^content_hash = "(sha256:[0-9a-f]{64})"$', text)
        found = match.group(1) if match else None
    if data is None and (_toml_parser() is not None or found is None):
        out.error = f"{path}: not a spec lock file (not valid TOML). Fix: {recompile}"
        return out
    if not isinstance(found, str):
        out.error = (f"{path}: not a spec lock file (its [lock] table has no content_hash string). "
                     f"Fix: {recompile}")
        return out
    if content_hash is not None and found != content_hash:
        out.warnings.append(f"{path} holds spec {found}, train.py was compiled from {content_hash}: it belongs to "
                            "another compile; checkpoints record train.py's hash only (compile again to get the "
                            "two in step)")
        return out
    out.text = text
    out.content_hash = content_hash or found
    tokenizer = ((data or {}).get("data") or {}).get("tokenizer")
    out.tokenizer = dict(tokenizer) if isinstance(tokenizer, dict) else None
    return out


# --------------------------------------------------------------------------- the record


def _json(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples -> lists; other objects -> their name)."""
    return json.loads(json.dumps(value, default=lambda v: getattr(v, "__name__", str(v))))


def spec_record(run: Any, *, transformer_config: Any, model_kwargs: Dict[str, Any], optimizer_config: Any,
                attention: str, block_size: Optional[int], parallel_sizes: Dict[str, Optional[int]],
                world_size: int, tokenizer: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The run's values by spec key, as a checkpoint records them (JSON types).

    Args:
        run: The ``RunConfig``.
        transformer_config: megatron-core's ``TransformerConfig`` of the run.
        model_kwargs: The GPTModel keyword arguments (``vocab_size`` is the padded size).
        optimizer_config: megatron-core's ``OptimizerConfig``.
        attention: The layer spec's attention (``bidirectional``, ``causal``, ``block_causal``).
        block_size: Block-causal block size, else ``None``.
        parallel_sizes: ``train()``'s parallel keyword arguments (``tensor_model_parallel_size``...).
        world_size: Processes of the run.
        tokenizer: The lock's ``[data.tokenizer]`` table (``None``: not recorded).

    Returns:
        ``{"model.hidden_size": 768, ...}``: flat, keys named as in the spec where one exists.
    """
    tc, obj, data, sched = transformer_config, run.objective, run.data, run.schedule
    experts = getattr(tc, "num_moe_experts", None)
    values: Dict[str, Any] = {
        "name": run.name,
        "objective.kind": obj.kind,
        "objective.mask_token_id": obj.mask_token_id if objectives.is_diffusion(obj.kind) else None,
        "objective.attention_mask": attention,
        # block diffusion's block lives in the objective's options (its layers are bidirectional)
        "objective.block_size": block_size if block_size is not None else (getattr(obj, "options", None) or {}).get("block_size"),
        "objective.eps": obj.eps,
        "objective.loss_weighting": obj.loss_weighting,
        "objective.variable_length_prob": obj.variable_length_prob,
        "objective.min_masked_tokens": obj.min_masked_tokens,
        "objective.variable_length": obj.variable_length,
        "train.loss_normalization": obj.loss_normalization,
        # a schedule other than linear (a linear run's record is as before): generate and eval follow it
        **_schedule_record(obj),
        "model.num_layers": tc.num_layers,
        "model.hidden_size": tc.hidden_size,
        "model.ffn_hidden_size": tc.ffn_hidden_size,
        "model.num_attention_heads": tc.num_attention_heads,
        "model.num_query_groups": tc.num_query_groups or tc.num_attention_heads,
        "model.kv_channels": tc.kv_channels,
        "model.normalization": tc.normalization,
        "model.activation": getattr(tc.activation_func, "__name__", str(tc.activation_func)),
        "model.gated_linear_unit": bool(tc.gated_linear_unit),
        "model.add_bias_linear": bool(tc.add_bias_linear),
        "model.add_qkv_bias": bool(tc.add_qkv_bias),
        "model.qk_layernorm": bool(tc.qk_layernorm),
        "model.num_experts": int(experts or 0),
        "model.moe_ffn_hidden_size": tc.moe_ffn_hidden_size if experts else None,
        "model.moe_shared_expert_intermediate_size": tc.moe_shared_expert_intermediate_size if experts else None,
        "model.moe_layer_freq": tc.moe_layer_freq if experts else None,
        "model.moe_router_topk": tc.moe_router_topk if experts else None,
        "model.vocab_size": data.vocab_size,
        "model.padded_vocab_size": int(model_kwargs["vocab_size"]),
        "model.position_embedding_type": model_kwargs.get("position_embedding_type", "rope"),
        "model.untie_embeddings_and_output_weights": not model_kwargs.get("share_embeddings_and_output_weights",
                                                                          True),
        "model.max_position_embeddings": model_kwargs.get("max_sequence_length"),
        "model.rotary_base": model_kwargs.get("rotary_base"),
        "model.rotary_percent": model_kwargs.get("rotary_percent"),
        "model.layernorm_epsilon": tc.layernorm_epsilon,
        "data.eod_id": data.eod_id,
        "data.mock": data.mock,
        "data.train": data.blend,
        "data.valid": data.valid_blend,
        "data.split": data.split,
        "data.reset_position_ids": data.reset_position_ids,
        "data.reset_attention_mask": data.reset_attention_mask,
        "data.eod_mask_loss": data.eod_mask_loss,
        "train.seq_length": data.seq_length,
        "train.seed": run.seed,
        "train.micro_batch_size": sched.micro_batch_size,
        "train.global_batch_size": sched.global_batch_size,
        "train.train_iters": sched.train_iters,
        "train.lr": optimizer_config.lr,
        "train.min_lr": optimizer_config.min_lr,
        "train.lr_warmup_iters": sched.lr_warmup_iters,
        "train.lr_decay_iters": sched.lr_decay_iters,
        "train.lr_decay_style": sched.lr_decay_style,
        "train.lr_wsd_decay_iters": sched.lr_wsd_decay_iters,
        "train.lr_wsd_decay_style": sched.lr_wsd_decay_style,
        "train.optimizer": optimizer_config.optimizer,
        "train.weight_decay": optimizer_config.weight_decay,
        "train.adam_beta1": optimizer_config.adam_beta1,
        "train.adam_beta2": optimizer_config.adam_beta2,
        "train.adam_eps": optimizer_config.adam_eps,
        "train.clip_grad": optimizer_config.clip_grad,
        "train.eval_interval": sched.eval_interval,
        "train.eval_iters": sched.eval_iters,
        "logging.log_interval": run.logging.log_interval,
        "logging.run_dir": run.logging.run_dir,
        "precision.dtype": "bf16" if tc.bf16 else "fp16" if tc.fp16 else "fp32",
        "cluster.world_size": world_size,
    }
    for key, value in sorted(parallel_sizes.items()):
        values[f"parallel.{key}"] = value
    for key, value in sorted((tokenizer or {}).items()):
        values[f"data.tokenizer.{key}"] = value
    return _json(values)


def spec_metadata(lock: SpecLock, record: Dict[str, Any]) -> Dict[str, Any]:
    """The ``"spec"`` entry of a checkpoint's ``dlmspec.json``: the content hash, the lock
    file's name inside the checkpoint (``None`` when the run had no lock), the record."""
    return {"content_hash": lock.content_hash, "lock_file": LOCK_FILENAME if lock.text is not None else None,
            "record_format": RECORD_FORMAT, "record": record}


# --------------------------------------------------------------------------- the resume check


class ResumeRefused(Exception):
    """A resume that would continue a run as something it was not trained as (the message
    names the checkpoint, each changed key with both values, and what to do)."""


@dataclass
class ResumeCheck:
    """What :func:`check_resume` found (the resume goes ahead).

    Attributes:
        checkpoint: The checkpoint directory.
        changed: ``(key, checkpoint value, this run's value)`` of every allowed change.
        warnings: What could not be checked, one sentence each.
        content_hash: The spec hash the checkpoint records (``None`` if none).
    """

    checkpoint: str
    changed: List[Tuple[str, Any, Any]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    content_hash: Optional[str] = None

    def report_lines(self) -> List[str]:
        """Console lines: the allowed changes (``key: old -> new``), then the warnings."""
        lines = []
        if self.changed:
            lines.append(f"resume from {self.checkpoint}: the spec changed since this checkpoint "
                         f"({_short(self.content_hash)}), allowed:")
            lines += [f"  {key}: {_show(old)} -> {_show(new)}" for key, old, new in self.changed]
        lines += [f"warning: {w}" for w in self.warnings]
        return lines

    def to_record(self) -> Dict[str, Any]:
        """For the ``start`` record of metrics.jsonl."""
        return {"checkpoint": self.checkpoint, "checkpoint_spec_hash": self.content_hash,
                "changed": [{"key": k, "checkpoint": a, "now": b} for k, a, b in self.changed],
                "warnings": list(self.warnings)}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _short(content_hash: Optional[str]) -> str:
    return "no recorded spec" if not content_hash else f"spec {content_hash[:19]}"


def _schedule_record(objective: Any) -> Dict[str, Any]:
    """``{"objective.noise_schedule": ..., "objective.noise_schedule_exponent": ...}`` of a run whose
    masking schedule is not linear (its objective's registration, :mod:`dlmspec.objectives`), else ``{}``."""
    if objective.kind not in objectives.kinds():
        return {}
    schedule = objectives.get(objective.kind).schedule(objective)
    if schedule.name == "linear":
        return {}
    return {f"objective.{key}": value for key, value in schedule.to_record().items()}


def _legacy_values(meta: Dict[str, Any]) -> Dict[str, Any]:
    """What a ``dlmspec.json`` without a record still says, by spec key."""
    values: Dict[str, Any] = {}
    objective = meta.get("objective")
    if isinstance(objective, dict):
        for key in ("kind", "eps", "loss_weighting", "variable_length_prob"):
            if key in objective:
                values[f"objective.{key}"] = objective[key]
        if "mask_token_id" in objective:
            values["objective.mask_token_id"] = (objective["mask_token_id"] if objectives.is_diffusion(objective.get("kind"))
                                                 else None)
    if meta.get("seed") is not None:
        values["train.seed"] = meta["seed"]
    return values


def _refusal(path: str, refused: List[Tuple[str, Any, Any]], ckpt_hash: Optional[str],
             run_hash: Optional[str]) -> str:
    lines = [f"cannot resume from {path}: this spec changes what the checkpoint was trained as"]
    for key, old, new in refused:
        note = f" ({_NOTES[key]})" if key in _NOTES else ""
        lines.append(f"  {key}{note}: the checkpoint has {_show(old)}, this spec {_show(new)}")
    lines.append(f"  (the checkpoint was written by {_short(ckpt_hash)}, see its {LOCK_FILENAME}; "
                 f"this train.py is {_short(run_hash)})")
    weights = f'checkpoint.init_from = "mcore:{path}"'
    if any(key in SHAPE_KEYS for key, _, _ in refused):
        start = ("start it as a new run: set checkpoint.save (and checkpoint.load) to a new folder; the model "
                 f"shape differs, so {weights} cannot take these weights")
    elif [key for key, _, _ in refused] == ["train.seed"]:
        start = (f"start it as a new run: set checkpoint.save (and checkpoint.load) to a new folder, with {weights} "
                 "to start from these weights")
    else:
        start = (f"start it as a new run from these weights: set checkpoint.save (and checkpoint.load) to a new "
                 f"folder and {weights} (model weights only; the optimizer and schedule start again)")
    lines.append(f"Fix: to continue this run, undo the change(s) and compile again; to train the changed spec, {start}.")
    return "\n".join(lines)


def _other_run(path: str, theirs: Any, ours: Any) -> str:
    """The refusal of a resume from a checkpoint that the run ``theirs`` wrote, by the run ``ours``."""
    folder = os.path.dirname(os.path.normpath(path)) or path
    return (f"cannot resume from {path}: its checkpoints belong to the run {theirs!r} (the spec name its record "
            f"holds), and this is the run {ours!r}: continuing another run's checkpoints is refused unless the spec "
            f"says it is meant (a batch job has no one to ask).\n"
            f"Fix: to start {ours!r} in a folder of its own, set checkpoint.save (and checkpoint.load) to another "
            f'folder than {folder}, e.g. checkpoint.save = "runs/{{name}}/checkpoints", and compile again; to '
            f'continue the run {theirs!r}, set checkpoint.resume_from_run = "{theirs}" in [checkpoint] and compile '
            "again.")


def check_resume(path: str, record: Dict[str, Any], *, content_hash: Optional[str],
                 resume_from_run: Optional[str] = None) -> ResumeCheck:
    """Compare the checkpoint at ``path`` with this run's record, before anything is loaded.

    Args:
        path: The checkpoint directory (``iter_*``) a resume would load.
        record: This run's :func:`spec_record`.
        content_hash: This train.py's spec hash.
        resume_from_run: ``CheckpointConfig.resume_from_run``: the spec name of another run
            whose checkpoints this run may continue (then the change of ``name`` is reported
            as an allowed change).

    Returns:
        A :class:`ResumeCheck` with the allowed changes and warnings.

    Raises:
        ResumeRefused: the checkpoint's record holds another spec ``name`` than this run's and
            ``resume_from_run`` does not name it (a record without a name, from an older
            dlmspec, is not refused for it); a key of :data:`REFUSED` changed;
            ``dlmspec.json`` is missing or unreadable (not a checkpoint dlmspec's runtime
            wrote, so it cannot continue it).
    """
    meta_path = os.path.join(path, METADATA_FILENAME)
    weights = f'checkpoint.init_from = "mcore:{path}"'
    try:
        if not os.path.lexists(meta_path):
            raise FileNotFoundError(meta_path)
        meta = read_json(meta_path, what="checkpoint record")
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        raise ResumeRefused(
            f"cannot resume from {path}: it has no {METADATA_FILENAME}, so dlmspec's runtime did not write it and "
            f"cannot continue it (iteration, samples, seed and schedule are kept there). Fix: to start from its "
            f"weights, set checkpoint.save (and checkpoint.load) to a new folder and {weights}") from None
    except (OSError, ValueError) as exc:  # FileRefused is a ValueError: a FIFO, too large or deep, not JSON
        why = exc.why if isinstance(exc, FileRefused) else exc
        raise ResumeRefused(
            f"cannot resume from {path}: {meta_path} cannot be read ({why}). Fix: restore the file, or remove the "
            f"folder's name from the 'latest' file beside it to resume from an earlier checkpoint") from None
    spec = meta.get("spec") if isinstance(meta.get("spec"), dict) else {}
    old = spec.get("record") if isinstance(spec.get("record"), dict) else None
    out = ResumeCheck(checkpoint=path, content_hash=spec.get("content_hash"))
    if old is None:
        old = _legacy_values(meta)
        checked = [what for what, prefix in (("the objective", "objective."), ("the seed", "train.seed"))
                   if any(k.startswith(prefix) for k in old)]
        out.warnings.append(
            f"{path} has no spec record (written by an older dlmspec): the model shape, tokenizer, data and "
            f"schedule could not be checked against this spec (checked: {' and '.join(checked) or 'nothing'}); a "
            "model shape that differs fails in megatron-core's load")
    elif "data.tokenizer.type" in old and "data.tokenizer.type" not in record:
        out.warnings.append("the tokenizer files were not compared: this train.py has no readable spec.lock.toml")
    theirs, ours = old.get("name"), record.get("name")
    if theirs is not None and ours is not None and theirs != ours and theirs != resume_from_run:
        raise ResumeRefused(_other_run(path, theirs, ours))
    refused, changed = [], []
    for key in sorted(set(old) & set(record)):
        if old[key] == record[key]:
            continue
        shape_of_positions = key == "model.max_position_embeddings" and record.get(
            "model.position_embedding_type") == "learned_absolute"
        (refused if key in REFUSED or shape_of_positions else changed).append((key, old[key], record[key]))
    if refused:
        raise ResumeRefused(_refusal(path, refused, out.content_hash, content_hash))
    out.changed = changed
    return out


# --------------------------------------------------------------------------- the scheduler


def _state_value(state: Dict[str, Any], key: str) -> Any:
    if key in state:
        return state[key]
    return state.get(_SCHEDULER_LEGACY.get(key, key))


def scheduler_changes(scheduler: Any, state: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
    """``(spec key, checkpoint value, this run's value)`` for each schedule value that differs
    between a checkpoint's ``OptimizerParamScheduler`` state and ``scheduler``."""
    ours = scheduler.state_dict()
    changes = []
    for key, name in SCHEDULER_KEYS.items():
        theirs = _state_value(state, key)
        if theirs is not None and key in ours and theirs != ours[key]:
            changes.append((name, theirs, ours[key]))
    return changes


def load_scheduler_state(scheduler: Any, state: Dict[str, Any], *, override: bool = False) -> List[Tuple[str, Any, Any]]:
    """Load a checkpoint's scheduler state, keeping this spec's schedule where it changed.

    The step count (``num_steps``) always comes from the checkpoint. Where any schedule value
    differs (:func:`scheduler_changes`), or ``override`` (``CheckpointConfig.
    override_scheduler_on_resume``), megatron-core's ``override_opt_param_scheduler`` is set for
    the load, so the spec's values are used instead of megatron-core's assertion ``class input
    value ... and checkpoint value ... do not match``.

    Returns:
        :func:`scheduler_changes` (empty: the same schedule).
    """
    changes = scheduler_changes(scheduler, state)
    if changes or override:
        scheduler.override_opt_param_scheduler = True
        scheduler.use_checkpoint_opt_param_scheduler = False
    scheduler.load_state_dict(state)
    return changes


__all__ = [
    "LOCK_FILENAME",
    "REFUSED",
    "ResumeCheck",
    "ResumeRefused",
    "SpecLock",
    "check_resume",
    "load_scheduler_state",
    "read_spec_lock",
    "scheduler_changes",
    "spec_metadata",
    "spec_record",
]
