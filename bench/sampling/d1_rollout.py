"""Rollout tokens/s of dlmspec's RL stage beside d1's rollout loop, on the same model, prompts and settings.

d1 (Zhao et al. 2025, arXiv:2504.12216; github:dllm-reasoning/d1 at 837888f,
``diffu-grpo/diffu_grpo_trainer.py`` ``DiffuGRPOTrainer.generate`` / ``add_gumbel_noise`` /
``get_num_transfer_tokens``, called by ``_generate_and_score_completions``) samples its GRPO rollouts
with LLaDA's loop on a Hugging Face model: per denoising step one forward pass over the whole canvas,
Gumbel-max sampling in the model's dtype (``exp(logits) / (-log u) ** temperature``), the softmax
probability of the sampled token as its confidence, the positions right of the current block at
``-inf``, and a ``topk`` per row (a Python loop) of the linear schedule's count; ``torch.cuda.
empty_cache()`` at every step; the prompts left-padded without an attention mask; rows generated in
chunks of ``generation_batch_size``. :func:`d1_generate` is that loop (read, not copied).

Three processes (``bench/devbox/gpu/task_rl.sh`` runs them after the RL run):

- ``dlmspec``: the RL job's own settings (``build_rl()`` and ``build_run()`` of the compiled
  ``train.py``: ``[stage.rl]``, ``[generate]``, the seed), the checkpoint loaded as ``dlmspec
  generate`` loads it (``backends/generate/load.py``), and the stage's rollout engine
  (``backends/rl/rollout.py`` ``RolloutEngine``: the first rollout batch's prompts in the stage's
  seeded order, rendered with its chat template, ``G`` completions each through
  ``RolloutEngine.sample``, i.e. ``dlmspec.backends.generate.sampler.generate``). It times that
  rollout batch, keeps one sampled and one greedy (temperature 0) rollout, and exports the model to
  LLaDA's Hugging Face format with a probe of its logits (``fast_measure.export_llada``: the
  fast-sampling suite's export, ``backends/convert``'s LLaDA mapping).
- ``d1``: in the environment of the transformers LLaDA's modelling code was written for (4.49.0,
  as the fast-sampling suite's peers), LLaDA's modelling file (Fast-dLLM's copy, pinned:
  ``fast_measure.load_fast_dllm``; called without its cache arguments it is LLaDA's forward) loads
  the export in bf16 (d1: ``torch_dtype=bfloat16``; d1's ``train.yaml`` also loads the model in 4
  bits with LoRA adapters, not done here: a plain bf16 model) and :func:`d1_generate` times the same
  rollout batch, whole (``d1/whole-batch``: all rows in one call, the largest batch d1's loop can
  take) and in d1's chunks of one group (``d1/generation-batch``: d1's ``generation_batch_size`` =
  ``num_generations``), plus one greedy rollout. The target is taken against the faster of the two.
- ``report``: tokens/s of each (rows x ``gen_length`` over the median seconds of ``--repeats`` timed
  rollouts after one warm-up; both loops decode every position of the one-block canvas), dlmspec's
  ratio over the faster d1 variant against the target (>= 3), the rollouts' exact-match share on each
  side (both sample at the RL temperature, so the shares estimate one number) and the greedy
  rollouts' token agreement (the same model and rule: agreement near 1 shows the loop, the export
  and the column cut are the same function).

One difference from d1's code, stated: the Hugging Face logits are cut to the tokenizer's vocabulary
(the export keeps megatron-core's padded rows and the ``[MASK]`` row placed there, which LLaDA's
vocabulary has as real tokens), as ``dlmspec generate`` cuts its own (``LoadedModel.logits_fn``), so
both loops choose among the same tokens.

    python bench/sampling/d1_rollout.py dlmspec --ckpt runs/x/checkpoints --job job-rl --work W --out W/dlmspec.json --llada-out W/llada
    PYTHONPATH=PEER_SITE:$PYTHONPATH python bench/sampling/d1_rollout.py d1 --work W --llada W/llada --fast-dllm .bench-peers/fast-dllm --out W/d1.json
    python bench/sampling/d1_rollout.py report --work W --parts W/dlmspec.json W/d1.json --out W/rollout-bench.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fast_kit  # noqa: E402
import fast_measure  # noqa: E402

#: dlmspec's rollouts over the faster d1 variant: the issue's target.
TARGET_RATIO = 3.0
#: The file the dlmspec side writes for the d1 side: the rollout batch and its settings.
ROLLOUT_FILE = "rollout.json"


# --------------------------------------------------------------------------- d1's loop


def d1_num_transfer_tokens(mask_index: Any, steps: int) -> Any:
    """d1's ``get_num_transfer_tokens``: per row, the masked count of the block split over ``steps``
    as evenly as possible, the remainder on the first steps (``LongTensor[B, steps]``)."""
    import torch

    mask_num = mask_index.sum(dim=1, keepdim=True)
    base = mask_num // steps
    remainder = mask_num % steps
    out = base.expand(-1, steps).clone()
    if remainder.sum() > 0:
        out[torch.arange(steps, device=mask_index.device).unsqueeze(0) < remainder] += 1
    return out.to(torch.int64)


def d1_gumbel(logits: Any, temperature: float, dtype: Any) -> Any:
    """d1's ``add_gumbel_noise``: ``exp(logits) / (-log u) ** temperature`` in ``dtype`` (d1 passes
    the model's dtype), whose argmax samples ``softmax(logits / temperature)``; the logits as they
    are at temperature 0."""
    import torch

    if temperature == 0.0:
        return logits
    logits = logits.to(dtype)
    noise = torch.rand_like(logits, dtype=dtype)
    return logits.exp() / (-torch.log(noise)) ** temperature


def d1_generate(model_fn: Callable[[Any], Any], prompt: Any, *, steps: int, gen_length: int, block_length: int,
                temperature: float, cfg_scale: float, remasking: str, mask_id: int, dtype: Any) -> Any:
    """d1's rollout loop (``DiffuGRPOTrainer.generate``) on ``model_fn(x) -> logits [B, L, V]``.

    Args:
        prompt: ``LongTensor[B, P]``, left-padded (d1 pads on the left and passes no attention mask).
        dtype: the model's dtype (d1's Gumbel noise and softmax run in it).

    Returns:
        ``LongTensor[B, P + gen_length]``: the prompt and the completion.

    Raises:
        ValueError: ``gen_length`` not a multiple of ``block_length`` (d1 asserts it), or a
            ``remasking`` d1 does not have.
    """
    import torch

    if gen_length % block_length:
        raise ValueError(f"gen_length {gen_length} is not a multiple of block_length {block_length} (d1 asserts it)")
    if remasking not in ("low_confidence", "random"):
        raise ValueError(f"remasking {remasking!r}: d1's loop has low_confidence and random")
    with torch.no_grad():
        return _d1_loop(model_fn, prompt, steps=steps, gen_length=gen_length, block_length=block_length,
                        temperature=temperature, cfg_scale=cfg_scale, remasking=remasking, mask_id=mask_id, dtype=dtype)


def _d1_loop(model_fn: Callable[[Any], Any], prompt: Any, *, steps: int, gen_length: int, block_length: int,
             temperature: float, cfg_scale: float, remasking: str, mask_id: int, dtype: Any) -> Any:
    import torch
    import torch.nn.functional as F

    bs, plen = prompt.shape
    x = torch.full((bs, plen + gen_length), mask_id, dtype=torch.long, device=prompt.device)
    x[:, :plen] = prompt.clone()
    prompt_index = x != mask_id
    num_blocks = gen_length // block_length
    steps_per_block = max(1, steps // num_blocks)
    for num_block in range(num_blocks):
        start, end = plen + num_block * block_length, plen + (num_block + 1) * block_length
        num_transfer = d1_num_transfer_tokens(x[:, start:end] == mask_id, steps_per_block)
        for i in range(steps_per_block):
            if x.is_cuda:
                torch.cuda.empty_cache()  # d1 empties the allocator's cache at every step
            mask_index = x == mask_id
            if cfg_scale > 0.0:
                un_x = x.clone()
                un_x[prompt_index] = mask_id
                logits, un_logits = torch.chunk(model_fn(torch.cat([x, un_x], dim=0)), 2, dim=0)
                logits = un_logits + (cfg_scale + 1) * (logits - un_logits)
            else:
                logits = model_fn(x)
            x0 = torch.argmax(d1_gumbel(logits, temperature, dtype), dim=-1)
            if remasking == "low_confidence":
                p = F.softmax(logits.to(dtype), dim=-1)
                x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            else:
                x0_p = torch.rand((x0.shape[0], x0.shape[1]), device=x0.device)
            x0_p[:, end:] = -float("inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.full_like(x0_p, -float("inf")))
            transfer = torch.zeros_like(x0, dtype=torch.bool, device=x0.device)
            for j in range(confidence.shape[0]):
                k = num_transfer[j, i].item()
                if k > 0:
                    _, select = torch.topk(confidence[j], k=k)
                    transfer[j, select] = True
            x[transfer] = x0[transfer]
    return x


# --------------------------------------------------------------------------- shared


def _sync(device: Any) -> None:
    fast_measure._sync(device)


def time_rollouts(run: Callable[[], Any], repeats: int, device: Any) -> Dict[str, Any]:
    """One warm-up call of ``run`` then ``repeats`` timed ones (the device synchronised around each):
    ``{"seconds": median, "all_seconds": [...]}`` and the first timed call's output as ``"output"``."""
    run()
    _sync(device)
    secs: List[float] = []
    first = None
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        _sync(device)
        secs.append(time.perf_counter() - start)
        if first is None:
            first = out
    return {"seconds": statistics.median(secs), "all_seconds": secs, "output": first}


def load_job(job: Path) -> Tuple[Any, Any]:
    """``(RLConfig, RunConfig)`` of a compiled RL job: its ``train.py``'s ``build_rl()`` and
    ``build_run()`` (objects only: no CUDA, no process group).

    Raises:
        ValueError: ``job`` has no ``train.py`` or it is not an RL stage's.
    """
    path = Path(job) / "train.py"
    if not path.is_file():
        raise ValueError(f"{path}: no compiled train.py (dlmspec compile SPEC -o {job})")
    spec = importlib.util.spec_from_file_location("dlmspec_compiled_rl_job", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    if not hasattr(module, "build_rl"):
        raise ValueError(f"{path}: not an RL stage's job (no build_rl(); compile a spec with [stage] kind = \"rl\")")
    return module.build_rl(), module.build_run()


# --------------------------------------------------------------------------- dlmspec side


def dlmspec_side(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from dlmspec.backends.generate.load import load_model
    from dlmspec.backends.rl.rollout import RolloutEngine

    t0 = time.time()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    config, run = load_job(Path(args.job))
    if not config.diffusion:
        raise SystemExit(f"d1_rollout: {args.job} runs {config.algorithm} (left-to-right rollouts); d1's loop is "
                         "masked diffusion: benchmark a diffu-grpo or coupled-grpo job")
    model = load_model(args.ckpt, device=args.device)
    dev = model.device
    engine = RolloutEngine(config, tokenizer=model.tokenizer, mask_id=model.mask_token_id, eos_id=model.eos_token_id,
                           pad_id=model.pad_token_id, seed=run.seed, micro_batch_size=run.schedule.micro_batch_size,
                           device=dev, noise_schedule=model.noise_schedule)
    picked = engine.next_prompts()  # the run's first rollout batch
    prompt_ids = [engine.prompt_ids[i] for i in picked]
    G = config.grpo_group_size
    gen = engine.generate_config()
    rows = len(picked) * G
    print(fast_kit.stamp(t0, f"loaded {args.ckpt} on {dev}; {len(picked)} prompts x G {G} = {rows} rows, "
                         f"[generate] {gen.to_dict()}"), flush=True)

    def rollout() -> Any:
        return engine.sample(model.logits_fn, prompt_ids)

    timed = time_rollouts(rollout, args.repeats, dev)
    out = timed.pop("output")
    tokens = rows * gen.gen_length
    from dlmspec.backends.generate.sampler import generate

    expanded = [ids for ids in prompt_ids for _ in range(G)]
    greedy = generate(model.logits_fn, expanded, dataclasses.replace(gen, temperature=0.0), device=dev,
                      noise_schedule=model.noise_schedule)
    # the same rollout with the model's forward eager ([generate] cuda_graph = false), and the greedy
    # rollout's tokens of both (the graphs replay the eager kernels: the same tokens)
    eager_gen = dataclasses.replace(gen, cuda_graph=False)
    eager_timed = time_rollouts(lambda: generate(model.logits_fn, expanded, eager_gen, generator=engine.generator,
                                                 device=dev, noise_schedule=model.noise_schedule),
                                args.repeats, dev)
    eager_timed.pop("output")
    greedy_eager = generate(model.logits_fn, expanded, dataclasses.replace(eager_gen, temperature=0.0), device=dev,
                            noise_schedule=model.noise_schedule)
    plen = int(out.prompt_length)
    lengths = sorted({len(p) for p in prompt_ids})
    # the canvas d1 would see: the prompts left-padded with the pad id (d1 passes no attention mask)
    canvas = [[model.pad_token_id] * (max(lengths) - len(p)) + list(p) for p in prompt_ids for _ in range(G)]
    settings = {"gen_length": gen.gen_length, "steps": gen.steps, "block_length": gen.block_length,
                "temperature": gen.temperature, "remasking": gen.remasking, "cfg_scale": gen.cfg_scale,
                "grpo_group_size": G, "grpo_prompts_per_step": config.grpo_prompts_per_step,
                "chat_template": config.chat_template, "prompts": config.prompts, "seed": run.seed,
                "mask_id": model.mask_token_id, "eos_id": model.eos_token_id, "pad_id": model.pad_token_id,
                "vocab": model.vocab_size, "prompt_lengths": lengths}
    record = {"rows": rows, "settings": settings, "prompt_ids": canvas,
              "answers": [str(engine.rows[i].get("answer", "")) for i in picked for _ in range(G)],
              "prompts": [str(engine.rows[i]["prompt"]) for i in picked for _ in range(G)],
              "tokenizer": {k: model.record.get(f"data.tokenizer.{k}")
                            for k in ("type", "model", "vocab_file", "merge_file", "vocab_size")},
              "cwd": str(Path.cwd())}
    fast_kit.write_json(work / ROLLOUT_FILE, record)
    result: Dict[str, Any] = {
        "side": "dlmspec", "checkpoint": args.ckpt, "iteration": model.iteration, "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None, "job": str(args.job),
        "algorithm": config.algorithm, "settings": settings,
        "loops": {"dlmspec/rl-rollout": {
            **timed, "rows": rows, "tokens": tokens, "tokens_per_second": tokens / timed["seconds"],
            "forward_passes": int(out.forward_passes), "cache": out.cache, "cuda_graph": gen.cuda_graph,
            "cuda_graph_fallback": out.cuda_graph_fallback,
            "what": "RolloutEngine.sample: dlmspec.backends.generate.sampler.generate, the RL stage's rollout call"},
            "dlmspec/rl-rollout-eager": {
            **eager_timed, "rows": rows, "tokens": tokens, "tokens_per_second": tokens / eager_timed["seconds"],
            "cuda_graph": False, "greedy_tokens_equal_cuda_graph": bool(torch.equal(greedy.sequences,
                                                                                      greedy_eager.sequences)),
            "what": "the same sampler call with [generate] cuda_graph = false (the model's forward eager)"}},
        "ids": {"sampled": [r[plen:] for r in out.sequences.tolist()],
                "greedy": [r[int(greedy.prompt_length):] for r in greedy.sequences.tolist()]},
    }
    print(fast_kit.stamp(t0, f"dlmspec rollout: {tokens / timed['seconds']:.0f} tok/s ({rows} rows x {gen.gen_length}, "
                         f"{out.forward_passes} passes, median of {args.repeats}; cuda_graph {gen.cuda_graph}, "
                         f"fallback {out.cuda_graph_fallback}); eager {tokens / eager_timed['seconds']:.0f} tok/s; "
                         f"greedy tokens equal: {torch.equal(greedy.sequences, greedy_eager.sequences)}"), flush=True)
    if args.llada_out:
        try:
            fast_measure.export_llada(model, Path(args.llada_out))
            probe = torch.tensor([canvas[0]], device=dev)
            torch.save({"tokens": probe.cpu(), "logits": model.logits_fn(probe).float().cpu()}, work / "probe.pt")
            result["llada_export"] = str(args.llada_out)
        except Exception as exc:  # noqa: BLE001 - the d1 side then reports the export missing
            result["llada_export_error"] = f"{type(exc).__name__}: {exc}"[:500]
        print(fast_kit.stamp(t0, f"LLaDA export: {result.get('llada_export') or result['llada_export_error']}"), flush=True)
    fast_kit.write_json(Path(args.out), result)
    model.close()
    return 0


# --------------------------------------------------------------------------- d1 side


def d1_side(args: argparse.Namespace) -> int:
    import torch

    t0 = time.time()
    work = Path(args.work)
    record = json.loads((work / ROLLOUT_FILE).read_text())
    s = record["settings"]
    import transformers

    LLaDAModelLM, _, provenance = fast_measure.load_fast_dllm(Path(args.fast_dllm))
    dev = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    hf = LLaDAModelLM.from_pretrained(args.llada, torch_dtype=dtype).to(dev).eval()
    vocab = int(s["vocab"])
    result: Dict[str, Any] = {"side": "d1", "transformers": transformers.__version__, "modelling": provenance,
                              "device": str(dev), "dtype": str(dtype),
                              "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                              "source": "github:dllm-reasoning/d1@837888f diffu-grpo/diffu_grpo_trainer.py "
                                        "DiffuGRPOTrainer.generate (read, not copied)", "loops": {}}

    @torch.no_grad()
    def forward(x: Any) -> Any:
        return hf(x).logits[..., :vocab]  # the tokenizer's vocabulary (module docstring)

    probe_path = work / "probe.pt"
    if probe_path.exists():
        probe = torch.load(probe_path)
        theirs = forward(probe["tokens"].to(dev)).float().cpu()
        ours = probe["logits"][..., :vocab]
        result["probe"] = {"max_abs_logit_diff": float((theirs - ours).abs().max()),
                           "argmax_agreement": float((theirs.argmax(-1) == ours.argmax(-1)).float().mean())}
        print(fast_kit.stamp(t0, f"probe: {result['probe']}"), flush=True)
    prompts = torch.tensor(record["prompt_ids"], dtype=torch.long, device=dev)
    rows, G = prompts.shape[0], int(s["grpo_group_size"])
    chunk = int(args.generation_batch_size or G)
    kw = dict(steps=int(s["steps"]), gen_length=int(s["gen_length"]), block_length=int(s["block_length"]),
              cfg_scale=float(s["cfg_scale"] or 0.0), remasking=str(s["remasking"]), mask_id=int(s["mask_id"]),
              dtype=dtype)
    torch.manual_seed(int(s.get("seed") or 0))

    def whole(temperature: float) -> Any:
        return d1_generate(forward, prompts, temperature=temperature, **kw)

    def chunked(temperature: float) -> Any:
        return torch.cat([d1_generate(forward, prompts[i:i + chunk], temperature=temperature, **kw)
                          for i in range(0, rows, chunk)])

    plen = prompts.shape[1]
    tokens = rows * int(s["gen_length"])
    sampled: Optional[List[List[int]]] = None
    for name, fn, what in (("d1/whole-batch", whole, f"all {rows} rows in one call"),
                           ("d1/generation-batch", chunked, f"chunks of generation_batch_size = {chunk} rows (d1: "
                                                            "generation_batch_size = num_generations)")):
        temp = float(s["temperature"])
        timed = time_rollouts(lambda: fn(temp), args.repeats, dev)
        out = timed.pop("output")
        result["loops"][name] = {**timed, "rows": rows, "tokens": tokens, "tokens_per_second": tokens / timed["seconds"],
                                 "forward_passes": int(s["steps"]) * (rows // chunk + bool(rows % chunk)
                                                                      if name.endswith("generation-batch") else 1),
                                 "what": what}
        if sampled is None:
            sampled = out[:, plen:].tolist()
        print(fast_kit.stamp(t0, f"{name}: {tokens / timed['seconds']:.0f} tok/s"), flush=True)
    greedy = whole(0.0)
    result["ids"] = {"sampled": sampled, "greedy": greedy[:, plen:].tolist()}
    fast_kit.write_json(Path(args.out), result)
    return 0


# --------------------------------------------------------------------------- report


def rollout_accuracy(ids: Sequence[Sequence[int]], record: Dict[str, Any], decode: Callable[[List[int]], str],
                     match: Callable[[str, str], bool]) -> Dict[str, Any]:
    """Exact-match share of rollouts (cut at EOS, decoded) against the rows' answers, Wilson 95 %."""
    return fast_kit.accuracy(ids, record["answers"], decode, record["settings"]["eos_id"], match)


def compare(parts: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """tokens/s of every loop, dlmspec's over each d1 loop and over the faster one, and the target.

    Raises:
        ValueError: no dlmspec loop among ``parts``.
    """
    loops: Dict[str, Dict[str, Any]] = {}
    for part in parts:
        loops.update(part.get("loops", {}))
    ours = loops.get("dlmspec/rl-rollout")
    if not ours:
        raise ValueError("no dlmspec/rl-rollout timing among the parts")
    d1 = {n: e for n, e in loops.items() if n.startswith("d1/") and e.get("tokens_per_second")}
    ratios = {n: ours["tokens_per_second"] / e["tokens_per_second"] for n, e in d1.items()}
    best = max(d1, key=lambda n: d1[n]["tokens_per_second"]) if d1 else None
    ratio = ratios.get(best) if best else None
    return {"tokens_per_second": {n: e["tokens_per_second"] for n, e in loops.items()},
            "ratios": ratios, "fastest_d1": best, "ratio_over_fastest_d1": ratio, "target": TARGET_RATIO,
            "target_met": None if ratio is None else ratio >= TARGET_RATIO}


def report(args: argparse.Namespace) -> int:
    work = Path(args.work)
    parts = [json.loads(Path(p).read_text()) for p in args.parts if Path(p).is_file()]
    values: Dict[str, Any] = {"parts": [p.get("side") for p in parts]}
    try:
        values.update(compare(parts))
    except ValueError as exc:
        values["error"] = str(exc)
    record_path = work / ROLLOUT_FILE
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        values["settings"] = record["settings"]
        values["rows"] = record["rows"]
        match, name = fast_kit.checker()
        decode = fast_measure._decoder({"tokenizer": record["tokenizer"], "vocab": record["settings"]["vocab"],
                                        "cwd": record.get("cwd")})
        values["checker"] = name
        ids = {p["side"]: p.get("ids", {}) for p in parts}
        values["rollout_exact_match"] = {side: rollout_accuracy(i["sampled"], record, decode, match)
                                         for side, i in ids.items() if i.get("sampled")}
        if ids.get("dlmspec", {}).get("greedy") and ids.get("d1", {}).get("greedy"):
            values["greedy_agreement"] = fast_kit.agreement(ids["dlmspec"]["greedy"], ids["d1"]["greedy"])
        examples = ids.get("dlmspec", {}).get("sampled") or []
        values["examples"] = [{"prompt": record["prompts"][i], "answer": record["answers"][i],
                               "completion": decode(fast_kit.cut_at_eos(examples[i], record["settings"]["eos_id"]))}
                              for i in range(min(3, len(examples)))]
    for p in parts:
        eager = p.get("loops", {}).get("dlmspec/rl-rollout-eager")
        if eager is not None:
            values["cuda_graph_greedy_tokens_equal_eager"] = eager.get("greedy_tokens_equal_cuda_graph")
        for key in ("probe", "transformers", "gpu", "device", "dtype", "llada_export_error", "iteration", "checkpoint"):
            if key in p:
                values.setdefault("sides", {}).setdefault(p["side"], {})[key] = p[key]
    fast_kit.write_json(Path(args.out), values)
    print(json.dumps({k: values.get(k) for k in ("tokens_per_second", "ratio_over_fastest_d1", "target_met",
                                                 "rollout_exact_match", "greedy_agreement")}, indent=1))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="side", required=True)
    d = sub.add_parser("dlmspec", help="time the RL stage's rollout on the checkpoint; export it for d1's loop")
    d.add_argument("--ckpt", required=True, help="the checkpoint (a run folder, its checkpoints folder, an iter_*)")
    d.add_argument("--job", required=True, help="the compiled RL job (its train.py gives [stage.rl] and [generate])")
    d.add_argument("--llada-out", default=None, help="where to write the LLaDA Hugging Face export")
    e = sub.add_parser("d1", help="time d1's rollout loop on the export (transformers 4.49.0 first on the path)")
    e.add_argument("--llada", required=True, help="the export the dlmspec side wrote")
    e.add_argument("--fast-dllm", required=True, help="Fast-dLLM's files: LLaDA's modelling code (fetch_fast_dllm.sh)")
    e.add_argument("--generation-batch-size", type=int, default=None,
                   help="rows per call of the chunked variant (default: grpo_group_size, d1's setting)")
    for s in (d, e):
        s.add_argument("--work", required=True, help="the folder both sides share (rollout.json, probe.pt)")
        s.add_argument("--out", required=True, help="this side's result (JSON)")
        s.add_argument("--device", default="cuda")
        s.add_argument("--repeats", type=int, default=3, help="timed rollouts after the warm-up (the median is kept)")
    r = sub.add_parser("report", help="tokens/s side by side, the ratio and the target, rollout accuracy, agreement")
    r.add_argument("--work", required=True)
    r.add_argument("--parts", nargs="+", required=True)
    r.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if getattr(args, "repeats", 1) < 1:
        p.error("--repeats must be >= 1")
    return {"dlmspec": dlmspec_side, "d1": d1_side, "report": report}[args.side](args)


if __name__ == "__main__":
    sys.exit(main())
