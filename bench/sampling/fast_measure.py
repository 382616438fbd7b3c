"""The fast-sampling suite's worker: one process per side, started by ``bench/sampling/fast_sampling.py``.

- ``dlmspec``: loads the trained task model (``load_model``), writes the held-out prompts as token
  ids (``WORK/heldout.json``), exports the model to LLaDA's Hugging Face format (``--llada-out``:
  ``backends/convert`` family ``llada``, its state-dict mapping) with a probe of its logits
  (``WORK/probe.pt``), then times and scores :data:`fast_kit.CONFIGS` of dlmspec's sampler.
- ``peers``: in an environment with the transformers Fast-dLLM pins (4.49.0) first on the path,
  loads that export with Fast-dLLM's own ``modeling_llada.py`` and times and scores the suite's
  LLaDA ``generate.py``-style loop (``generate_demo.peer_generate``: a full forward per step) and
  Fast-dLLM's own ``generate`` / ``generate_with_prefix_cache`` / ``generate_with_dual_cache``
  (its ``llada/generate.py``, pinned by commit: ``bench/devbox/fetch_fast_dllm.sh``).
- ``report``: accuracy (exact match, Wilson 95 %), token agreement with dlmspec's no-cache
  decoding, the targets, the markdown table.
- ``render``: a task folder's held-out and validation prompts rendered with a chat template
  (:func:`dlmspec.data.chat.render` with the generation prompt, as ``dlmspec data prepare --sft``
  renders the SFT rows the model was tuned on), written to another folder of the same layout: the
  prompts an SFT model is scored on (``bench/devbox/gpu/task_rl.sh`` renders them the same way).

Protocol of each configuration (both sides the same):

1. timing, per batch of ``--batches``: ``B`` held-out prompts of one token length
   (:func:`fast_kit.timing_prompts`), one warm-up generation, then ``--repeats`` timed ones
   (CUDA synchronised around each); the median seconds; tokens/s = ``B x gen_length / seconds``
   (every implementation decodes all ``gen_length`` positions: dlmspec runs with no EOS early exit,
   as the peers' loops have none); forward passes as each implementation counts them.
2. accuracy: the first ``--eval-prompts`` held-out prompts in batches of at most ``--eval-batch`` of
   one token length (:func:`fast_kit.eval_batches`), greedy (temperature 0); the generated ids are
   kept (``WORK/ids/<side>.json``) for the report.

Each worker stops starting configurations at ``--deadline`` (epoch seconds) and rewrites its partial
result (``--partial``) after every configuration, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fast_kit  # noqa: E402

Runner = Callable[[Any], Tuple[Any, int]]  # LongTensor[B, P] -> (LongTensor[B, gen_length], forward passes)

#: Fast-dLLM's llada/generate.py at the pinned commit allocates the canvas with batch 1 and its dual
#: cache takes the replaced positions of every row at once: these two edits (exact text, each must
#: match) let it run a batch of equal-length prompts; at batch 1 they change nothing (the same
#: shapes, the same operations).
FAST_DLLM_BATCH_PATCH = (
    ("torch.full((1, prompt.shape[1] + gen_length), mask_id",
     "torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id"),
    ("replace_position = torch.zeros_like(x, dtype=torch.bool)",
     "replace_position = torch.zeros_like(x[:1], dtype=torch.bool)"),
)


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize()


def _passes(value: Any) -> int:
    """A forward-pass count (an int, or one per row: their maximum)."""
    if isinstance(value, (list, tuple)):
        return int(max(value)) if value else 0
    if hasattr(value, "max") and hasattr(value, "numel"):
        return int(value.max())
    return int(value)


def measure(runners: Dict[str, Tuple[Optional[Runner], Optional[str]]], heldout: Dict[str, Any], args: argparse.Namespace,
            device: Any, side: str, extra: Dict[str, Any], t0: float) -> None:
    """Time and run every runner (name -> ``(runner, None)`` or ``(None, why it is skipped)``) on the
    held-out prompts; write the partial result after each step and the ids at the end of each
    accuracy pass."""

    ids: List[List[int]] = heldout["ids"]
    lengths = [len(p) for p in ids]
    result: Dict[str, Any] = {"side": side, **extra, "configs": {}}
    out_ids: Dict[str, List[List[int]]] = {}
    ids_path = Path(args.work) / "ids" / f"{side}.json"

    def save() -> None:
        fast_kit.write_json(Path(args.partial), result)
        fast_kit.write_json(ids_path, out_ids)

    for name, (runner, why) in runners.items():
        result["configs"][name] = {"timing": {}} if runner else {"skipped": why}
    save()
    late = {n: r for n, r in runners.items() if n.endswith("+compile")}  # compilation first costs time: last
    main = {n: r for n, r in runners.items() if n not in late}
    for group in (main, late):
        _timing_then_accuracy(group, result, out_ids, ids, lengths, args, device, t0, save)
    save()


def _timing_then_accuracy(runners: Dict[str, Tuple[Optional[Runner], Optional[str]]], result: Dict[str, Any],
                          out_ids: Dict[str, List[List[int]]], ids: List[List[int]], lengths: List[int],
                          args: argparse.Namespace, device: Any, t0: float, save: Callable[[], None]) -> None:
    """Phase 1, the timing of every runner at every batch (small, so a run cut short still compares
    them all); phase 2, their held-out passes."""
    import torch

    for name, (runner, _) in runners.items():
        if runner is None:
            continue
        entry = result["configs"][name]
        for batch in args.batches:
            if time.time() > args.deadline:
                entry.setdefault("cut", []).append(f"timing b{batch}: deadline")
                continue
            prompts = torch.tensor([ids[i] for i in fast_kit.timing_prompts(lengths, batch)], device=device)
            try:
                runner(prompts)  # warm-up (kernels, allocator, graphs)
                _sync(device)
                secs, passes = [], 0
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    _, passes = runner(prompts)
                    _sync(device)
                    secs.append(time.perf_counter() - start)
            except Exception as exc:  # noqa: BLE001 - recorded, the other configurations go on
                entry.setdefault("errors", []).append(f"timing b{batch}: {type(exc).__name__}: {exc}"[:500])
                print(fast_kit.stamp(t0, f"{name} b{batch}: {type(exc).__name__}: {exc}"), flush=True)
                continue
            seconds = statistics.median(secs)
            tokens = batch * args.gen_length
            entry["timing"][str(batch)] = {"seconds": seconds, "all_seconds": secs, "tokens": tokens,
                                           "tokens_per_second": tokens / seconds, "forward_passes": _passes(passes),
                                           "prompt_tokens": int(prompts.shape[1]), **getattr(runner, "info", {})}
            print(fast_kit.stamp(t0, f"{name:32s} b{batch:<3d} {tokens / seconds:9.1f} tok/s  {_passes(passes)} passes"),
                  flush=True)
            save()
    # Phase 2: accuracy on the held-out prompts.
    for name, (runner, _) in runners.items():
        if runner is None:
            continue
        entry = result["configs"][name]
        predicted = _predicted_pass_seconds(entry, len(fast_kit.eval_batches(lengths, args.eval_batch)))
        if time.time() + (predicted or 0.0) > args.deadline:
            entry.setdefault("cut", []).append(f"accuracy: would end after the deadline (predicted {predicted or 0:.0f}s)")
            print(fast_kit.stamp(t0, f"{name}: held-out pass skipped, predicted {predicted or 0:.0f}s, "
                                     f"{args.deadline - time.time():.0f}s left"), flush=True)
            continue
        generated: List[Optional[List[int]]] = [None] * len(ids)
        passes_total, start = 0, time.perf_counter()
        try:
            for group in fast_kit.eval_batches(lengths, args.eval_batch):
                if time.time() > args.deadline:
                    raise TimeoutError(f"deadline reached after {sum(g is not None for g in generated)} prompts")
                prompts = torch.tensor([ids[i] for i in group], device=device)
                gen, passes = runner(prompts)
                passes_total += _passes(passes)
                for row, i in zip(gen.tolist(), group):
                    generated[i] = row
        except Exception as exc:  # noqa: BLE001
            entry.setdefault("errors", []).append(f"accuracy: {type(exc).__name__}: {exc}"[:500])
            print(fast_kit.stamp(t0, f"{name} accuracy: {type(exc).__name__}: {exc}"), flush=True)
            continue
        _sync(device)
        entry["eval"] = {"prompts": len(ids), "batch": args.eval_batch, "seconds": time.perf_counter() - start,
                         "forward_passes": passes_total}
        out_ids[name] = generated  # type: ignore[assignment]
        print(fast_kit.stamp(t0, f"{name:32s} held-out pass: {len(ids)} prompts in {entry['eval']['seconds']:.1f}s"),
              flush=True)
        save()


def _predicted_pass_seconds(entry: Dict[str, Any], batches: int) -> Optional[float]:
    """The fewest seconds a held-out pass of ``batches`` generations can take: each at least as long
    as one at the largest timed batch (the pass's batches are as large or larger), or ``None``
    without a timing. A pass is skipped only when even this does not fit (one that then reaches the
    deadline stops between batches)."""
    timing = entry.get("timing") or {}
    if not timing:
        return None
    return timing[max(timing, key=int)]["seconds"] * batches


# --------------------------------------------------------------------------- dlmspec side


def dlmspec_runner(model: Any, config: fast_kit.Config, args: argparse.Namespace) -> Tuple[Optional[Runner], Optional[str]]:
    """dlmspec's sampler for ``config`` (the one seam on the sampler's ``[generate]`` keys): keys this
    dlmspec does not have (``cache``, ``cache_refresh``, ``factor``, those of ``--dlmspec-set``) make
    the configuration skipped with the reason, not a different run."""
    import dataclasses

    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.sampler import generate

    fields = {f.name for f in dataclasses.fields(GenerateConfig)}
    kw: Dict[str, Any] = dict(gen_length=args.gen_length, steps=args.steps, block_length=args.block_length,
                              remasking=config.remasking, threshold=args.threshold, temperature=0.0,
                              mask_token_id=model.mask_token_id, eos_token_id=None, pad_token_id=model.pad_token_id)
    wanted: Dict[str, Any] = {}
    if config.cache != "none":
        wanted["cache"] = config.cache
        if args.cache_refresh is not None:
            wanted["cache_refresh"] = args.cache_refresh
    if config.remasking == "factor":
        wanted["factor"] = args.factor
    if config.compile:
        wanted["compile"] = True
    for item in args.dlmspec_set:
        key, _, value = item.partition("=")
        wanted[key] = json.loads(value)
    missing = sorted(k for k in wanted if k not in fields)
    if missing:
        return None, f"this dlmspec's [generate] has no {', '.join(missing)} (GenerateConfig fields: {sorted(fields)})"
    try:
        cfg = GenerateConfig(**kw, **wanted)
    except (TypeError, ValueError) as exc:
        return None, f"GenerateConfig refused {wanted}: {exc}"

    def run(prompts: Any) -> Tuple[Any, int]:
        out = generate(model.logits_fn, prompts, cfg, device=model.device, noise_schedule=model.noise_schedule)
        per_row = list(getattr(out, "forward_passes_per_row", []) or [])
        run.info = {"cache_run": getattr(out, "cache", "none"), "cache_fallback": getattr(out, "cache_fallback", None),
                    # [generate] cuda_graph (on by default where this dlmspec has it): whether the forward replayed
                    "cuda_graph": getattr(cfg, "cuda_graph", None),
                    "cuda_graph_fallback": getattr(out, "cuda_graph_fallback", None),
                    "forward_passes_per_row_mean": sum(per_row) / len(per_row) if per_row else None,
                    "config": {k: v for k, v in out.config.items() if k in wanted or k in ("remasking", "threshold")}}
        return out.sequences[:, out.prompt_length:], out.forward_passes

    run.info = {}  # type: ignore[attr-defined]
    return run, None


def export_llada(model: Any, out: Path) -> Dict[str, Any]:
    """The loaded model's weights in LLaDA's Hugging Face format (``config.json`` with
    ``model_type = "llada"``, safetensors named ``model.transformer.*``), through
    ``backends/convert``'s dims, config and state-dict mapping; returns the config written.

    Raises:
        ValueError: a model LLaDA's modelling code cannot express (q/k norm, biases).
    """
    from megatron.core.utils import unwrap_model

    from dlmspec.backends.convert import hf_io
    from dlmspec.backends.convert.dims import ModelDims
    from dlmspec.backends.convert.hf_config import hf_config_from_dims
    from dlmspec.backends.convert.state_dict import mcore_to_hf_state_dict

    r = model.record
    if r.get("model.qk_layernorm"):
        raise ValueError("model.qk_layernorm = true: LLaDA's modelling code has no q/k norm; train the task model "
                         "with --set model.qk_layernorm=false (fast_sampling.py does)")
    if r.get("model.add_bias_linear") or r.get("model.add_qkv_bias"):
        raise ValueError("linear biases: LLaDA's llama block has none; train without them")
    if int(r["model.kv_channels"]) * int(r["model.num_attention_heads"]) != int(r["model.hidden_size"]):
        raise ValueError("kv_channels x heads != hidden_size: LLaDA's attention takes head width = d_model / n_heads")
    padded = int(r["model.padded_vocab_size"])
    dims = ModelDims(
        family="llada", num_layers=r["model.num_layers"], hidden_size=r["model.hidden_size"],
        ffn_hidden_size=r["model.ffn_hidden_size"], num_attention_heads=r["model.num_attention_heads"],
        num_query_groups=r["model.num_query_groups"], kv_channels=r["model.kv_channels"],
        vocab_size=padded, padded_vocab_size=padded,  # the mask id lies in the padded rows: keep them all
        tied=not r["model.untie_embeddings_and_output_weights"], qk_layernorm=False,
        max_position_embeddings=r["model.max_position_embeddings"], rotary_base=r["model.rotary_base"],
        norm_epsilon=r["model.layernorm_epsilon"])
    state = {k: v.detach().float().cpu() for k, v in unwrap_model(model.model).state_dict().items()
             if not k.endswith("_extra_state")}
    config = hf_config_from_dims(dims, None)
    config.update(mask_token_id=int(model.mask_token_id), eos_token_id=model.eos_token_id,
                  pad_token_id=model.pad_token_id, flash_attention=False, rope_full_precision=True,
                  attention_dropout=0.0, residual_dropout=0.0, embedding_dropout=0.0, torch_dtype="bfloat16",
                  vocab_size=padded)
    # the work directory is the launcher's: a rerun replaces its export (overwrite) rather than measuring a stale one
    hf_io.write_hf_checkpoint(str(out), mcore_to_hf_state_dict(state, dims), config, overwrite=True)
    return config


def dlmspec_side(args: argparse.Namespace) -> int:
    import torch

    from dlmspec.backends.generate.load import load_model

    t0 = time.time()
    work = Path(args.work)
    model = load_model(args.ckpt, device=args.device)
    dev = model.device
    rows = fast_kit.read_task_rows(Path(args.task_dir), args.eval_prompts)
    ids = [model.encode(r["prompt"]) for r in rows]
    r = model.record
    tokenizer = {k: r.get(f"data.tokenizer.{k}") for k in ("type", "model", "vocab_file", "merge_file", "vocab_size")}
    heldout = {"ids": ids, "answers": [r_["answer"] for r_ in rows], "row_ids": [r_["id"] for r_ in rows],
               "eos": model.eos_token_id, "mask": model.mask_token_id, "vocab": model.vocab_size, "tokenizer": tokenizer,
               "cwd": str(Path.cwd())}
    fast_kit.write_json(work / "heldout.json", heldout)
    print(fast_kit.stamp(t0, f"loaded {args.ckpt} on {dev}; {len(ids)} held-out prompts, lengths "
                         f"{sorted(set(map(len, ids)))}"), flush=True)
    extra: Dict[str, Any] = {"checkpoint": args.ckpt, "iteration": model.iteration, "device": str(dev),
                             "held_out_file": str(Path(args.task_dir) / "test.jsonl"),
                             "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                             "model": {k: r.get(f"model.{k}") for k in ("num_layers", "hidden_size", "ffn_hidden_size",
                                                                         "num_attention_heads", "num_query_groups",
                                                                         "qk_layernorm", "padded_vocab_size")}}
    try:
        extra["parameters"] = sum(p.numel() for p in model.model.parameters())
    except Exception:  # noqa: BLE001 - informative only
        pass
    if args.llada_out:
        try:
            export_llada(model, Path(args.llada_out))
            probe = torch.tensor([ids[0]], device=dev)
            torch.save({"tokens": probe.cpu(), "logits": model.logits_fn(probe).float().cpu()}, work / "probe.pt")
            extra["llada_export"] = str(args.llada_out)
        except Exception as exc:  # noqa: BLE001 - the peers side then reports it missing
            extra["llada_export_error"] = f"{type(exc).__name__}: {exc}"[:500]
            import shutil

            shutil.rmtree(args.llada_out, ignore_errors=True)  # never leave an earlier run's export to be measured
            (work / "probe.pt").unlink(missing_ok=True)
        print(fast_kit.stamp(t0, f"LLaDA export: {extra.get('llada_export') or extra['llada_export_error']}"), flush=True)
    runners = {c.name: dlmspec_runner(model, c, args)
               for c in fast_kit.configs_of("dlmspec", args.only, with_compile=args.with_compile)}
    measure(runners, heldout, args, dev, "dlmspec", extra, t0)
    model.close()
    return 0


# --------------------------------------------------------------------------- peers side


def load_fast_dllm(root: Path) -> Tuple[Any, Any, Dict[str, Any]]:
    """``(LLaDAModelLM, the patched generate module, provenance)`` from Fast-dLLM's files under
    ``root`` (``llada/generate.py``, ``llada/model/*``, ``COMMIT``)."""
    import types

    llada = root / "llada"
    sys.path.insert(0, str(llada))
    from model.modeling_llada import LLaDAModelLM  # type: ignore[import-not-found]

    source = (llada / "generate.py").read_text()
    applied = []
    for old, new in FAST_DLLM_BATCH_PATCH:
        count = source.count(old)
        if count == 0:
            raise RuntimeError(f"Fast-dLLM generate.py: {old!r} not found (another commit?): the batch patch does not apply")
        source = source.replace(old, new)
        applied.append({"from": old, "to": new, "count": count})
    module = types.ModuleType("fast_dllm_generate")
    module.__file__ = str(llada / "generate.py")
    exec(compile(source, str(llada / "generate.py"), "exec"), module.__dict__)  # noqa: S102 - pinned file
    commit = (root / "COMMIT").read_text().strip() if (root / "COMMIT").exists() else None
    return LLaDAModelLM, module, {"repository": "github:NVlabs/Fast-dLLM", "commit": commit, "batch_patch": applied}


def peers_side(args: argparse.Namespace) -> int:
    import torch

    t0 = time.time()
    work = Path(args.work)
    heldout = json.loads((work / "heldout.json").read_text())
    extra: Dict[str, Any] = {}
    import transformers

    extra["transformers"] = transformers.__version__
    LLaDAModelLM, fast, provenance = load_fast_dllm(Path(args.fast_dllm))
    extra["fast_dllm"] = provenance
    dev = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    hf = LLaDAModelLM.from_pretrained(args.llada, torch_dtype=dtype).to(dev).eval()
    extra.update(device=str(dev), dtype=str(dtype), gpu=torch.cuda.get_device_name(dev) if dev.type == "cuda" else None)
    vocab, mask = int(heldout["vocab"]), int(heldout["mask"])
    probe_path = work / "probe.pt"
    with torch.no_grad():
        if probe_path.exists():
            probe = torch.load(probe_path)
            theirs = hf(probe["tokens"].to(dev)).logits[..., :vocab].float().cpu()
            ours = probe["logits"][..., :vocab]
            extra["probe"] = {"max_abs_logit_diff": float((theirs - ours).abs().max()),
                              "argmax_agreement": float((theirs.argmax(-1) == ours.argmax(-1)).float().mean()),
                              "note": "LLaDA modelling (Fast-dLLM's file) on the export vs dlmspec's logits_fn, one prompt"}
            print(fast_kit.stamp(t0, f"probe: {extra['probe']}"), flush=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generate_demo import peer_generate

    @torch.no_grad()
    def hf_forward(x: Any) -> Any:
        return hf(x).logits[..., :vocab]

    def hf_loop(rule: str) -> Runner:
        def run(prompts: Any) -> Tuple[Any, int]:
            x, passes = peer_generate(hf_forward, prompts, steps=args.steps, gen_length=args.gen_length,
                                      block_length=args.block_length, mask_id=mask,
                                      threshold=args.threshold if rule == "threshold" else None)
            return x[:, prompts.shape[1]:], passes
        return run

    functions = {"none": fast.generate, "prefix": fast.generate_with_prefix_cache, "dual": fast.generate_with_dual_cache}

    def fast_dllm(cache: str, rule: str) -> Runner:
        fn = functions[cache]

        def run(prompts: Any) -> Tuple[Any, int]:
            x, nfe = fn(hf, prompts, steps=args.steps, gen_length=args.gen_length, block_length=args.block_length,
                        temperature=0.0, remasking="low_confidence", mask_id=mask,
                        threshold=args.threshold if rule == "threshold" else None)
            return x[:, prompts.shape[1]:], nfe
        return run

    runners: Dict[str, Tuple[Optional[Runner], Optional[str]]] = {}
    for c in fast_kit.configs_of("peers", args.only):
        runners[c.name] = (hf_loop(c.remasking), None) if c.impl == "hf-loop" else (fast_dllm(c.cache, c.remasking), None)
    measure(runners, heldout, args, dev, "peers", extra, t0)
    return 0


# --------------------------------------------------------------------------- render


#: The files of a task folder whose prompts ``render`` puts in the chat template.
RENDERED = ("test.jsonl", "validation.jsonl")


def render_prompts(template: str, task_dir: Path, out: Path) -> Dict[str, int]:
    """Write ``out/<file>`` for each of :data:`RENDERED` in ``task_dir``: every row as it is, its
    ``prompt`` replaced by ``text_of(render(template, [user: prompt], add_generation_prompt=True))``.
    Returns ``{file: rows}``.

    Raises:
        dlmspec.files.FileRefused: a file that is not a regular file, a line over the line cap.
        ValueError: a line that is not a JSON object with a string ``prompt`` (file and line named),
            or an unknown template (:func:`dlmspec.data.chat.render`'s error).
    """
    from dlmspec.data.chat import render, text_of
    from dlmspec.files import iter_lines, loads_json, write_atomic

    counts: Dict[str, int] = {}
    out.mkdir(parents=True, exist_ok=True)
    for name in RENDERED:
        lines = []
        for number, line in iter_lines(task_dir / name, what="task file"):
            if not line.strip():
                continue
            row = loads_json(line, where=f"{task_dir / name}:{number}")
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(f"{task_dir / name}:{number}: needs a string key 'prompt'")
            row["prompt"] = text_of(render(template, [{"role": "user", "content": row["prompt"]}],
                                           add_generation_prompt=True))
            lines.append(json.dumps(row, sort_keys=True) + "\n")
        write_atomic(out / name, "".join(lines))
        counts[name] = len(lines)
    return counts


def render_side(args: argparse.Namespace) -> int:
    try:
        counts = render_prompts(args.template, Path(args.task_dir), Path(args.out))
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: render --template {args.template} --task-dir {args.task_dir}: {exc}", file=sys.stderr)
        return 2
    print(f"rendered with the {args.template!r} template into {args.out}: {counts}")
    return 0


# --------------------------------------------------------------------------- report


def report(args: argparse.Namespace) -> int:
    """Merge the partial results, score the kept ids, write ``--out`` (values of the suite's result)
    and ``--table`` (markdown)."""
    work = Path(args.work)
    parts = [json.loads(Path(p).read_text()) for p in args.partials if Path(p).exists()]
    summary = fast_kit.merge_configs(parts)
    ids: Dict[str, Any] = {}
    for side in ("dlmspec", "peers"):
        path = work / "ids" / f"{side}.json"
        if path.exists():
            ids.update(json.loads(path.read_text()))
    heldout_path = work / "heldout.json"
    scoring: Dict[str, Any] = {}
    if heldout_path.exists():
        heldout = json.loads(heldout_path.read_text())
        match, match_name = fast_kit.checker()
        decode = _decoder(heldout)
        scoring = {"checker": match_name, "prompts": len(heldout["answers"]), "eos": heldout["eos"],
                   "interval": "Wilson score, 95 %"}
        for name, generated in ids.items():
            if name in summary and generated and all(g is not None for g in generated):
                summary[name]["accuracy"] = fast_kit.accuracy(generated, heldout["answers"], decode, heldout["eos"], match)
                summary[name]["agreement"] = {ref: fast_kit.agreement(generated, ids[ref])
                                              for ref in (fast_kit.BASELINE, fast_kit.BASELINE_THRESHOLD) if ids.get(ref)}
        if fast_kit.BASELINE in ids and ids[fast_kit.BASELINE]:
            first = ids[fast_kit.BASELINE][:5]
            scoring["examples"] = [{"prompt": decode(heldout["ids"][i]), "completion": decode(
                fast_kit.cut_at_eos(first[i], heldout["eos"])), "answer": heldout["answers"][i]} for i in range(len(first))]
    settings = json.loads(args.settings) if args.settings else {}
    values = {"settings": settings, "scoring": scoring, "configs": summary,
              "sides": {p.get("side", "?"): {k: v for k, v in p.items() if k != "configs"} for p in parts}}
    values["targets"] = fast_kit.targets(summary, settings.get("batches", [1, 8, 32]))
    values["speedups"] = fast_kit.speedups(summary, settings.get("batches", [1, 8, 32]))
    fast_kit.write_json(Path(args.out), values)
    table = fast_kit.render_table(values)
    if args.table:
        Path(args.table).write_text(table)
    print(table)
    return 0


def _decoder(heldout: Dict[str, Any]) -> Callable[[List[int]], str]:
    """Token ids -> text with the run's tokenizer (``dlmspec.tokenizers.build_tokenizer`` from the
    checkpoint's record, relative paths from the folder the run was loaded in)."""
    import os

    from dlmspec.tokenizers import build_tokenizer

    t = heldout["tokenizer"]
    here = os.getcwd()
    try:
        os.chdir(heldout.get("cwd") or here)
        tok = build_tokenizer(t["type"], tokenizer_model=t.get("model"), vocab_file=t.get("vocab_file"),
                              merge_file=t.get("merge_file"), vocab_size=t.get("vocab_size"))
    finally:
        os.chdir(here)
    limit = int(heldout["vocab"])
    return lambda ids: tok.detokenize([i for i in ids if i < limit])


def table(args: argparse.Namespace) -> int:
    """Print the docs/generate.md table of a suite result (the JSON file ``suite`` wrote in the
    sampling results folder), under a line naming its date, GPU and settings."""
    data = json.loads(Path(args.result).read_text())
    values = data.get("values", data)
    s = values.get("settings", {})
    hw = data.get("hardware", {})
    print(f"Measured {data.get('date', '?')} on {hw.get('gpu_name') or hw.get('gpu', '?')} "
          f"(`{Path(args.result).name}`): gen_length {s.get('gen_length')}, steps {s.get('steps')}, block_length "
          f"{s.get('block_length')}, threshold {s.get('threshold')}, factor {s.get('factor')}, greedy, "
          f"{s.get('held_out')} held-out prompts; tokens/s = batch x gen_length / seconds.\n")
    print(fast_kit.render_table(values), end="")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="side", required=True)
    for side in ("dlmspec", "peers"):
        s = sub.add_parser(side)
        s.add_argument("--work", required=True, help="the run's work folder (heldout.json, probe.pt, ids/)")
        s.add_argument("--partial", required=True, help="the partial result, rewritten after every configuration")
        s.add_argument("--device", default="cuda")
        s.add_argument("--gen-length", type=int, default=32)
        s.add_argument("--steps", type=int, default=32)
        s.add_argument("--block-length", type=int, default=8)
        s.add_argument("--threshold", type=float, default=0.9)
        s.add_argument("--factor", type=float, default=1.0)
        s.add_argument("--cache-refresh", type=int, default=None)
        s.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",")], default=[1, 8, 32])
        s.add_argument("--repeats", type=int, default=2)
        s.add_argument("--eval-prompts", type=int, default=512)
        s.add_argument("--eval-batch", type=int, default=128)
        s.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds: start nothing after it")
        s.add_argument("--only", type=lambda v: [x for x in v.split(",") if x], default=None)
        if side == "dlmspec":
            s.add_argument("--ckpt", required=True)
            s.add_argument("--task-dir", required=True)
            s.add_argument("--llada-out", default=None)
            s.add_argument("--with-compile", action="store_true",
                           help="also the +compile configurations (CUDA graphs), after all the others")
            s.add_argument("--dlmspec-set", action="append", default=[], metavar="KEY=JSON",
                           help="another GenerateConfig field for every dlmspec configuration (e.g. a CUDA-graph key)")
        else:
            s.add_argument("--llada", required=True, help="the LLaDA export of the dlmspec side")
            s.add_argument("--fast-dllm", required=True, help="Fast-dLLM's files (bench/devbox/fetch_fast_dllm.sh)")
    r = sub.add_parser("report")
    r.add_argument("--work", required=True)
    r.add_argument("--partials", nargs="+", required=True)
    r.add_argument("--settings", default=None, help="the run's settings as JSON")
    r.add_argument("--out", required=True)
    r.add_argument("--table", default=None)
    t = sub.add_parser("table", help="print the docs/generate.md table of a result file")
    t.add_argument("result")
    c = sub.add_parser("render", help="a task folder's prompts in a chat template (what an SFT model is scored on)")
    c.add_argument("--template", required=True, help="the chat template (plain, chatml, llama3)")
    c.add_argument("--task-dir", required=True, help="the folder dlmspec task make wrote")
    c.add_argument("--out", required=True, help="the folder of the rendered test.jsonl and validation.jsonl")
    args = p.parse_args(argv)
    return {"dlmspec": dlmspec_side, "peers": peers_side, "report": report, "table": table,
            "render": render_side}[args.side](args)


if __name__ == "__main__":
    sys.exit(main())
