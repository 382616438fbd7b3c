"""Host-side work per denoising step of dlmspec's masked-diffusion sampler, measured on CPU.

The sampler (``backends/generate/sampler.py``: ``generate``) runs a tiny megatron-core ``GPTModel``
(local layer spec, fp32, on CPU) so that the model's arithmetic is negligible and what remains is
host work: Python, op dispatch, allocations. For each sampling path it reports, per denoising step:

- ``forward_ms``: wall time inside the model's call by the sampler's ``GPTBlockLogits`` (its
  ``_forward``: the ``GPTModel``, or torch.compile's wrapper of it, timed around the call); on CPU
  with a tiny model this is megatron-core's own host work;
- ``sampler_ms``: wall time of the whole ``generate`` call minus ``forward_ms``, divided by the
  steps: the sampler's work outside the model (block logits function, sampling, commit, canvas
  updates, the per-call set-up and ``_finish`` amortised over the steps);
- ``syncs``: device->host synchronisations outside the model, counted under a
  ``TorchDispatchMode`` (``aten._local_scalar_dense``: ``.item()``, ``bool(t)``, ``int(t)``;
  ``aten.nonzero`` / ``masked_select`` / boolean-mask ``index`` / ``index_put_``:
  data-dependent output shapes) and by wrapping ``Tensor.tolist`` / ``Tensor.cpu`` / ``Tensor.numpy``
  (on CPU these dispatch no op; on CUDA each copies to the host);
- ``ops``: aten ops dispatched outside the model; ``launch_ops``: those that are not views (each a
  kernel launch or more on a GPU; :data:`VIEW_OPS` only change a tensor's metadata);
- ``model_ops`` / ``model_syncs``: the same inside the model's forward, for scale.

Timing runs without the dispatch mode (``--repeats`` timed calls after one warm-up, median; with
``--reference`` the two samplers' calls alternate); the counts come from one more call under it. On a GPU each op outside the model is at least one kernel
launch (~5-10 us of host time) and each sync waits for the queue to drain, so ``ops`` and ``syncs``
are what the GPU step pays beyond the CPU ``sampler_ms``; the real tokens/s is measured by
``bash bench/devbox/gpu.sh rl-diffu-grpo`` and ``bash bench/devbox/gpu.sh fast-sampling``.

Paths (``--paths``; every one at ``--batch`` prompts of lengths between ``P/2`` and ``P``, left-padded):

- ``low_confidence``, ``low_confidence_prefix``, ``low_confidence_dual``: greedy, a fixed number of
  steps per block, block cache none / prefix / dual;
- ``threshold``, ``threshold_dual``: Fast-dLLM's threshold parallel decoding (0.9), greedy;
- ``rl``: the RL rollout's sampling (``specs/task-addition-dlm-rl.toml``: 8 tokens, 8 steps, one
  block, temperature 1 Gumbel-max, EOS set);
- ``rl_dual``: the same with two blocks and the dual cache.

``--reference`` also runs the sampler of commit 9284fc4 (tests/kits/sampler_reference_kit.py, its
code verbatim) on each path, in the same process on the same model: before and after side by side,
and the tokens compared (exit 1 when they differ). ``--device cuda`` runs the same on a GPU (NCCL
world of one; ``wall_ms_per_step`` and ``tokens_per_second`` are then the GPU's, with the device
synchronised after each call; ``forward_ms_per_step`` is the host time inside the model's forward,
which on a GPU is the time to enqueue it).

Usage::

    python bench/sampling/host_overhead.py --out host.json           # the default sizes (~1 min on CPU)
    python bench/sampling/host_overhead.py --dry --out host.json     # smallest sizes, one repeat (seconds)
    # the same with the model's block forwards as CUDA graphs (compile = true; the cache = none paths)
    python bench/sampling/host_overhead.py --device cuda --bf16 --layers 12 --hidden 768 --heads 12 \
        --vocab 50304 --batch 128 --repeats 10 --compile --paths rl,low_confidence,threshold --out "$OUT/host-compile.json"
    # eager and CUDA graphs ([generate] cuda_graph) side by side, tokens compared (exit 1 if they differ),
    # the graphs also with the sampler's commit step eager (what its own graph saves), and d1's rollout
    # loop around the same model on the rl path
    python bench/sampling/host_overhead.py --device cuda --bf16 --layers 12 --hidden 768 --heads 12 \
        --vocab 50304 --batch 1 --repeats 10 --cuda-graph --d1-loop --out "$OUT/host-graphs-b1.json"
    python bench/sampling/host_overhead.py --dry --cuda-graph --stand-in-graphs --d1-loop   # the same, checked on CPU
    # where a step's time goes at batch 32 (the GPU's busy time per step, the costliest kernels and host ops)
    python bench/sampling/host_overhead.py --device cuda --bf16 --layers 12 --hidden 768 --heads 12 \
        --vocab 50304 --batch 32 --repeats 5 --cuda-graph --profile --out "$OUT/host-graphs-b32-profile.json"
    # one GPU call (~1-2 min): the 153M model's shape (12 x 768, 12 heads, GPT-2's padded vocabulary), bf16,
    # the RL rollout's batch, before (9284fc4) and after
    python bench/sampling/host_overhead.py --device cuda --bf16 --layers 12 --hidden 768 --heads 12 \
        --vocab 50304 --batch 128 --repeats 10 --reference --out "$OUT/host-overhead-gpu.json"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]

#: path name -> the ``GenerateConfig`` settings it runs (token ids are added by :func:`run_path`).
PATHS: Dict[str, Dict[str, Any]] = {
    "low_confidence": dict(gen_length=16, steps=16, block_length=8, remasking="low_confidence"),
    "low_confidence_prefix": dict(gen_length=16, steps=16, block_length=8, remasking="low_confidence", cache="prefix"),
    "low_confidence_dual": dict(gen_length=16, steps=16, block_length=8, remasking="low_confidence", cache="dual"),
    "threshold": dict(gen_length=16, steps=16, block_length=8, remasking="threshold", threshold=0.9),
    "threshold_dual": dict(gen_length=16, steps=16, block_length=8, remasking="threshold", threshold=0.9, cache="dual"),
    "rl": dict(gen_length=8, steps=8, block_length=8, remasking="low_confidence", temperature=1.0, eos=True),
    "rl_dual": dict(gen_length=8, steps=8, block_length=4, remasking="low_confidence", temperature=1.0, eos=True,
                    cache="dual"),
}

#: aten ops that only make a view (no kernel on a GPU): ``ops`` counts them, ``launch_ops`` does not.
VIEW_OPS = frozenset(("view", "_unsafe_view", "slice", "select", "expand", "unsqueeze", "squeeze", "t", "transpose",
                      "permute", "alias", "as_strided", "unbind", "split", "split_with_sizes", "chunk", "detach",
                      "_reshape_alias", "reshape", "narrow", "diagonal", "view_as", "expand_as", "unfold"))

#: aten ops whose result needs the device's data on the host (a synchronisation on CUDA).
SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "repeat_interleave", "unique", "_unique2",
            "unique_consecutive", "unique_dim")


class Counter:
    """Counts aten ops and host synchronisations, split by whether the model's forward is running.

    Attributes:
        inside: depth of ``GPTModel.forward`` calls now running (set by the model's hooks).
        ops, syncs: ``{"sampler": n, "model": n}``.
        sync_kinds: ``{"sampler": {op: n}, "model": {op: n}}``.
    """

    def __init__(self) -> None:
        self.inside = 0
        self.active = False
        self.ops = {"sampler": 0, "model": 0}
        self.launches = {"sampler": 0, "model": 0}
        self.syncs = {"sampler": 0, "model": 0}
        self.sync_kinds: Dict[str, Dict[str, int]] = {"sampler": {}, "model": {}}
        self.op_names: Dict[str, int] = {}
        self.model_op_names: Dict[str, int] = {}

    def where(self) -> str:
        return "model" if self.inside else "sampler"

    def sync(self, name: str) -> None:
        if not self.active:
            return
        w = self.where()
        self.syncs[w] += 1
        self.sync_kinds[w][name] = self.sync_kinds[w].get(name, 0) + 1


def _is_sync(func: Any, args: tuple) -> Optional[str]:
    import torch

    name = func.overloadpacket.__name__
    if name in SYNC_OPS:
        return name
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else ()
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (indices or ())):
            return f"{name}[bool mask]"
    return None


@contextlib.contextmanager
def counting(counter: Counter):
    """Count every aten op and sync while the block runs (a ``TorchDispatchMode`` and wrappers of
    ``Tensor.tolist`` / ``cpu`` / ``numpy``)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if counter.active:
                w = counter.where()
                counter.ops[w] += 1
                name = str(func.overloadpacket.__name__)
                if name not in VIEW_OPS:
                    counter.launches[w] += 1
                names = counter.op_names if w == "sampler" else counter.model_op_names
                names[name] = names.get(name, 0) + 1
                why = _is_sync(func, args)
                if why is not None:
                    counter.sync(why)
            return func(*args, **(kwargs or {}))

    originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "cpu", "numpy")}

    def wrap(name: str, fn: Any) -> Any:
        def wrapper(self, *args, **kwargs):
            counter.sync(f"Tensor.{name}")
            return fn(self, *args, **kwargs)
        return wrapper

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    counter.active = True
    try:
        with Mode():
            yield counter
    finally:
        counter.active = False
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def world(device: str = "cpu", store_dir=None):
    """The one-rank megatron-core world (:func:`dlmspec.backends.megatron.distributed.one_rank_world`),
    imported when a world starts."""
    from dlmspec.backends.megatron.distributed import one_rank_world

    return one_rank_world(device, store_dir)


def tiny_model(layers: int, hidden: int, vocab: int, *, heads: int = 4, bf16: bool = False, seed: int = 0,
               init_std: float = 0.2) -> Any:
    """A ``GPTModel`` of ``layers`` x ``hidden``, ``heads`` heads (GQA: ``heads // 2`` groups when even),
    FFN ``4 x hidden``, RMSNorm, q/k norm, RoPE, bidirectional attention, local layer spec (megatron-core
    moves it to the GPU when there is one; ``bf16``: wrapped in ``Float16Module``), eval mode; needs
    :func:`world`."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.layers import build_layer_spec, build_model

    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden, num_attention_heads=heads,
        num_query_groups=heads // 2 if heads % 2 == 0 else heads, kv_channels=hidden // heads,
        normalization="RMSNorm", add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        bf16=bf16, params_dtype=torch.bfloat16 if bf16 else torch.float32, init_method_std=init_std,
    )
    spec = build_layer_spec(attention="bidirectional", qk_layernorm=True, use_transformer_engine=False)
    (model,) = build_model(config, layer_spec=spec, vocab_size=vocab, max_sequence_length=256,
                           position_embedding_type="rope")
    return model.eval()


def prompts_for(batch: int, prompt_length: int, vocab: int, seed: int) -> List[List[int]]:
    """``batch`` prompts of lengths in ``[prompt_length // 2, prompt_length]`` (the longest has
    ``prompt_length``), ids in ``[0, vocab - 2)`` (the top two ids are the mask and EOS)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, prompt_length // 2), prompt_length + 1, (batch,), generator=g).tolist()
    lengths[0] = prompt_length
    return [torch.randint(0, vocab - 2, (n,), generator=g).tolist() for n in lengths]


def reference_generate() -> Any:
    """The sampler of commit 9284fc4 (tests/kits/sampler_reference_kit.py: its code verbatim), for
    ``--reference``: before and after on one machine in one call."""
    kits = str(ROOT / "tests" / "kits")
    if kits not in sys.path:
        sys.path.insert(0, kits)
    import sampler_reference_kit

    return sampler_reference_kit.generate


#: ``--stand-in-graphs``: the CPU stand-in of a CUDA graph (tests/kits/cuda_graph_kit.py ``ReplayBackend``)
#: that the graph path then runs on, to check on the CPU that the bench's graph path works (no speed meaning).
STAND_IN: Dict[str, Any] = {"backend": None}


class _Run:
    """One sampler on one path: its logits function (the model's call timed and marked), counter
    and clock."""

    def __init__(self, sample: Any, model: Any, commit_graph: bool = True) -> None:
        from dlmspec.backends.generate.models import gpt_logits_fn

        self.sample = sample
        self.counter = Counter()
        self.forward_s = 0.0
        self.walls: List[float] = []
        self.forwards: List[float] = []
        self.block_fns: List[Any] = []
        self.logits_fn = gpt_logits_fn(model)
        original = self.logits_fn.block_logits

        def block_logits(config: Any, columns: Optional[Any] = None) -> Any:
            # the sampler's GPTBlockLogits runs the model through its ``_forward`` (the model itself,
            # or torch.compile's wrapper of it): the timer goes around that call, outside any graph
            block_fn, fallback = original(config, columns)
            if not hasattr(block_fn, "_forward"):
                raise SystemExit(f"host_overhead.py: {type(block_fn).__name__}: not the block sampler's GPTBlockLogits")
            block_fn._forward = self._timed(block_fn._forward)
            if STAND_IN["backend"] is not None and getattr(config, "cuda_graph", False) and block_fn.graphs is None:
                from dlmspec.backends.generate.cuda_graphs import COMMIT_ATTRIBUTE, model_graph_cache

                block_fn.graphs = model_graph_cache(block_fn.model, STAND_IN["backend"])
                block_fn.commit_graphs = model_graph_cache(block_fn.model, STAND_IN["backend"], attribute=COMMIT_ATTRIBUTE,
                                                           what="the sampler's commit step")
                block_fn._cuda_graph_refused = None
            if not commit_graph:  # the forward's graphs only: the commit step eager (the comparison's control)
                block_fn.commit_graphs = None
            if getattr(block_fn, "graphs", None) is not None:
                # cuda_graph: a step's model work is the graph path (input copies, replay); an eager
                # forward inside it (warm-up, capture) is counted once, by the outer timer
                block_fn._forward = getattr(block_fn._forward, "__wrapped__", block_fn._forward)
                block_fn._graph_block = self._timed(block_fn._graph_block)
            self.block_fns.append(block_fn)
            return block_fn, fallback

        self.logits_fn.block_logits = block_logits

    def _timed(self, forward: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.counter.inside += 1
            t0 = time.perf_counter()
            try:
                return forward(*args, **kwargs)
            finally:
                self.forward_s += time.perf_counter() - t0
                self.counter.inside -= 1
        call.__wrapped__ = forward  # type: ignore[attr-defined]
        return call


def run_path(name: str, model: Any, prompts: List[List[int]], vocab: int, repeats: int,
             samplers: Dict[str, Any], device: str = "cpu", compile: bool = False,
             profile: bool = False) -> Dict[str, Dict[str, Any]]:
    """One path's timing and counts (see the module docstring) for each of ``samplers`` (label ->
    a ``generate`` function, ``(generate, {GenerateConfig overrides})`` or ``(generate, overrides,
    {"commit_graph": False})``: the forward's CUDA graphs without the commit step's). The timed calls of the
    samplers alternate (one call of each per repeat), so a drift of the machine's speed falls on all
    of them alike. With ``profile``, each record also holds :func:`profile_call`'s breakdown of one
    more call.

    Returns:
        label -> the path's record.
    """
    import torch

    from dlmspec.backends.generate.config import GenerateConfig

    cuda = device != "cpu"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    settings = dict(PATHS[name])
    eos = settings.pop("eos", False)
    import dataclasses

    base = GenerateConfig(mask_token_id=vocab - 1, eos_token_id=vocab - 2 if eos else None, seed=0,
                          compile=compile, cuda_graph=False, **settings)
    configs: Dict[str, Any] = {}
    runs: Dict[str, _Run] = {}
    for label, entry in samplers.items():
        sample, overrides, options = (tuple(entry) + ({},))[:3] if isinstance(entry, tuple) else (entry, {}, {})
        configs[label] = dataclasses.replace(base, **overrides)
        runs[label] = _Run(sample, model, **options)
    config = base
    outs: Dict[str, Any] = {}
    captured: Dict[str, float] = {}
    for label, run in runs.items():  # warm-up (and compilation, graph captures)
        t0 = time.perf_counter()
        outs[label] = run.sample(run.logits_fn, prompts, configs[label], device=device)
        sync()
        captured[label] = time.perf_counter() - t0
    for _ in range(repeats):
        for label, run in runs.items():
            run.forward_s = 0.0
            t0 = time.perf_counter()
            outs[label] = run.sample(run.logits_fn, prompts, configs[label], device=device)
            sync()
            run.walls.append(time.perf_counter() - t0)
            run.forwards.append(run.forward_s)
    records = {}
    for label, run in runs.items():
        counter, out = run.counter, outs[label]
        config = configs[label]
        with counting(counter):
            counted = run.sample(run.logits_fn, prompts, config, device=device)
        steps = out.steps
        profiled = profile_call(run, prompts, config, device, steps) if profile else None
        wall = statistics.median(run.walls)
        forward = statistics.median(run.forwards)
        records[label] = {
            "config": {k: v for k, v in config.to_dict().items() if v is not None},
            "steps": steps,
            "forward_passes": out.forward_passes,
            "cache": out.cache,
            "compile_fallback": out.compile_fallback,
            "cuda_graph": config.cuda_graph,
            "cuda_graph_fallback": getattr(out, "cuda_graph_fallback", None),
            "cuda_graphs": _graph_stats(run),
            "first_call_ms": 1e3 * captured[label],
            **({"profile": profiled} if profiled is not None else {}),
            "tokens_sha": _digest(counted.sequences),
            "same_tokens_under_counting": bool(torch.equal(counted.sequences, out.sequences)),
            "wall_ms_per_call": 1e3 * wall,
            "wall_ms_per_step": 1e3 * wall / steps,
            "tokens_per_second": len(prompts) * config.gen_length / wall,
            "forward_ms_per_step": 1e3 * forward / steps,
            "sampler_ms_per_step": 1e3 * (wall - forward) / steps,
            "syncs_per_step": counter.syncs["sampler"] / steps,
            "ops_per_step": counter.ops["sampler"] / steps,
            "launch_ops_per_step": counter.launches["sampler"] / steps,
            "model_launch_ops_per_step": counter.launches["model"] / steps,
            "model_syncs_per_step": counter.syncs["model"] / steps,
            "model_ops_per_step": counter.ops["model"] / steps,
            "sync_kinds": counter.sync_kinds,
            "sampler_ops_by_name": dict(sorted(counter.op_names.items(), key=lambda kv: (-kv[1], kv[0]))),
            "model_ops_by_name": dict(sorted(counter.model_op_names.items(), key=lambda kv: (-kv[1], kv[0]))),
        }
    return records


def profile_call(run: "_Run", prompts: List[List[int]], config: Any, device: str, steps: int,
                 top: int = 10) -> Dict[str, Any]:
    """One more ``generate`` call under ``torch.profiler``: where a step's time goes.

    Returns ``device_ms_per_step`` (the kernels' summed self time per step: the GPU's busy time,
    overlaps aside; ``None`` on CPU), ``profiled_wall_ms_per_step`` (the call's wall time under the
    profiler, which adds host time), ``device_busy_share`` (the first over the second: near 1 the
    step waits on the GPU, near 0 on the host; ``None`` on CPU) and the ``top`` ops by self device time and by self
    host time (``name``, ``ms`` over the call, ``calls``).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device != "cpu"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        run.sample(run.logits_fn, prompts, config, device=device)
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = list(prof.key_averages())

    def device_us(e: Any) -> float:  # torch >= 2.4 names it self_device_time_total
        return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) or 0.0)

    def table(key: Any) -> List[Dict[str, Any]]:
        ranked = sorted((e for e in events if key(e) > 0), key=key, reverse=True)[:top]
        return [{"name": e.key, "ms": round(key(e) / 1e3, 4), "calls": int(e.count)} for e in ranked]

    device_ms = sum(device_us(e) for e in events) / 1e3 if cuda else None
    return {"device_ms_per_step": device_ms / steps if cuda else None, "profiled_wall_ms_per_step": 1e3 * wall / steps,
            "device_busy_share": device_ms / (1e3 * wall) if cuda and wall > 0 else None,
            "top_device": table(device_us) if cuda else [], "top_host": table(lambda e: float(e.self_cpu_time_total))}


def _graph_stats(run: "_Run") -> Optional[Dict[str, Any]]:
    """The model's CUDA-graph cache counts after the run (``None`` when no graph ran)."""
    caches = {id(b.graphs): b.graphs for b in run.block_fns if getattr(b, "graphs", None) is not None}
    if not caches:
        return None
    (cache,) = list(caches.values())[-1:]
    commits = [b.commit_graphs for b in run.block_fns if getattr(b, "commit_graphs", None) is not None][-1:]
    return {"kept": len(cache), "captures": cache.captures, "replays": cache.replays, "evictions": cache.evictions,
            "fallback": cache.fallback,
            # the sampler's commit-step graphs (greedy paths; the model's cache, shared by every run of the model)
            "commit": {"kept": len(commits[0]), "captures": commits[0].captures, "replays": commits[0].replays,
                       "fallback": commits[0].fallback} if commits else None}


def d1_loop_record(model: Any, prompts: List[List[int]], vocab: int, repeats: int, device: str) -> Dict[str, Any]:
    """d1's rollout loop (``bench/sampling/d1_rollout.py`` ``d1_generate``: a whole-canvas forward per
    step, Gumbel noise in the model's dtype, a ``topk`` per row) around the same megatron-core model's
    eager forward (``gpt_logits_fn``, no attention mask: d1 passes none), on the ``rl`` path's settings:
    the loop's cost beside dlmspec's sampler on one model. Not d1's Hugging Face model: that
    comparison is ``d1_rollout.py``'s."""
    import torch

    from d1_rollout import d1_generate  # bench/sampling/ is on the path (module top)

    from dlmspec.backends.generate.models import gpt_logits_fn

    settings = dict(PATHS["rl"])
    fn = gpt_logits_fn(model)
    width = max(len(p) for p in prompts)
    canvas = torch.tensor([[vocab - 2] * (width - len(p)) + list(p) for p in prompts], device=device)
    dtype = torch.bfloat16 if next(model.parameters()).dtype == torch.bfloat16 else torch.float32

    def run() -> Any:
        return d1_generate(fn, canvas, steps=settings["steps"], gen_length=settings["gen_length"],
                           block_length=settings["block_length"], temperature=settings["temperature"], cfg_scale=0.0,
                           remasking="low_confidence", mask_id=vocab - 1, dtype=dtype)

    run()
    walls = []
    for _ in range(repeats):
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        run()
        if device != "cpu":
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    return {"what": d1_loop_record.__doc__.split("\n\n")[0].strip(), "wall_ms_per_call": 1e3 * wall,
            "wall_ms_per_step": 1e3 * wall / settings["steps"],
            "tokens_per_second": len(prompts) * settings["gen_length"] / wall}


def _digest(t: Any) -> str:
    import hashlib

    return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()[:16]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="write the JSON result here (else stdout only)")
    p.add_argument("--dry", action="store_true", help="smallest sizes, one repeat (a check that it runs)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    p.add_argument("--batch", type=int, default=128, help="prompts per call (the RL rollout's 128)")
    p.add_argument("--prompt-length", type=int, default=24, help="the longest prompt, in tokens")
    p.add_argument("--layers", type=int, default=12, help="transformer layers (12: the 153M model's depth)")
    p.add_argument("--hidden", type=int, default=32, help="hidden size (tiny: compute stays negligible)")
    p.add_argument("--vocab", type=int, default=64, help="vocabulary (the 153M model: 50304, GPT-2's padded)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (the 153M model: 12)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 weights (Float16Module), as a trained checkpoint loads")
    p.add_argument("--compile", action="store_true",
                   help="[generate] compile = true: the model's block forwards as CUDA graphs (cache = none paths; "
                        "a cache path records why it runs uncompiled)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="also run every path with [generate] cuda_graph = true (the model's forward replayed as CUDA "
                        "graphs), beside the eager sampler in the same process; exit 1 when the tokens differ")
    p.add_argument("--stand-in-graphs", action="store_true",
                   help="with --cuda-graph on the CPU: run the graph path on the CPU stand-in of a CUDA graph "
                        "(tests/kits/cuda_graph_kit.py), a check that it runs (its timings mean nothing)")
    p.add_argument("--d1-loop", action="store_true",
                   help="also time d1's rollout loop (d1_rollout.d1_generate) around the same model's eager forward "
                        "on the rl path's settings")
    p.add_argument("--reference", action="store_true",
                   help="also run the sampler of commit 9284fc4 (tests/kits/sampler_reference_kit.py) on each path")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per path (median)")
    p.add_argument("--profile", action="store_true", help="one more call per path and sampler under torch.profiler: "
                   "the GPU's busy time per step and the ops that take most device and host time (the record's 'profile')")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: less noise on a shared machine)")
    args = p.parse_args(argv)
    paths = [s for s in args.paths.split(",") if s]
    unknown = [s for s in paths if s not in PATHS]
    if unknown:
        print(f"host_overhead.py: --paths {','.join(unknown)}: unknown; use some of {','.join(PATHS)}", file=sys.stderr)
        return 2
    for flag in ("batch", "prompt_length", "layers", "hidden", "repeats", "threads"):
        if getattr(args, flag) < 1:
            print(f"host_overhead.py: --{flag.replace('_', '-')} {getattr(args, flag)}: must be >= 1", file=sys.stderr)
            return 2
    if args.heads < 1 or args.hidden % args.heads or args.vocab < 8:
        print(f"host_overhead.py: --hidden {args.hidden} must divide by --heads {args.heads} (>= 1) and --vocab "
              f"{args.vocab} be >= 8; e.g. --hidden 32 --heads 4 --vocab 64", file=sys.stderr)
        return 2
    if args.dry:
        args.batch, args.layers, args.repeats = min(args.batch, 4), min(args.layers, 2), 1
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("host_overhead.py: --device cuda: no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    if args.stand_in_graphs:
        if args.device != "cpu" or not args.cuda_graph:
            print("host_overhead.py: --stand-in-graphs is a CPU check of --cuda-graph; use it with --device cpu "
                  "--cuda-graph", file=sys.stderr)
            return 2
        kits = str(ROOT / "tests" / "kits")
        if kits not in sys.path:
            sys.path.insert(0, kits)
        from cuda_graph_kit import ReplayBackend

        STAND_IN["backend"] = ReplayBackend()
    torch.set_num_threads(args.threads)
    result: Dict[str, Any] = {
        "what": "per-denoising-step host work of backends/generate/sampler.generate on CPU (tiny model)",
        "torch": torch.__version__, "batch": args.batch, "prompt_length": args.prompt_length, "layers": args.layers,
        "hidden": args.hidden, "heads": args.heads, "vocab": args.vocab, "repeats": args.repeats,
        "threads": args.threads, "device": args.device, "bf16": args.bf16, "compile": args.compile,
        "cuda_graph": args.cuda_graph,
        "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "dry": args.dry, "paths": {}, "reference": {},
    }
    with world(args.device):
        model = tiny_model(args.layers, args.hidden, args.vocab, heads=args.heads, bf16=args.bf16)
        prompts = prompts_for(args.batch, args.prompt_length, args.vocab, seed=1)
        from dlmspec.backends.generate.sampler import generate

        samplers: Dict[str, Any] = {"paths": generate}
        if args.cuda_graph:
            samplers["graphs"] = (generate, {"cuda_graph": True})
            samplers["graphs_eager_commit"] = (generate, {"cuda_graph": True}, {"commit_graph": False})
        if args.reference:
            samplers["reference"] = reference_generate()
        for name in paths:
            records = run_path(name, model, prompts, args.vocab, args.repeats, samplers, device=args.device,
                               compile=args.compile, profile=args.profile)
            for where, r in records.items():
                result.setdefault(where, {})[name] = r
                label = {"paths": name, "graphs": f"{name} (cuda graphs)",
                         "graphs_eager_commit": f"{name} (graphs, eager commit)"}.get(where, f"{name} (9284fc4)")
                print(f"{label:30s} steps {r['steps']:3d}  wall {r['wall_ms_per_step']:7.3f} ms/step  "
                      f"forward {r['forward_ms_per_step']:7.3f} ms/step  "
                      f"sampler {r['sampler_ms_per_step']:7.3f} ms/step  syncs {r['syncs_per_step']:5.2f}/step  "
                      f"ops {r['ops_per_step']:6.1f} ({r['launch_ops_per_step']:5.1f} not views)/step  "
                      f"(model {r['model_launch_ops_per_step']:.0f})  "
                      f"{r['tokens_per_second']:9.0f} tok/s  tokens {r['tokens_sha']}", flush=True)
                if "profile" in r:
                    prof = r["profile"]
                    busy = ("" if prof["device_ms_per_step"] is None
                            else f"device {prof['device_ms_per_step']:7.3f} ms/step of ")
                    where = "top_device" if prof["top_device"] else "top_host"
                    print(f"{'':30s} profiled: {busy}{prof['profiled_wall_ms_per_step']:7.3f} ms/step; most "
                          f"{where[4:]} time: " + ", ".join(f"{t['name']} {t['ms']:.2f} ms" for t in prof[where][:3]),
                          flush=True)
            if args.cuda_graph:
                eager, graphs = result["paths"][name], result["graphs"][name]
                graphs["same_tokens_as_eager"] = graphs["tokens_sha"] == eager["tokens_sha"]
                graphs["speedup_over_eager"] = eager["wall_ms_per_step"] / graphs["wall_ms_per_step"]
                result.setdefault("side_by_side", {})[name] = {
                    "eager_wall_ms_per_step": eager["wall_ms_per_step"],
                    "graphs_wall_ms_per_step": graphs["wall_ms_per_step"],
                    "eager_tokens_per_second": eager["tokens_per_second"],
                    "graphs_tokens_per_second": graphs["tokens_per_second"],
                    "speedup": graphs["speedup_over_eager"], "same_tokens": graphs["same_tokens_as_eager"],
                    "graphs_first_call_ms": graphs["first_call_ms"], "eager_first_call_ms": eager["first_call_ms"],
                    "cuda_graph_fallback": graphs["cuda_graph_fallback"], "cuda_graphs": graphs["cuda_graphs"]}
                print(f"{name:30s} eager {eager['wall_ms_per_step']:7.3f} ms/step  graphs "
                      f"{graphs['wall_ms_per_step']:7.3f} ms/step  x{graphs['speedup_over_eager']:.2f}  same tokens: "
                      f"{graphs['same_tokens_as_eager']}  fallback: {graphs['cuda_graph_fallback']}", flush=True)
                forward_only = result["graphs_eager_commit"][name]
                commit_gain = forward_only["wall_ms_per_step"] / graphs["wall_ms_per_step"]
                same_commit = forward_only["tokens_sha"] == graphs["tokens_sha"]
                result["side_by_side"][name].update({
                    "graphs_eager_commit_wall_ms_per_step": forward_only["wall_ms_per_step"],
                    "commit_graph_speedup": commit_gain, "commit_graph_same_tokens": same_commit})
                print(f"{name:30s} graphs with the commit step eager {forward_only['wall_ms_per_step']:7.3f} ms/step: "
                      f"the commit graph x{commit_gain:.2f}, same tokens: {same_commit}", flush=True)
                if not graphs["same_tokens_as_eager"] or not same_commit:
                    print(f"host_overhead.py: {name}: the CUDA-graph tokens differ from the eager sampler's", file=sys.stderr)
            if args.reference:
                same = result["reference"][name]["tokens_sha"] == result["paths"][name]["tokens_sha"]
                result["paths"][name]["same_tokens_as_reference"] = same
                if not same:
                    print(f"host_overhead.py: {name}: the tokens differ from the reference sampler's", file=sys.stderr)
        if args.d1_loop:
            result["d1_loop"] = d1_loop_record(model, prompts, args.vocab, args.repeats, args.device)
            rl = result.get("graphs", result["paths"]).get("rl")
            if rl is not None:
                result["d1_loop"]["dlmspec_rl_tokens_per_second"] = rl["tokens_per_second"]
                result["d1_loop"]["dlmspec_over_d1_loop"] = rl["tokens_per_second"] / result["d1_loop"]["tokens_per_second"]
            print(f"d1 loop (rl settings, same model): {result['d1_loop']['tokens_per_second']:9.0f} tok/s"
                  + (f"; dlmspec rl x{result['d1_loop']['dlmspec_over_d1_loop']:.2f}" if rl is not None else ""),
                  flush=True)
    text = json.dumps(result, indent=2, sort_keys=True) + "\n"
    if args.out is not None:
        sys.path.insert(0, str(ROOT))
        from dlmspec.files import write_atomic

        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out, text)
    differs = [n for n, r in result["paths"].items() if r.get("same_tokens_as_reference") is False]
    differs += [n for n, r in result.get("graphs", {}).items() if r.get("same_tokens_as_eager") is False]
    differs += [n for n, r in result.get("side_by_side", {}).items() if r.get("commit_graph_same_tokens") is False]
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
