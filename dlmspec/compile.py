"""``dlmspec compile``: render a spec into the files that run it.

``spec -> Resolved -> (validate) -> rendered files``. :func:`render` turns a
:class:`~dlmspec.resolve.Resolved` into file contents (a pure function: same spec, same bytes);
:func:`write_outputs` puts them in a directory; :func:`compile_spec` does both after loading
and checking the spec. The files:

* ``train.py`` (``templates/train.py.j2``): megatron-core launch code with every resolved value
  written out as a Python literal. It imports torch, megatron-core and ``backends.megatron``
  only (never dlmspec: the GPU machine need not have pydantic). ``build_configs()`` returns
  the ``TransformerConfig``, the ``GPTModel`` keyword arguments, the
  ``DistributedDataParallelConfig`` and the ``OptimizerConfig`` without touching CUDA or
  ``torch.distributed``; the launch sits under ``if __name__ == "__main__":``.
* ``launch.sh`` (``templates/launch.sh.j2``): one node, ``torch.distributed.run``.
* ``launch.sbatch``: SLURM, rendered by :func:`dlmspec.slurm.render_sbatch`.
* ``spec.lock.toml``: the fully resolved spec (every default filled in, so it loads and
  compiles to the same files) with a ``[lock]`` table: the sha256 of the canonical resolved
  spec (:func:`content_hash`), dlmspec's version and the derived values.
* ``plan.json``: :func:`dlmspec.plan.make_plan` ``(resolved).to_dict()``.

Spec strings enter the templates only through :mod:`dlmspec.escape`, as the filters ``py``
(a Python literal), ``docstring`` (text inside train.py's docstring), ``comment`` (text of a
``#`` comment; a literal shown in a comment is ``| py | comment``) and ``sh`` (a bash word);
the lock file is written by :func:`dlmspec.escape.toml_document`.

Nothing here imports torch or megatron.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import jinja2

from dlmspec import __version__
from dlmspec.credentials import ENVIRONMENT_FIX, HIDDEN, NEVER_WRITTEN, find_secret, spec_secrets
from dlmspec.errors import SpecError, SpecIssue
from dlmspec.escape import comment, py_docstring, py_literal, shell_word, toml_document
from dlmspec.loader import LoadedSpec, load
from dlmspec.resolve import Resolved, resolve
from dlmspec.slurm import REQUEUE_EXIT_CODE, render_sbatch
from dlmspec.spec import Spec
from dlmspec.tokenizers import read_json

#: Where the jinja2 templates live (``templates/`` at the repository root).
TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"

#: Every file name ``dlmspec compile`` may write; ``--force`` replaces these and only these.
GENERATED_FILES: tuple[str, ...] = ("launch.sbatch", "launch.sh", "plan.json", "spec.lock.toml", "train.py")

#: Files written executable (mode 0755); the others get 0644.
EXECUTABLE_FILES: frozenset[str] = frozenset({"launch.sbatch", "launch.sh"})

#: Python expressions of ``TransformerConfig.activation_func`` and ``gated_linear_unit`` per
#: ``[model] activation``, as Megatron-LM's ``--swiglu``/``--squared-relu`` arguments set them
#: (megatron/training/arguments.py; ``squared_relu`` from ``megatron.core.activations``).
ACTIVATIONS: dict[str, tuple[str, bool]] = {
    "gelu": ("F.gelu", False),
    "geglu": ("F.gelu", True),
    "relu": ("F.relu", False),
    "silu": ("F.silu", False),
    "squared_relu": ("squared_relu", False),
    "swiglu": ("F.silu", True),
}

#: ``torch`` dtype expression per ``[precision] dtype``.
DTYPES: dict[str, str] = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}


# --------------------------------------------------------------------------------------------
# Values the runtime needs that resolve.py does not derive (they concern the runtime only).


def run_dir(resolved: Resolved) -> str:
    """The runtime's ``LoggingConfig.run_dir`` (metrics.jsonl, exit_status.json, tensorboard/):
    ``logging.run_dir``, default ``runs/<name>``."""
    return resolved.spec.logging.run_dir or f"runs/{resolved.spec.name}"


def init_cache_dir(resolved: Resolved) -> str | None:
    """Where the runtime converts ``checkpoint.init_from = "hf:PATH"`` weights once
    (``CheckpointConfig.init_cache_dir``): ``<checkpoint.save>/init_from_hf``, or
    ``<run_dir>/init_from_hf`` for a run that saves nothing
    (``backends.megatron.init_from.default_cache_dir``); None unless ``init_from`` is ``hf:``."""
    init = resolved.spec.checkpoint.init_from
    if init is None or not init.startswith("hf:"):
        return None
    return posixpath.join(resolved.spec.checkpoint.save or run_dir(resolved), "init_from_hf")


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
    Unsupported(
        "model.moe_grouped_gemm",
        lambda r: r.spec.model.moe_grouped_gemm and r.spec.model.transformer_impl == "local",
        "grouped-GEMM experts need Transformer Engine; model.transformer_impl = 'local' has none",
        "set model.moe_grouped_gemm = false, or model.transformer_impl = \"transformer_engine\"",
    ),
    Unsupported(
        "objective.attention_mask",
        lambda r: r.attention_mask == "block_causal" and r.spec.model.transformer_impl != "local",
        "block-causal attention is implemented on the local + SDPA path only "
        "(backends/megatron/layers.py), not with Transformer Engine layers",
        "set model.transformer_impl = \"local\"",
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
                source="backends.megatron.data.DataConfig.eod_id",
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
                source="backends/megatron (dlmspec.compile.UNSUPPORTED)",
                file=file,
                line=line,
            )
        )
    return issues


# --------------------------------------------------------------------------------------------
# The resolved spec, its canonical form and hash.


def schedule(resolved: Resolved) -> dict[str, Any]:
    """Learning-rate schedule lengths in optimizer steps, as Megatron-LM derives them
    (megatron/training/training.py ``get_optimizer_param_scheduler``): decay over
    ``lr_decay_iters`` (default ``train_iters``); warmup ``lr_warmup_fraction * lr_decay_iters``
    when the fraction is set, else ``lr_warmup_iters``; WSD's decay phase ``lr_wsd_decay_iters``
    (default: the whole decay, i.e. ``lr_decay_iters``)."""
    tr = resolved.spec.train
    decay = tr.lr_decay_iters or resolved.train_iters
    warmup = int(tr.lr_warmup_fraction * decay) if tr.lr_warmup_fraction is not None else tr.lr_warmup_iters
    wsd = tr.lr_wsd_decay_iters or decay
    return {"lr_decay_iters": decay, "lr_warmup_iters": warmup, "lr_wsd_decay_iters": wsd}


def locked_spec(resolved: Resolved) -> Spec:
    """The spec with every default :func:`~dlmspec.resolve.resolve` fills written in (query
    groups, head dimension, expert TP, MoE FFN size, attention mask, mask token, train_iters)
    and the runtime's defaults (lr_decay_iters, checkpoint.load, logging.run_dir), without any
    ``[lock]`` table. The end-of-document id is not filled in (it may be read from tokenizer
    files, :func:`eod_choice`); ``[lock.derived]`` records it. Loading its TOML gives back
    the same :class:`Resolved`."""
    changes: dict[str, Any] = {
        "lock": None,
        "model.num_query_groups": resolved.num_query_groups,
        "model.kv_channels": resolved.kv_channels,
        "parallel.expert_tensor_parallel_size": resolved.etp,
        "objective.attention_mask": resolved.attention_mask,
    }
    if resolved.moe_ffn_hidden_size is not None:
        changes["model.moe_ffn_hidden_size"] = resolved.moe_ffn_hidden_size
    if resolved.mask_token_id is not None:
        changes["objective.mask_token_id"] = resolved.mask_token_id
    if resolved.train_iters > 0:
        changes["train.train_iters"] = resolved.train_iters
        changes["train.lr_decay_iters"] = schedule(resolved)["lr_decay_iters"]
    if resolved.spec.checkpoint.load is None and resolved.spec.checkpoint.save is not None:
        changes["checkpoint.load"] = resolved.spec.checkpoint.save
    changes["logging.run_dir"] = run_dir(resolved)
    return resolved.spec.replace(**changes)


def spec_data(spec: Spec) -> dict[str, Any]:
    """``spec`` as plain JSON/TOML data: unset (None) keys and the ``[lock]`` table left out."""
    return spec.model_dump(mode="json", exclude_none=True, exclude={"lock"})


def canonical_json(spec: Spec) -> str:
    """The canonical text of a spec: :func:`spec_data` as JSON with sorted keys, no whitespace,
    UTF-8 kept (``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``)."""
    return json.dumps(spec_data(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def content_hash(resolved: Resolved) -> str:
    """``"sha256:<hex>"`` of :func:`canonical_json` of :func:`locked_spec`: equal for two specs
    exactly when they resolve to the same run, however they were written (presets, defaults,
    ``extends``, ``--set``)."""
    text = canonical_json(locked_spec(resolved))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def render_lock(resolved: Resolved) -> str:
    """``spec.lock.toml``: the locked spec, then ``[lock]`` with the content hash, dlmspec's
    version and the derived values (data-parallel size, microbatches, padded vocabulary,
    parameter counts). No timestamps: the same spec gives the same bytes."""
    data = spec_data(locked_spec(resolved))
    derived = {k: v for k, v in resolved.derived().items() if v is not None}
    derived["parameters"] = dict(sorted(derived["parameters"].items()))
    eod = eod_choice(resolved.spec)
    derived["eod_id"] = eod.value
    derived["eod_id_source"] = eod.source
    derived.update(schedule(resolved))
    derived = dict(sorted(derived.items()))
    data["lock"] = {
        "content_hash": content_hash(resolved),
        "hash_of": "sha256 of the canonical JSON (sorted keys, no whitespace) of every table above",
        "dlmspec_version": __version__,
        "derived": derived,
    }
    header = (
        "# Fully resolved spec written by `dlmspec compile`: every default is filled in, so this file\n"
        "# loads and compiles to the same train.py. [lock] is informational and not hashed.\n"
    )
    return header + toml_document(data)


# --------------------------------------------------------------------------------------------
# Rendering.


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    # The only ways a value enters a template (dlmspec.escape): a Python literal, docstring text,
    # comment text, a shell word. A literal shown in a comment is `| py | comment`.
    env.filters["py"] = py_literal
    env.filters["docstring"] = py_docstring
    env.filters["comment"] = comment
    env.filters["sh"] = lambda v: shell_word(str(v))
    env.filters["thousands"] = lambda n: f"{n:,}"
    return env


def template_context(resolved: Resolved, spec_label: str) -> dict[str, Any]:
    """What the templates read.

    Keys: ``r`` (the :class:`Resolved`: parallel sizes, dp, microbatches, padded vocabulary,
    query groups, head dimension, MoE FFN size, attention mask, mask token, train_iters,
    parameter counts), ``s`` (:func:`locked_spec`, every default filled), ``spec_label`` (the
    spec path as given), ``content_hash``, ``version``, ``activation_func`` /
    ``gated_linear_unit`` (:data:`ACTIVATIONS`), ``bias_activation_fusion`` (megatron-core fuses
    bias + activation for gelu with a bias, GeGLU and SwiGLU only: ``MLP.forward``), ``dtype``
    (:data:`DTYPES`), ``schedule`` (:func:`schedule`), ``rotary_base`` (an int when integral:
    ``GPTModel`` types it ``int``), ``use_transformer_engine`` (None/True/False for
    ``transformer_impl`` auto/transformer_engine/local), ``run_path`` (one line naming the layer
    implementation), ``eod`` (:func:`eod_choice`), ``blend`` / ``valid_blend`` (``[prefix,
    weight]`` pairs), ``run_dir`` (:func:`run_dir`), ``peak_tflops`` / ``peak_source`` (dense
    bf16 peak of ``cluster.gpu`` in TFLOP/s, the fp32 figure for fp32 runs; None for a GPU
    outside the catalog), ``requeue_exit_code`` (:data:`dlmspec.slurm.REQUEUE_EXIT_CODE`),
    ``max_connections_1`` (``CUDA_DEVICE_MAX_CONNECTIONS=1``: TP > 1 or sequence parallel,
    so megatron-core's TP communication is issued in order with compute; never with Megatron-FSDP,
    which Megatron-LM refuses to run with it), ``grad_reduce_group``
    (GPUs a gradient is reduced over, data x context parallel = world / (TP x PP), as
    megatron-core's DDP reduces over the data-parallel group with context parallelism; the
    overlap switches are written False when it is 1: nothing to overlap), ``init_cache_dir``
    (:func:`init_cache_dir`).
    """
    s = locked_spec(resolved)
    m = s.model
    act, glu = ACTIVATIONS[m.activation]
    base = m.rotary_base
    gpu = resolved.gpu
    if gpu is None:
        peak, peak_source = None, f"GPU {s.cluster.gpu!r} is not in the catalog: no MFU"
    elif s.precision.dtype == "fp32":
        peak, peak_source = float(gpu.fp32_tflops), f"{gpu.name}, dense fp32 peak"
    else:
        peak, peak_source = float(gpu.bf16_tflops), f"{gpu.name}, dense bf16 peak"
    impl = m.transformer_impl
    run_path = {
        "auto": "Transformer Engine layer specs when transformer_engine imports on the GPU machine, "
        "else megatron-core's local spec with SDPA attention",
        "transformer_engine": "Transformer Engine layer specs (required)",
        "local": "megatron-core's local spec with SDPA attention (backends/megatron/attention.py)",
    }[impl]
    fusion = m.activation in ("swiglu", "geglu") or (m.activation == "gelu" and m.add_bias_linear)
    return {
        "r": resolved,
        "s": s,
        "spec_label": spec_label,
        "content_hash": content_hash(resolved),
        "version": __version__,
        "activation_func": act,
        "gated_linear_unit": glu,
        "bias_activation_fusion": fusion,
        "dtype": DTYPES[s.precision.dtype],
        "schedule": schedule(resolved),
        "rotary_base": int(base) if float(base).is_integer() else float(base),
        "use_transformer_engine": {"auto": None, "transformer_engine": True, "local": False}[impl],
        "run_path": f"transformer_impl = {impl!r}: {run_path}",
        "eod": eod_choice(resolved.spec),
        "blend": [(e.prefix, e.weight) for e in s.data.train],
        "valid_blend": [(e.prefix, e.weight) for e in s.data.valid],
        "run_dir": run_dir(resolved),
        "peak_tflops": peak,
        "peak_source": peak_source,
        "requeue_exit_code": REQUEUE_EXIT_CODE,
        "max_connections_1": (resolved.tp > 1 or s.parallel.sequence_parallel) and s.parallel.fsdp != "megatron",
        "grad_reduce_group": max(1, resolved.world_size // (resolved.tp * resolved.pp)),
        "init_cache_dir": init_cache_dir(resolved),
    }


def _optional_module(name: str) -> Any:
    """Import ``dlmspec.<name>`` if another part of dlmspec provides it, else None."""
    import importlib

    try:
        return importlib.import_module(f"dlmspec.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"dlmspec.{name}":
            return None
        raise


def _refuse_secrets(resolved: Resolved, files: dict[str, str]) -> None:
    """The last gate before files are written (:func:`check_spec` refuses these first): a
    secret in the spec (:func:`dlmspec.credentials.spec_secrets`), else a token in a file."""
    found = list(spec_secrets(resolved.spec)) or [
        (name, what) for name, text in files.items() if (what := find_secret(text, assignments=False))]
    if found:
        raise SpecError([SpecIssue(key, f"holds {what}; {NEVER_WRITTEN}", value=HIDDEN, hint=ENVIRONMENT_FIX,
                                   rule="secret-in-spec", source="dlmspec.credentials") for key, what in found])


def render(resolved: Resolved, spec_label: str) -> dict[str, str]:
    """Every output file's text, by file name (sorted). Pure: the same ``resolved`` and
    ``spec_label`` give the same bytes. ``launch.sbatch`` is rendered by
    :func:`dlmspec.slurm.render_sbatch` and ``plan.json`` by :func:`dlmspec.plan.make_plan`,
    each only where that module exists.

    Raises:
        SpecError: the spec holds a secret, or a file would (rule ``secret-in-spec``).
    """
    env = _environment()
    context = template_context(resolved, spec_label)
    files = {
        "train.py": env.get_template("train.py.j2").render(context),
        "launch.sh": env.get_template("launch.sh.j2").render(context),
        "spec.lock.toml": render_lock(resolved),
    }
    files["launch.sbatch"] = render_sbatch(resolved)
    plan = _optional_module("plan")
    if plan is not None and hasattr(plan, "make_plan"):
        try:
            data = plan.make_plan(resolved).to_dict()
        except ValueError as exc:  # dlmspec.plan.PlanError: a spec the planner cannot model
            raise SpecError([SpecIssue("<plan>", f"cannot plan this spec: {exc}", rule="plan",
                                       source="dlmspec.plan.make_plan")]) from None
        files["plan.json"] = json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"
    _refuse_secrets(resolved, files)
    return dict(sorted(files.items()))


# --------------------------------------------------------------------------------------------
# Writing.


def _output_issue(out_dir: Path, message: str, hint: str) -> SpecError:
    return SpecError([SpecIssue(key="--output", message=message, value=str(out_dir), hint=hint, rule="output-dir")])


def check_output_dir(out_dir: Path, *, force: bool, names: Iterable[str] = GENERATED_FILES) -> None:
    """Refuse an output path that is a file, a directory that holds anything (unless
    ``force``), or one with a directory where a generated file goes.

    Raises:
        SpecError: with key ``--output`` and the fix.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise _output_issue(out_dir, "the output path exists and is not a directory",
                            "choose a directory path with -o")
    if not out_dir.is_dir():
        return
    present = sorted(p.name for p in out_dir.iterdir())
    if present and not force:
        shown = ", ".join(present[:5]) + (", ..." if len(present) > 5 else "")
        raise _output_issue(
            out_dir,
            f"the output directory is not empty ({shown})",
            "pass --force to replace the files dlmspec generates (other files are kept), "
            "or choose an empty or new directory",
        )
    blocked = [n for n in sorted(set(names) | set(GENERATED_FILES)) if (out_dir / n).is_dir()]
    if blocked:
        raise _output_issue(out_dir, f"{', '.join(blocked)} in the output directory is a directory, "
                            "where dlmspec writes a file", "move it away or choose another directory")


def write_outputs(files: dict[str, str], out_dir: Path, *, force: bool = False) -> list[Path]:
    """Write ``files`` into ``out_dir`` (created if missing), each atomically (temporary file,
    then ``os.replace``), scripts mode 0755 and the rest 0644.

    A directory that holds anything is refused unless ``force``; with ``force`` the generated
    files are replaced, names of :data:`GENERATED_FILES` this compile does not produce are
    removed (they belong to an earlier compile), and every other file is left alone.

    Returns:
        The written paths, sorted.

    Raises:
        SpecError: ``out_dir`` is a file, is not empty (without ``force``), has a directory
            where a generated file goes, or cannot be written.
    """
    check_output_dir(out_dir, force=force, names=files)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in sorted(files.items()):
            target = out_dir / name
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=out_dir)
            try:
                with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
                    handle.write(text)
                os.chmod(tmp, 0o755 if name in EXECUTABLE_FILES else 0o644)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            written.append(target)
        for name in GENERATED_FILES:
            stale = out_dir / name
            if name not in files and stale.is_file():
                stale.unlink()
    except OSError as exc:
        raise _output_issue(out_dir, f"cannot write the output: {exc.strerror or exc}",
                            "check the directory's permissions and free space") from None
    return written


# --------------------------------------------------------------------------------------------
# The command.


@dataclass(frozen=True)
class CompileResult:
    """What :func:`compile_spec` did.

    Attributes:
        out_dir: the output directory.
        files: the written paths, sorted.
        content_hash: ``"sha256:..."`` of the resolved spec (:func:`content_hash`).
        resolved: the resolved spec.
        warnings: the validator's warnings (legal but probably unintended settings).
    """

    out_dir: Path
    files: list[Path]
    content_hash: str
    resolved: Resolved
    warnings: list[SpecIssue]


def check_spec(loaded: LoadedSpec, resolved: Resolved) -> list[SpecIssue]:
    """Everything that stops a compile: the validator's rules
    (:func:`dlmspec.validate.find_issues`), the runtime's gaps (:func:`unsupported_issues`) and
    the SLURM settings (:func:`dlmspec.slurm.sbatch_issues`), as ``dlmspec check`` reports them.

    Returns:
        The warnings.

    Raises:
        SpecError: at least one error; ``issues`` holds every error and warning.
    """
    from dlmspec.slurm import sbatch_issues
    from dlmspec.validate import find_issues

    issues = [*find_issues(loaded, resolved), *unsupported_issues(resolved, loaded), *sbatch_issues(resolved, loaded)]
    issues.sort(key=lambda i: (i.severity != "error", i.file or "", i.line if i.line is not None else 1 << 30, i.key, i.rule))
    if any(i.severity == "error" for i in issues):
        raise SpecError(issues)
    return issues


def compile_spec(
    spec_path: str | Path,
    out_dir: str | Path,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    force: bool = False,
) -> CompileResult:
    """Load, resolve and check a spec, then render and write its files.

    Args:
        spec_path: the spec file (``.toml`` or ``.py``).
        out_dir: where the files go (see :func:`write_outputs` for ``force``).
        overrides: ``--set section.key=value`` strings.
        force: replace generated files in a non-empty directory.

    Raises:
        SpecError: an invalid spec, a setting the runtime cannot run, or an unusable output
            directory (the CLI prints it and exits with code 2).
    """
    out = Path(out_dir)
    check_output_dir(out, force=force)  # before any work: a refused directory costs nothing
    loaded = load(spec_path, overrides)
    resolved = resolve(loaded.spec)
    warnings = check_spec(loaded, resolved)
    files = render(resolved, Path(spec_path).as_posix())
    written = write_outputs(files, out, force=force)
    return CompileResult(out, written, content_hash(resolved), resolved, warnings)


__all__ = [
    "ACTIVATIONS",
    "CompileResult",
    "DTYPES",
    "EodChoice",
    "GENERATED_FILES",
    "UNSUPPORTED",
    "canonical_json",
    "check_output_dir",
    "check_spec",
    "compile_spec",
    "content_hash",
    "eod_choice",
    "eod_used_by",
    "locked_spec",
    "render",
    "render_lock",
    "run_dir",
    "schedule",
    "template_context",
    "unsupported_issues",
    "write_outputs",
]
