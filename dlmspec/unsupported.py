"""What the bundled runtime (``backends/megatron``) cannot run, and the end-of-document id it
reads: :data:`UNSUPPORTED` and :func:`unsupported_issues`.

``dlmspec validate`` and ``dlmspec compile`` both report these (through
:func:`dlmspec.validate.validate_spec`, so the two never disagree); the table lives here, apart
from the compiler, because ``validate`` must stay light: this module imports neither jinja2 nor
pydantic. :mod:`dlmspec.render.compile` re-exports every name.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from dlmspec.errors import SpecIssue
from dlmspec.resolve import Resolved
from dlmspec.tokenizers import read_json

if TYPE_CHECKING:
    from dlmspec.spec.load import LoadedSpec
    from dlmspec.spec.models import Spec


def run_dir(resolved: Resolved) -> str:
    """The runtime's ``LoggingConfig.run_dir`` (metrics.jsonl, exit_status.json, tensorboard/):
    ``logging.run_dir``, default ``runs/<name>``."""
    return resolved.spec.logging.run_dir or f"runs/{resolved.spec.name}"



@dataclass(frozen=True)
class EodChoice:
    """The end-of-document id train.py passes to the runtime.

    Attributes:
        value: the id.
        source: where it comes from, for a comment in train.py.
        known: False when the id could not be told and ``value`` only fills the place.
    """

    value: int
    source: str
    known: bool = True


#: GPT-2's end-of-document token and its id in the GPT-2 BPE vocabulary (Radford et al. 2019,
#: encoder.json; ``dlmspec.tokenizers.GPT2_EOD_TOKEN``).
GPT2_EOD = ("<|endoftext|>", 50256)



def _hf_eos_id(folder: str) -> tuple[str, int] | None:
    """``(token, id)`` of the EOS token of a local Hugging Face tokenizer folder, read from its
    ``tokenizer_config.json`` (``eos_token``) and ``tokenizer.json`` (``added_tokens``, then
    ``model.vocab``); None when either file is missing or has no such entry."""
    config = read_json(os.path.join(folder, "tokenizer_config.json"))
    data = read_json(os.path.join(folder, "tokenizer.json"))
    if not isinstance(config, dict) or not isinstance(data, dict):
        return None
    eos = config.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if not isinstance(eos, str):
        return None
    for entry in data.get("added_tokens") or []:
        if isinstance(entry, dict) and entry.get("content") == eos and isinstance(entry.get("id"), int):
            return eos, entry["id"]
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and isinstance(vocab.get(eos), int):
        return eos, vocab[eos]
    return None


def eod_choice(spec: Spec) -> EodChoice:
    """The end-of-document id of the spec's tokenizer: ``data.tokenizer.eod_id`` when set;
    else GPT2BPETokenizer's ``<|endoftext|>`` (from ``vocab_file`` when readable, else 50256);
    NullTokenizer's ``vocab_size`` (megatron-core ``NullTokenizer``: EOD = vocab_size); a local
    Hugging Face folder's EOS token (:func:`_hf_eos_id`). Otherwise (a hub name, SentencePiece,
    TikToken) it is unknown: ``model.vocab_size - 1`` fills the place, ``known`` is False, and
    :func:`unsupported_issues` reports it."""
    tok = spec.data.tokenizer
    if tok.eod_id is not None:
        return EodChoice(tok.eod_id, "data.tokenizer.eod_id")
    if tok.type == "GPT2BPETokenizer":
        vocab = read_json(tok.vocab_file) if tok.vocab_file else None
        value = vocab.get(GPT2_EOD[0]) if isinstance(vocab, dict) else None
        return EodChoice(value if isinstance(value, int) else GPT2_EOD[1], f"{GPT2_EOD[0]} of the GPT-2 BPE vocabulary")
    if tok.type == "NullTokenizer":
        value = tok.vocab_size if tok.vocab_size is not None else spec.model.vocab_size - 1
        return EodChoice(value, "NullTokenizer: EOD = its vocab_size (megatron-core NullTokenizer)")
    if tok.type == "HuggingFaceTokenizer" and tok.model and os.path.isdir(tok.model):
        found = _hf_eos_id(tok.model)
        if found is not None:
            return EodChoice(found[1], f"eos token {found[0]!r} of {tok.model}")
    return EodChoice(spec.model.vocab_size - 1, "unknown at compile time; nothing in this run reads it", known=False)


def eod_used_by(spec: Spec) -> list[str]:
    """The spec keys that make the runtime read the end-of-document id (sorted)."""
    d = spec.data
    flags = {"data.mock": d.mock, "data.reset_attention_mask": d.reset_attention_mask,
             "data.reset_position_ids": d.reset_position_ids, "data.eod_mask_loss": d.eod_mask_loss}
    return sorted(k for k, on in flags.items() if on)


# --------------------------------------------------------------------------------------------
# What the runtime (backends/megatron) does not implement: refused, never silently compiled.


@dataclass(frozen=True)
class Unsupported:
    """A spec setting the megatron runtime cannot run.

    Attributes:
        key: dotted spec key.
        applies: True when the resolved spec uses the setting.
        why: what is missing, one sentence.
        fix: a value that compiles.
    """

    key: str
    applies: Callable[[Resolved], bool]
    why: str
    fix: str


def _value(spec: Spec, key: str) -> Any:
    node: Any = spec
    for part in key.split("."):
        node = getattr(node, part)
    return node


UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported(
        "stage.kind",
        lambda r: r.spec.stage.kind == "rl",
        "reinforcement learning (stage.kind = 'rl') is not implemented by the megatron runtime "
        "(backends/megatron): it trains pretraining objectives only",
        "set stage.kind = \"pretrain\"",
    ),
    Unsupported(
        "stage.kind",
        lambda r: r.spec.stage.kind == "sft",
        "supervised fine-tuning (stage.kind = 'sft': chat templates, prompt masking) is not "
        "implemented by the megatron runtime (backends/megatron)",
        "set stage.kind = \"pretrain\"",
    ),
    Unsupported(
        "checkpoint.async_save",
        lambda r: r.spec.checkpoint.async_save,
        "asynchronous checkpoint saving is not implemented by the runtime",
        "set checkpoint.async_save = false",
    ),
    Unsupported(
        "parallel.fsdp",
        lambda r: r.spec.parallel.fsdp == "torch",
        "torch FSDP2 (megatron-core's TorchFullyShardedDataParallel) is not wired into the runtime: "
        "it averages gradients over data parallelism where the runtime's per-token loss "
        "(calculate_per_token_loss) needs them summed, and megatron-core 0.16.1 has no checkpoint "
        "path for it that the runtime could resume from",
        "set parallel.fsdp = \"megatron\" (megatron-core's Megatron-FSDP; "
        "data_parallel_sharding_strategy = \"optim_grads_params\" shards weights, gradients and "
        "optimizer state like FSDP2)",
    ),
    # Megatron-FSDP (backends/megatron/fsdp.py, fsdp_problems): what megatron-core 0.16.1's
    # FullyShardedDataParallel and the runtime need besides CUDA and einops.
    Unsupported(
        "parallel.use_distributed_optimizer",
        lambda r: r.spec.parallel.fsdp == "megatron" and not r.spec.parallel.use_distributed_optimizer,
        "Megatron-FSDP keeps the fp32 main weights in its own sharded buffers, which only "
        "megatron-core's DistributedOptimizer steps",
        "set parallel.use_distributed_optimizer = true",
    ),
    Unsupported(
        "parallel.pipeline_model_parallel_size",
        lambda r: r.spec.parallel.fsdp == "megatron" and r.pp > 1,
        "Megatron-FSDP is wired for one model chunk per rank; the runtime does not combine it with "
        "pipeline parallelism",
        "set parallel.pipeline_model_parallel_size = 1, or parallel.fsdp = \"none\"",
    ),
    Unsupported(
        "kernels.cross_entropy",
        lambda r: r.spec.parallel.fsdp == "megatron" and r.cross_entropy == "fused_linear",
        "the fused linear cross entropy uses the output weight outside the model's forward, and "
        "Megatron-FSDP gathers its sharded weights only inside it",
        "set kernels.cross_entropy = \"megatron\"",
    ),
    Unsupported(
        "checkpoint.init_from",
        lambda r: r.spec.parallel.fsdp == "megatron" and r.spec.checkpoint.init_from is not None,
        "checkpoint.init_from loads weights into unsharded parameters; Megatron-FSDP's are sharded DTensors",
        "remove checkpoint.init_from, or set parallel.fsdp = \"none\"",
    ),
    Unsupported(
        "precision.fp8",
        lambda r: r.spec.parallel.fsdp == "megatron" and r.spec.precision.fp8 != "none",
        "fp8 with Megatron-FSDP (fp8 parameter gathers, Transformer Engine) is not wired into the runtime",
        "set precision.fp8 = \"none\", or parallel.fsdp = \"none\"",
    ),
    Unsupported(
        "logging.wandb_project",
        lambda r: r.spec.logging.wandb_project is not None,
        "Weights & Biases logging is not implemented by the runtime (console and TensorBoard only)",
        "remove logging.wandb_project and use logging.tensorboard_dir",
    ),
    # The layer path (resolve.layer_path: auto takes the one the features need; these are the
    # features an explicit model.transformer_impl cannot run).
    Unsupported(
        "model.moe_grouped_gemm",
        lambda r: r.spec.model.moe_grouped_gemm and r.transformer_impl == "local",
        "grouped-GEMM experts need Transformer Engine, and the layers are local",
        "set model.moe_grouped_gemm = false, or model.transformer_impl = \"transformer_engine\" (without the "
        "features that need the local layers: variable-length sequences, document masks, block-causal attention)",
    ),
    Unsupported(
        "objective.attention_mask",
        lambda r: r.attention_mask == "block_causal" and r.transformer_impl == "transformer_engine",
        "block-causal attention is implemented on the local + SDPA path only "
        "(backends/megatron/layers.py), not with Transformer Engine layers",
        "set model.transformer_impl = \"auto\" or \"local\"",
    ),
    Unsupported(
        "objective.variable_length_prob",
        lambda r: (r.spec.objective.kind == "mdm" and r.spec.objective.variable_length_prob > 0
                   and r.transformer_impl == "transformer_engine"),
        "sequences cut to a random length need a key-padding mask, which the Transformer Engine layers "
        "ignore: the runtime refuses it at start-up (backends/megatron/training.py check_masks_supported)",
        "set model.transformer_impl = \"auto\" or \"local\", or objective.variable_length_prob = 0",
    ),
    Unsupported(
        "data.reset_attention_mask",
        lambda r: r.spec.data.reset_attention_mask and r.transformer_impl == "transformer_engine",
        "document masks are passed as an attention mask, which the Transformer Engine layers ignore: the "
        "runtime refuses it at start-up (backends/megatron/training.py check_masks_supported)",
        "set model.transformer_impl = \"auto\" or \"local\", or data.reset_attention_mask = false",
    ),
    Unsupported(
        "logging.tensorboard_dir",
        lambda r: r.spec.logging.tensorboard_dir is not None
        and posixpath.normpath(r.spec.logging.tensorboard_dir) != posixpath.join(posixpath.normpath(run_dir(r)), "tensorboard"),
        "the runtime writes TensorBoard events to <logging.run_dir>/tensorboard, not to another directory",
        "set logging.tensorboard_dir to logging.run_dir + \"/tensorboard\" (run_dir defaults to runs/<name>)",
    ),
)


def unsupported_issues(resolved: Resolved, loaded: LoadedSpec | None = None) -> list[SpecIssue]:
    """What the compiler adds to the validator: every setting of ``resolved`` the runtime cannot
    run (errors, :data:`UNSUPPORTED`), and an end-of-document id it cannot tell (an error when
    the run reads it, else a warning; see :func:`eod_choice`)."""
    issues = []
    eod = eod_choice(resolved.spec)
    if not eod.known:
        used = eod_used_by(resolved.spec)
        file, line = loaded.locate("data.tokenizer.eod_id") if loaded is not None else (None, None)
        tok = resolved.spec.data.tokenizer
        what = f"{tok.type}" + (f" {tok.model!r}" if tok.model else "")
        issues.append(
            SpecIssue(
                key="data.tokenizer.eod_id",
                message=f"the end-of-document id of {what} cannot be read at compile time"
                + (f", and {', '.join(used)} reads it" if used else
                   f"; nothing in this run reads it, so train.py carries {eod.value} (vocab_size - 1) in its place"),
                value=None,
                hint="set data.tokenizer.eod_id to the id `dlmspec data prepare --append-eod` appended "
                "(the tokenizer's EOS/EOD token)",
                severity="error" if used else "warning",
                rule="eod-id-unknown",
                source="dlmspec.backends.megatron.data.DataConfig.eod_id",
                file=file,
                line=line,
            )
        )
    for rule in UNSUPPORTED:
        if not rule.applies(resolved):
            continue
        file, line = loaded.locate(rule.key) if loaded is not None else (None, None)
        issues.append(
            SpecIssue(
                key=rule.key,
                message=rule.why,
                value=_value(resolved.spec, rule.key),
                hint=rule.fix,
                rule="runtime-unsupported",
                source="backends/megatron (dlmspec.render.compile.UNSUPPORTED)",
                file=file,
                line=line,
            )
        )
    return issues


__all__ = [
    "EodChoice",
    "GPT2_EOD",
    "UNSUPPORTED",
    "Unsupported",
    "eod_choice",
    "eod_used_by",
    "run_dir",
    "unsupported_issues",
]
