"""``dlmspec generate`` and ``dlmspec eval``: sample from a trained model and measure it.

Both load the model with :func:`dlmspec.backends.generate.load.load_model` (a run folder, a save
folder, one ``iter_*`` checkpoint, a converted or a Hugging Face checkpoint) and run
:mod:`dlmspec.backends.generate` (the sampler, the ELBO estimators, multiple choice). torch and
megatron-core are imported inside the commands, so ``import dlmspec.cli`` stays light.

The settings of ``generate`` (:mod:`dlmspec.cli.generate_options`), lowest first: ``GenerateConfig``'s
defaults (LLaDA's), the ``[generate]`` table of the checkpoint's ``spec.lock.toml``, the
``[generate]`` table of ``--spec FILE``, then the flags. The values used, and where each came
from, are recorded with every output. The input files (prompts, choices, a dataset) are read by
:mod:`dlmspec.cli.generate_inputs`. This module holds the commands, loading the model and what
they print (escaped for the terminal). Bad input (a flag, a file, a spec value, a path that is no
checkpoint) is an issue table (or the ``--json`` envelope) naming the flag or key, the value, why
and a fix: exit code 2. docs/generate.md, "The commands".
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Callable, Optional

import typer

from dlmspec import objectives
from dlmspec.cli.generate_inputs import dataset_windows, find_dataset, read_choices, read_prompts
from dlmspec.cli.generate_options import (
    _issue,
    check_token_ids,
    flag_value_issues,
    load_flag_issues,
    resolve_settings,
)
from dlmspec.cli.help import MARKUP_MODE, Command, Group
from dlmspec.cli.output import command_name, print_envelope, printable, stderr, stdout, use_json
from dlmspec.errors import SpecError

app = typer.Typer(cls=Group, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=MARKUP_MODE)


#: The default ELBO estimator of ``eval`` (LLaDA Eq. 6: the lower-variance one; docs/generate.md).
DEFAULT_ESTIMATOR = "count"


_MODEL_HELP = ("A run folder (runs/NAME), its checkpoints folder (latest names the checkpoint), one iter_* folder, "
               "a `dlmspec convert hf-to-mcore` folder or a Hugging Face folder.")


def _load(path: str, device: str, dtype: Optional[str], kind: Optional[str], mask_token_id: Optional[int]) -> Any:
    from dlmspec.backends.launch.no_gpu import quiet_megatron_without_gpu

    quiet_megatron_without_gpu()  # before megatron-core's imports: without a GPU its warnings bury our message
    from dlmspec.backends.generate.load import LoadError, load_model

    try:
        return load_model(path, device=device, dtype=dtype, kind=kind, mask_token_id=mask_token_id)
    except LoadError as exc:
        key = "RUN_OR_CHECKPOINT"
        if exc.path in (device, str(device)):
            key = "--device"
        raise _issue(key, exc.path, exc.why, exc.fix, rule="generate-load") from None
    except (RuntimeError, ValueError) as exc:
        from dlmspec.backends.generate.checkpoint import OUT_OF_MEMORY_FIX, describe_read_error, is_out_of_memory

        if is_out_of_memory(exc):
            raise _issue("--device", device, f"the GPU ran out of memory while the model loaded "
                         f"({describe_read_error(exc)})", OUT_OF_MEMORY_FIX) from None
        if "device" in str(exc).lower():
            raise _issue("--device", device, str(exc)[:300], "--device cpu or --device cuda") from None
        raise


def _out_of_memory(exc: RuntimeError, batch_size: int, doing: str) -> Optional[SpecError]:
    """The :class:`SpecError` ``generate`` / ``eval`` raise when their GPU work ran out of memory: on
    ``--batch-size``, with half of it, freeing the GPU or the CPU as remedies; ``None`` for another
    error (the caller re-raises it)."""
    from dlmspec.backends.generate.checkpoint import OUT_OF_MEMORY_FIX, describe_read_error, is_out_of_memory

    if not is_out_of_memory(exc):
        return None
    return _issue("--batch-size", batch_size, f"the GPU ran out of memory while {doing} ({describe_read_error(exc)})",
                  f"--batch-size {max(1, batch_size // 2)}; or {OUT_OF_MEMORY_FIX}")


def _refuse_before_loading(problems: list[Any], model_path: str) -> None:
    """Raise the input problems found before the model loads, as one :class:`SpecError`, with a
    ``model_path`` that does not exist among them (nothing when there are none)."""
    if not problems:
        return
    if not os.path.exists(model_path):
        problems.extend(_issue("RUN_OR_CHECKPOINT", model_path, "does not exist",
                               "a run folder (runs/NAME), its checkpoints folder or a Hugging Face folder",
                               rule="generate-load").issues)
    raise SpecError(problems)


def _collect(problems: list[Any], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or ``None`` with its :class:`SpecError`'s issues added to ``problems``."""
    try:
        return fn(*args)
    except SpecError as exc:
        problems.extend(exc.issues)
        return None


def _model_info(model: Any) -> dict[str, Any]:
    return {"path": model.path, "source": model.source, "kind": model.kind, "iteration": model.iteration,
            "name": model.record.get("name"), "vocab_size": model.vocab_size, "device": str(model.device),
            "mask_token_id": model.mask_token_id, "eos_token_id": model.eos_token_id}


def _spec_table(spec: Optional[str]) -> tuple[Optional[dict[str, Any]], Optional[Callable[[str], Any]]]:
    if spec is None:
        return None, None
    import dlmspec.resolve  # noqa: F401 - gives the loader its check of lock/show files' written defaults
    from dlmspec.spec.load import load

    loaded = load(spec)  # a SpecError (file, line, key) is reported by the group
    table = loaded.spec.generate
    if table is None:
        return {}, loaded.locate
    return table.model_dump(exclude_unset=True), loaded.locate


def terminal_safe(text: str) -> str:
    """``text`` as it may reach the terminal: :func:`dlmspec.cli.output.printable` keeping
    newlines and tabs (``"\\x1b[2J"`` prints as the text ``\\x1b[2J``), so a prompt, a generated
    text or a path cannot move the cursor, clear the screen or retitle the terminal. Used with
    :class:`rich.text.Text`, which never reads ``[bold]`` as markup."""
    return printable(text, keep_newlines=True)


def _print_outputs(console: Any, outputs: list[dict[str, Any]], has_tokenizer: bool) -> None:
    """Each output on the terminal: the prompt (dim) and the generated text after it; for a model
    without a tokenizer (ids shown as numbers) the prompt's ids and the generated ids on lines of
    their own, so the two never run together."""
    from rich.text import Text

    for out in outputs:
        if has_tokenizer:
            console.print(Text(terminal_safe(out["prompt_text"]), style="dim"), Text(terminal_safe(out["text"])), sep="")
        else:
            console.print(Text("prompt ids: " + " ".join(map(str, out["prompt_ids"])), style="dim"))
            console.print(Text("generated ids: " + (" ".join(map(str, out["ids"])) or "(none)")))
        console.print(Text(f"[{out['finish_reason']}, {len(out['ids'])} tokens]", style="dim"))


def render_canvas(model: Any, ids: list[int], mask_id: Optional[int], placeholder: str = "\u2591") -> str:
    """The text of a partly decoded region: each run of committed ids decoded, each mask shown as
    ``placeholder``."""
    parts, run = [], []
    for t in ids:
        if mask_id is not None and t == mask_id:
            if run:
                parts.append(model.decode(run))
                run = []
            parts.append(placeholder)
        else:
            run.append(t)
    if run:
        parts.append(model.decode(run))
    return "".join(parts)


class _Stream:
    """``on_step`` of the sampler: a progress bar over the steps and, on a terminal, the canvas of
    the batch's rows redrawn after each step (rich ``Live``)."""

    def __init__(self, model: Any, config: Any, total_steps: int, live: bool, progress: bool) -> None:
        self.model, self.config = model, config
        self.live = self.bar = None
        if not (live or progress):
            return
        from rich.console import Group as RichGroup
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.text import Text

        self._group, self._text = RichGroup, Text
        self.bar = Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=stderr(), transient=True, disable=not progress)
        self.task = self.bar.add_task("steps", total=total_steps)
        if live:
            self.live = Live(console=stdout(), transient=True, auto_refresh=False)
            self.live.start()
        elif progress:
            self.bar.start()

    def __call__(self, event: Any) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)
        if self.live is not None:
            rows = event.tokens[:4, event.prompt_length:].tolist()
            texts = [self._text(terminal_safe(render_canvas(self.model, r, self.config.mask_token_id))) for r in rows]
            self.live.update(self._group(*texts, self.bar), refresh=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
        elif self.bar is not None:
            self.bar.stop()


def decoding_plan(model: Any, config: Any, kv_cache: bool) -> tuple[bool, Optional[str], str]:
    """How ``generate`` decodes: ``(kv_cache used, why not or None, the recorded "decoding" line)``.

    An AR model decodes with megatron-core's KV cache (``LoadedModel.ar_step_fn``) unless
    ``--no-kv-cache`` is given or the model cannot (``LoadedModel.kv_cache_fallback``: a diffusion
    LM, Transformer Engine layers, ...); then with full recompute (the whole sequence each token).
    """
    if objectives.get(config.kind).diffusion:
        why = getattr(model, "kv_cache_fallback", None) or "a diffusion LM"
        return False, (f"masked diffusion ({why}; the AR KV cache is for AR models: [generate] cache = "
                       "\"prefix\" / \"dual\" are the block caches)"), "masked diffusion"
    why = None if kv_cache else "--no-kv-cache"
    if why is None:
        why = getattr(model, "kv_cache_fallback", "the model gives no KV cache step")
    if why is None:
        return True, None, "left to right, megatron-core KV cache (one prefill, then one column per token)"
    return False, why, "left to right, full recompute (no KV cache)"


def _run_generate(model: Any, prompts: list[dict[str, Any]], config: Any, batch_size: int, stream: bool,
                  progress: bool, kv_cache: bool = False) -> dict[str, Any]:
    import torch

    from dlmspec.backends.generate.sampler import generate, generate_ar

    encoded = []
    for p in prompts:
        if "prompt_ids" in p:
            ids = p["prompt_ids"]
            bad = [i for i in ids if i >= model.vocab_size or i == config.mask_token_id]
            if bad:
                raise _issue("--prompts", bad[0], f"prompt_ids hold {bad[0]}: the mask token or outside the "
                             f"vocabulary of {model.vocab_size}", "ids of the model's tokenizer")
        else:
            if model.tokenizer is None:
                raise _issue("--prompt", p["prompt"], f"the model's tokenizer cannot be built ({model.tokenizer_error})",
                             'run from the folder the training ran in, or give {"prompt_ids": [...]} in --prompts')
            ids = model.encode(p["prompt"])
            if not ids:
                raise _issue("--prompt", p["prompt"], "tokenizes to no token", "a prompt with at least one token")
        if model.max_length and len(ids) + config.gen_length > model.max_length:
            raise _issue("--gen-length", config.gen_length, f"a prompt of {len(ids)} tokens plus {config.gen_length} "
                         f"exceeds the model's max_position_embeddings = {model.max_length}",
                         f"--gen-length {max(1, model.max_length - len(ids))} or a shorter prompt")
        encoded.append(ids)
    outputs: list[dict[str, Any]] = []
    passes = steps = 0
    cache: dict[str, Any] = {}
    objective = objectives.get(config.kind)
    if objective.block_diffusion:
        return _run_block_diffusion(model, prompts, encoded, config, batch_size)
    sampler = generate if objective.diffusion else generate_ar
    per_batch = config.gen_length if objective.predicts_next_token or config.remasking in ("threshold", "factor") else config.steps
    start = time.perf_counter()
    for first in range(0, len(encoded), batch_size):
        batch = encoded[first:first + batch_size]
        gen = torch.Generator(device=model.device).manual_seed(config.seed + first)
        streamer = _Stream(model, config, per_batch, live=stream, progress=progress)
        try:
            kwargs = {"step_fn": model.ar_step_fn(max_new_tokens=config.gen_length)} if kv_cache else {}
            if sampler is generate:  # the transfer schedule follows the model's masking schedule
                kwargs["noise_schedule"] = getattr(model, "noise_schedule", None)
            out = sampler(model.logits_fn, batch, config, on_step=streamer, generator=gen, device=model.device,
                          **kwargs)
        finally:
            streamer.close()
        passes += out.forward_passes
        steps += out.steps
        cache = {"cache": out.cache, "cache_fallback": out.cache_fallback, "cuda_graph_fallback": out.cuda_graph_fallback}
        for i, (ids, reason) in enumerate(zip(out.generated, out.finish_reasons)):
            outputs.append({"prompt": prompts[first + i].get("prompt"), "prompt_ids": batch[i],
                            "prompt_text": model.decode(batch[i]), "text": model.decode(ids), "ids": ids,
                            "finish_reason": reason, "batch": first // batch_size, "seed": config.seed + first,
                            "forward_passes": out.forward_passes_per_row[i]})
    seconds = time.perf_counter() - start
    generated = sum(len(o["ids"]) for o in outputs)
    return {"outputs": outputs, "forward_passes": passes, "steps": steps, "seconds": seconds, **cache,
            "generated_tokens": generated, "tokens_per_second": generated / seconds if seconds > 0 else None}


def _run_block_diffusion(model: Any, prompts: list[dict[str, Any]], encoded: list[list[int]], config: Any,
                         batch_size: int) -> dict[str, Any]:
    """A block-diffusion model (BD3-LM) samples block by block with the exact KV cache of its clean
    prefix (:func:`dlmspec.backends.generate.block_diffusion.bd3_generate`); prompts and
    ``--gen-length`` are whole blocks of the model's ``objective.block_size``, and ``--steps`` are
    spread evenly over the blocks."""
    import torch

    from dlmspec.backends.generate.block_diffusion import bd3_generate

    block = int(model.record["objective.block_size"])
    if config.gen_length % block:
        raise _issue("--gen-length", config.gen_length, f"not a whole number of the model's blocks of {block}",
                     f"--gen-length {max(block, config.gen_length // block * block)}")
    for ids in encoded:
        if len(ids) % block:
            raise _issue("--prompt", len(ids), f"a prompt of {len(ids)} tokens is not a whole number of the model's "
                         f"blocks of {block} (blocks start at position 0)",
                         f"a prompt of {(len(ids) // block + 1) * block} tokens (prepend EOS tokens)")
    per_block = max(1, min(block, config.steps // (config.gen_length // block)))
    outputs, start = [], time.perf_counter()
    for first in range(0, len(encoded), batch_size):
        rows = encoded[first:first + batch_size]
        for length in sorted({len(r) for r in rows}):  # one batch per prompt length (no padding)
            idx = [i for i, r in enumerate(rows) if len(r) == length]
            prompt = torch.tensor([rows[i] for i in idx], dtype=torch.int64, device=model.device)
            gen = torch.Generator(device=model.device).manual_seed(config.seed + first)
            seqs = bd3_generate(model.model, prompt, gen_length=config.gen_length, block_size=block,
                                steps_per_block=per_block, mask_token_id=model.mask_token_id, cache=True,
                                temperature=config.temperature, generator=gen, vocab_size=model.vocab_size)
            for j, i in enumerate(idx):
                ids = seqs[j, length:].tolist()
                outputs.append({"prompt": prompts[first + i].get("prompt"), "prompt_ids": rows[i],
                                "prompt_text": model.decode(rows[i]), "text": model.decode(ids), "ids": ids,
                                "finish_reason": "length", "batch": first // batch_size, "seed": config.seed + first})
    seconds = time.perf_counter() - start
    generated = sum(len(o["ids"]) for o in outputs)
    blocks = config.gen_length // block
    return {"outputs": outputs, "forward_passes": blocks * (per_block + 1) * len(outputs), "steps": blocks * per_block,
            "seconds": seconds, "generated_tokens": generated,
            "tokens_per_second": generated / seconds if seconds > 0 else None}


@app.command("generate", cls=Command)
def generate_command(
    ctx: typer.Context,
    model_path: str = typer.Argument(..., metavar="RUN_OR_CHECKPOINT", help=_MODEL_HELP),
    prompt: list[str] = typer.Option([], "--prompt", help="A prompt (repeatable)."),
    prompts_file: Optional[str] = typer.Option(None, "--prompts", help='JSONL of {"prompt": TEXT} per line.'),
    spec: Optional[str] = typer.Option(None, "--spec", help="A spec file whose [generate] table sets the defaults (over the checkpoint's; only that table is read)."),
    gen_length: Optional[int] = typer.Option(None, "--gen-length", help="Tokens generated after each prompt (128)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Denoising steps over --gen-length (128)."),
    block_length: Optional[int] = typer.Option(None, "--block-length", help="Semi-autoregressive block (128)."),
    remasking: Optional[str] = typer.Option(None, "--remasking", help="low_confidence (default), random, threshold or factor."),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="--remasking threshold: confidence (0.9)."),
    factor: Optional[float] = typer.Option(None, "--factor", help="--remasking factor: Fast-dLLM's f (1.0)."),
    cache: Optional[str] = typer.Option(None, "--cache", help="Block KV cache: none (default), prefix or dual (Fast-dLLM)."),
    cache_refresh: Optional[int] = typer.Option(None, "--cache-refresh", help="Steps between cache refreshes in a block (default: at each block's start)."),
    cuda_graph: Optional[bool] = typer.Option(None, "--cuda-graph/--no-cuda-graph", help="Replay the model's forward as CUDA graphs, one per shape (default on a GPU; recorded as a no-op on CPU)."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="0 is greedy (default)."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Keep the top-k logits (all)."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Nucleus mass (all)."),
    cfg_scale: Optional[float] = typer.Option(None, "--cfg-scale", help="Classifier-free guidance w, MDM (0)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the sampler (0); batch b draws from seed + b x batch size."),
    mask_token_id: Optional[int] = typer.Option(None, "--mask-token-id", help="Default: the run's mask token ([objective] mask_token_id)."),
    eos_token_id: Optional[int] = typer.Option(None, "--eos-token-id", help="Default: the run's data.eod_id; -1: no EOS."),
    pad_token_id: Optional[int] = typer.Option(None, "--pad-token-id", help="Left padding's id (default: EOS)."),
    kind: Optional[str] = typer.Option(None, "--kind", help="mdm or ar: converted checkpoints only (default: by family)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Prompts sampled together."),
    device: str = typer.Option("auto", "--device", help="cuda, cuda:N, cpu or auto (a GPU if visible)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16, fp16 or fp32 (default: the run's on a GPU, fp32 on CPU)."),
    stream: Optional[bool] = typer.Option(None, "--stream/--no-stream", help="Redraw the text after each step (default: on a terminal)."),
    kv_cache: bool = typer.Option(True, "--kv-cache/--no-kv-cache", help="AR: decode with megatron-core's KV cache where the model allows it (default), or recompute the whole sequence per token."),
    json_output: bool = typer.Option(False, "--json", help="Print the outputs and settings as JSON on stdout."),
) -> None:
    """Sample text from a trained model: masked diffusion for an mdm run, left to right for an ar run.

    Every output records the settings it was made with (and where each came from: default,
    model, checkpoint, spec, flag). AR models decode with megatron-core's KV cache where their
    layers allow it (the local layer spec), else with full recompute (recorded: kv_cache, kv_cache_fallback).
    """
    use_json(ctx, json_output)
    flags = dict(gen_length=gen_length, steps=steps, block_length=block_length, remasking=remasking,
                 threshold=threshold, factor=factor, cache=cache, cache_refresh=cache_refresh, cuda_graph=cuda_graph, temperature=temperature, top_k=top_k, top_p=top_p, cfg_scale=cfg_scale,
                 seed=seed, mask_token_id=mask_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    # every input problem found before the model loads is reported at once (a missing run beside them)
    problems = list(flag_value_issues(flags)) + load_flag_issues(device, dtype, kind)
    if batch_size < 1:
        problems.extend(_issue("--batch-size", batch_size, "must be >= 1", "--batch-size 8").issues)
    texts = _collect(problems, read_prompts, prompt, prompts_file)
    spec_table, locate = _collect(problems, _spec_table, spec) or (None, None)
    _refuse_before_loading(problems, model_path)
    model = _load(model_path, device, dtype, kind, mask_token_id)
    try:
        config, settings = resolve_settings(
            kind=model.kind, mask_token_id=model.mask_token_id, eos_token_id=model.eos_token_id,
            pad_token_id=None, lock_table=model.generate_table,
            lock_file=os.path.join(model.path, "spec.lock.toml"), spec_table=spec_table, spec_locate=locate,
            flags=flags)
        check_token_ids(model, config, settings)
        on_terminal = sys.stdout.isatty() and not json_output
        live = on_terminal if stream is None else (stream and not json_output)
        cached, fallback, decoding = decoding_plan(model, config, kv_cache)
        run = _run_generate(model, texts, config, batch_size, live, progress=sys.stderr.isatty(), kv_cache=cached)
    except RuntimeError as exc:  # torch's OutOfMemoryError is one
        refused = _out_of_memory(exc, batch_size, "sampling")
        if refused is None:
            raise
        raise refused from None
    finally:
        model.close()
    recorded = {**config.to_dict(), "preset": settings.preset, "batch_size": batch_size, "dtype": dtype or "default",
                "decoding": decoding,
                "kv_cache": cached, "kv_cache_fallback": fallback}
    for out in run["outputs"]:
        out["settings"] = recorded
    lock = os.path.join(model.path, "spec.lock.toml")
    sources = {"checkpoint": lock if model.generate_table is not None else None, "spec": spec}
    result = {"model": _model_info(model), "settings": recorded, "origins": settings.origins, "sources": sources, **run}
    if json_output:
        print_envelope(command_name(ctx), ok=True, result=result)
        return
    console = stdout()
    from rich.text import Text

    _print_outputs(console, run["outputs"], model.tokenizer is not None)
    shown = ", ".join(f"{k} = {v}" for k, v in config.to_dict().items() if v is not None)
    console.print(Text(f"settings: {shown}; {run['forward_passes']} forward passes, "
                       f"{run['generated_tokens']} tokens in {run['seconds']:.2f} s", style="dim"))
    for name, why in (("cache", run.get("cache_fallback")), ("cuda_graph", run.get("cuda_graph_fallback")),
                      ("kv_cache", fallback if kv_cache and not objectives.get(config.kind).diffusion else None)):
        if why:  # a setting asked for that did not run as asked: say what ran instead, as the JSON does
            console.print(Text(terminal_safe(f"{name}: {why}"), style="dim"))


def _progress(total: int, label: str) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=stderr(),
                   transient=True, disable=not sys.stderr.isatty())
    task = bar.add_task(label, total=total)
    return bar, task


def score_dataset(model: Any, windows: Any, *, estimators: list[str], num_samples: int, samples_per_forward: int,
                  eps: float, seed: int, batch_size: int, show_progress: bool = True) -> dict[str, Any]:
    """The dataset's scores: AR perplexity, or for MDM the ELBO bound per estimator.

    Each estimator draws from its own generator seeded with ``seed``, batch after batch of
    ``batch_size`` windows, so the library reproduces the numbers: ``elbo_nll(logits_fn, batch,
    generator=torch.Generator(device).manual_seed(seed), ...)`` over the same batches, merged with
    ``merge_elbo_results``.
    """
    import torch

    from dlmspec.backends.generate.likelihood import ar_nll, elbo_nll, merge_elbo_results

    windows = windows.to(model.device)
    batches = [windows[i:i + batch_size] for i in range(0, windows.shape[0], batch_size)]
    if objectives.get(model.kind).predicts_next_token:
        bar, task = _progress(len(batches), "perplexity (AR)")
        parts = []
        with bar:
            for b in batches:
                parts.append(ar_nll(model.logits_fn, b).nll)
                bar.advance(task)
        nll = torch.cat(parts)
        tokens = (windows.shape[1] - 1) * windows.shape[0]
        per_token = float(nll.sum()) / tokens
        return {"ar": {"nll_per_token": per_token, "perplexity": math.exp(per_token), "num_tokens": tokens,
                       "num_sequences": int(windows.shape[0]), "exact": True}}
    out: dict[str, Any] = {}
    if objectives.get(model.kind).block_diffusion:  # BD3-LM's NELBO: a t per block, x_t (+) x_0 under its mask
        from dlmspec.backends.generate.block_diffusion import bd3_forward
        from dlmspec.backends.generate.likelihood import bd3_nelbo

        gen = torch.Generator(device=model.device).manual_seed(seed)
        forward, block = bd3_forward(model.model), int(model.record["objective.block_size"])
        results = [bd3_nelbo(forward, b, block_size=block, mask_token_id=model.mask_token_id, generator=gen,
                             num_samples=num_samples, samples_per_forward=samples_per_forward, noise_range=(eps, 1.0),
                             schedule=getattr(model, "noise_schedule", None)) for b in batches]
        total = merge_elbo_results(results).total()
        total["stderr_method"] = "per row std / sqrt(num_samples), rows independent"
        return {"elbo": {"bd3": total}}
    for estimator in estimators:
        gen = torch.Generator(device=model.device).manual_seed(seed)
        bar, task = _progress(len(batches), f"ELBO ({estimator})")
        results = []
        with bar:
            for b in batches:
                results.append(elbo_nll(model.logits_fn, b, mask_token_id=model.mask_token_id, generator=gen,
                                        estimator=estimator, num_samples=num_samples,
                                        samples_per_forward=samples_per_forward, eps=eps,
                                        schedule=getattr(model, "noise_schedule", None)))
                bar.advance(task)
        total = merge_elbo_results(results).total()
        total["stderr_method"] = "per row std / sqrt(num_samples), rows independent"
        out[estimator] = total
    return {"elbo": out}


@app.command("eval", cls=Command)
def eval_command(
    ctx: typer.Context,
    model_path: str = typer.Argument(..., metavar="RUN_OR_CHECKPOINT", help=_MODEL_HELP),
    data: Optional[str] = typer.Option(None, "--data", help="Indexed dataset PREFIX (PREFIX.bin/.idx, or PREFIX_text_document)."),
    choices: Optional[str] = typer.Option(None, "--choices", help='JSONL of {"context", "choices", "label"}: multiple-choice accuracy.'),
    task: Optional[str] = typer.Option(None, "--task", help='JSONL of {"prompt", "answer"} (`dlmspec task make`): generation accuracy by exact match.'),
    spec: Optional[str] = typer.Option(None, "--spec", help="A spec whose [generate] sets the sampler (over the checkpoint's) and whose [eval.generation] prompts is the task when --task is not given."),
    max_prompts: Optional[int] = typer.Option(None, "--max-prompts", help="--task: score the file's first N prompts (default: all)."),
    gen_length: Optional[int] = typer.Option(None, "--gen-length", help="--task: tokens generated per prompt."),
    steps: Optional[int] = typer.Option(None, "--steps", help="--task: denoising steps."),
    block_length: Optional[int] = typer.Option(None, "--block-length", help="--task: semi-autoregressive block."),
    remasking: Optional[str] = typer.Option(None, "--remasking", help="--task: low_confidence, random, threshold or factor."),
    seq_length: Optional[int] = typer.Option(None, "--seq-length", help="Tokens per scored window (default: the run's train.seq_length)."),
    num_sequences: int = typer.Option(64, "--num-sequences", help="Windows scored (the dataset's first)."),
    estimator: str = typer.Option(DEFAULT_ESTIMATOR, "--estimator", help="MDM ELBO: count (LLaDA Eq. 6, default: lower variance), time (Eq. 3, 1/t weights) or both."),
    num_samples: int = typer.Option(128, "--num-samples", help="Monte-Carlo samples per sequence (LLaDA's mc_num: 128)."),
    samples_per_forward: int = typer.Option(16, "--samples-per-forward", help="Samples per forward pass (memory only)."),
    eps: float = typer.Option(1e-3, "--eps", help="--estimator time: lower bound of t (the training default)."),
    normalize: str = typer.Option("sum", "--normalize", help="--choices: compare total NLL (sum, lm-eval acc) or per token (mean)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the masks drawn."),
    batch_size: int = typer.Option(8, "--batch-size", help="Windows per batch."),
    kind: Optional[str] = typer.Option(None, "--kind", help="mdm or ar: converted checkpoints only."),
    mask_token_id: Optional[int] = typer.Option(None, "--mask-token-id", help="Converted checkpoints only."),
    device: str = typer.Option("auto", "--device", help="cuda, cuda:N, cpu or auto."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16, fp16 or fp32."),
    json_output: bool = typer.Option(False, "--json", help="Print the scores as JSON on stdout."),
) -> None:
    """Measure a model: AR perplexity, or the masked-diffusion ELBO bound on NLL per token with its
    standard error and sample count; --choices: multiple-choice accuracy with a Wilson 95 % interval;
    --task: generation accuracy (exact match) with a Wilson 95 % interval and the settings used."""
    use_json(ctx, json_output)
    from dlmspec.cli.eval_task import read_rows, score_task, task_source

    task, max_prompts = task_source(task, spec, max_prompts)
    if data is None and choices is None and task is None:
        if spec is not None:  # --spec alone: its [eval.generation] would have been the task
            raise _issue("--spec", spec, "nothing to score: the spec has no [eval.generation] table (its prompts "
                         "file is the task when --task is not given)",
                         "add [eval.generation] with prompts = \"FILE.jsonl\" to the spec, or pass --task "
                         "FILE.jsonl, --data PREFIX or --choices FILE.jsonl")
        raise _issue("--data", None, "nothing to score", "--data PREFIX (an indexed dataset), --choices FILE.jsonl "
                     "and/or --task FILE.jsonl")
    checks = [("--num-sequences", num_sequences, num_sequences >= 1, "--num-sequences 64"),
              ("--num-samples", num_samples, num_samples >= 2, "--num-samples 128 (a standard error needs >= 2)"),
              ("--samples-per-forward", samples_per_forward, samples_per_forward >= 1, "--samples-per-forward 16"),
              ("--batch-size", batch_size, batch_size >= 1, "--batch-size 8"),
              ("--eps", eps, 0.0 <= eps < 1.0, "--eps 0.001"),
              ("--estimator", estimator, estimator in ("count", "time", "both"), "--estimator count, time or both"),
              ("--normalize", normalize, normalize in ("sum", "mean"), "--normalize sum or mean"),
              ("--seed", seed, seed >= 0, "--seed 0")]
    if seq_length is not None:
        checks.append(("--seq-length", seq_length, seq_length >= 2, "--seq-length 512"))
    if max_prompts is not None:
        checks.append(("--max-prompts", max_prompts, max_prompts >= 1, "--max-prompts 500"))
    words = {"--estimator": "count, time, both", "--normalize": "sum, mean"}  # flags that take one of a few words
    problems = [_issue(key, value, f"not one of {words[key]}" if key in words else "out of range", fix).issues[0]
                for key, value, ok, fix in checks if not ok]
    # every input problem found before a checkpoint is read, at once (generate's pass): the flags, the
    # --task generation flags, the files, --spec's [generate] table, and a run that does not exist beside them
    problems.extend(flag_value_issues(dict(gen_length=gen_length, steps=steps, block_length=block_length,
                                           remasking=remasking)))
    problems.extend(load_flag_issues(device, dtype, kind))
    items = _collect(problems, read_choices, choices) if choices is not None else None
    rows = _collect(problems, read_rows, task, max_prompts) if task is not None else None
    prefix = _collect(problems, find_dataset, data) if data is not None else None
    spec_table, locate = (_collect(problems, _spec_table, spec) or (None, None)) if task is not None else (None, None)
    _refuse_before_loading(problems, model_path)
    model = _load(model_path, device, dtype, kind, mask_token_id)
    settings = {"estimator": estimator, "default_estimator": DEFAULT_ESTIMATOR, "num_samples": num_samples,
                "samples_per_forward": samples_per_forward, "eps": eps, "seed": seed, "batch_size": batch_size,
                "normalize": normalize}
    result: dict[str, Any] = {"model": _model_info(model), "settings": settings}
    try:
        if prefix is not None:
            length = seq_length or int(model.record.get("train.seq_length") or 512)
            if model.max_length and length > model.max_length:
                raise _issue("--seq-length", length, f"exceeds the model's max_position_embeddings = {model.max_length}",
                             f"--seq-length {model.max_length}")
            windows, facts = dataset_windows(prefix, seq_length=length, num_sequences=num_sequences,
                                             vocab_size=model.vocab_size)
            settings["seq_length"] = length
            result["data"] = facts
            estimators = ["count", "time"] if estimator == "both" else [estimator]
            result.update(score_dataset(model, windows, estimators=estimators, num_samples=num_samples,
                                        samples_per_forward=samples_per_forward, eps=eps, seed=seed,
                                        batch_size=batch_size))
        if rows is not None:
            flags = dict(gen_length=gen_length, steps=steps, block_length=block_length, remasking=remasking)
            config, gen_settings = resolve_settings(
                kind=model.kind, mask_token_id=model.mask_token_id, eos_token_id=model.eos_token_id, pad_token_id=None,
                lock_table=model.generate_table, lock_file=os.path.join(model.path, "spec.lock.toml"),
                spec_table=spec_table, spec_locate=locate, flags=flags)
            check_token_ids(model, config, gen_settings)
            result["task"] = score_task(model, rows, path=task, config=config, settings=gen_settings,
                                        batch_size=batch_size)
        if items is not None:
            result["choices"] = _score_choices(model, items, normalize=normalize, seed=seed, estimator=estimator,
                                               num_samples=num_samples, samples_per_forward=samples_per_forward,
                                               eps=eps, path=choices)
    except RuntimeError as exc:  # torch's OutOfMemoryError is one
        refused = _out_of_memory(exc, batch_size, "scoring")
        if refused is None:
            raise
        raise refused from None
    finally:
        model.close()
    if json_output:
        print_envelope(command_name(ctx), ok=True, result=result)
        return
    _print_eval(result)


def _score_choices(model: Any, items: list[dict[str, Any]], *, normalize: str, seed: int, estimator: str,
                   num_samples: int, samples_per_forward: int, eps: float, path: str) -> dict[str, Any]:
    from dlmspec.backends.generate.likelihood import multiple_choice, split_pair

    if model.tokenizer is None:
        raise _issue("RUN_OR_CHECKPOINT", model.path, f"--choices needs the model's tokenizer ({model.tokenizer_error})",
                     "run from the folder the training ran in")
    tokenized = []
    for number, item in enumerate(items, 1):
        pairs = [split_pair(model.encode, item["context"], c) for c in item["choices"]]
        context = pairs[0][0]
        if not context and objectives.get(model.kind).predicts_next_token:
            context = [model.eos_token_id if model.eos_token_id is not None else 0]  # AR needs a first token
        for choice, (_, ids) in zip(item["choices"], pairs):
            if not ids:
                raise _issue("--choices", f"{path}:{number}", f"choice {choice!r} has no tokens after its context",
                             "a non-empty choice", file=path, line=number)
        longest = max(len(ids) for _, ids in pairs)
        if model.max_length and len(context) + longest > model.max_length:
            raise _issue("--choices", f"{path}:{number}", f"line {number}: a context of {len(context)} tokens plus its "
                         f"longest choice of {longest} exceeds the model's max_position_embeddings = {model.max_length}",
                         f"a context and choices of at most {model.max_length} tokens together (cut the context "
                         "to its last sentences)", file=path, line=number)
        tokenized.append({"context": context, "choices": [ids for _, ids in pairs], "label": item["label"]})
    bar, task = _progress(len(items), "choices")
    kwargs = {}
    scored_by_elbo = objectives.get(model.kind).diffusion
    if scored_by_elbo:
        kwargs = dict(estimator="count" if estimator == "both" else estimator, num_samples=num_samples,
                      samples_per_forward=samples_per_forward, eps=eps, schedule=getattr(model, "noise_schedule", None))
    with bar:
        res = multiple_choice(model.logits_fn, tokenized, kind=model.kind, mask_token_id=model.mask_token_id,
                              seed=seed, normalize=normalize, device=model.device,
                              on_item=lambda _: bar.advance(task), **kwargs)
    out = res.to_dict()
    out["file"] = path
    out["tokens"] = "choice = encode(context + choice) after encode(context), as lm-eval's _encode_pair"
    if scored_by_elbo:
        out["seeding"] = ("a generator seeded with --seed for every choice (the lm-eval model's rule: the same "
                          "number for the same request)")
    else:
        out["seeding"] = "exact for every choice (no random draws)"
    out["scoring"] = ("ELBO bound of -log p(choice | context)" if scored_by_elbo else "exact -log p(choice | context)")
    return out


def _print_eval(result: dict[str, Any]) -> None:
    from rich.text import Text

    console = stdout()
    m = result["model"]
    at = "" if m.get("iteration") is None else f", iteration {m['iteration']}"
    console.print(Text(terminal_safe(f"{m['path']} ({m['kind']}{at})"), style="bold"))
    if "data" in result:
        d = result["data"]
        console.print(Text(terminal_safe(f"data: {d['prefix']}, {d['num_sequences']} windows of {d['seq_length']} tokens")))
    if "ar" in result:
        a = result["ar"]
        console.print(f"NLL {a['nll_per_token']:.4f} nats/token, perplexity {a['perplexity']:.2f} (exact, AR)")
    for name, e in (result.get("elbo") or {}).items():
        default = " (default)" if name == DEFAULT_ESTIMATOR else ""
        console.print(f"ELBO bound ({name}{default}): {e['nll_per_token']:.4f} +- {e['stderr_per_token']:.4f} nats/token "
                      f"(1 standard error), perplexity <= {e['perplexity_bound']:.2f}; {e['num_samples']} samples x "
                      f"{e['num_sequences']} sequences")
    if "task" in result:
        from dlmspec.cli.eval_task import task_line

        console.print(Text(terminal_safe(task_line(result["task"]))))
    if "choices" in result:
        c = result["choices"]
        lo, hi = c["interval_95"]
        console.print(f"multiple choice: accuracy {c['accuracy']:.3f} (Wilson 95 % interval {lo:.3f}-{hi:.3f}), "
                      f"n = {c['n']}, normalize = {c['normalize']}")
