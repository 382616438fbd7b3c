"""CUDA graphs of the sampler's model forward: one ``torch.cuda.CUDAGraph`` per input shape, replayed
at every denoising step, so a step costs a few copies and one graph launch of host time instead of
the ~1,000 aten ops (~530 kernel launches) of an eager megatron-core ``GPTModel`` forward.

How (PyTorch's "CUDA Graphs" notes, docs.pytorch.org/docs/stable/notes/cuda.html#cuda-graphs, and
``torch.cuda.graph``): the callable runs on **static inputs** (tensors the graph reads from fixed
addresses; each call copies its arguments into them), once eagerly on a side stream (warm-up: lazy
state such as cuBLAS handles, megatron-core's ``lru_cache`` d rotary tables and SDPA's dispatch is
made outside the capture), then is captured into a graph whose output tensors are **static outputs**
(overwritten by every replay). All graphs share one memory pool (``torch.cuda.graph_pool_handle``):
they never run concurrently (the sampler replays one at a time on one stream), and each graph's
inputs and outputs stay referenced while it is kept, so no capture reuses them.

:class:`GraphCache` keeps the graphs by a key the caller gives (the shapes and whatever else the
captured code baked in as Python values), at most ``max_graphs``, least recently used evicted.
What the captured code reads from outside its inputs (parameters, ``lru_cache`` d tables, tensors a
caller kept from another graph's output) is read by address at every replay: the cache holds a
reference to every tensor an op of the capture read that the capture did not create (found with a
``TorchDispatchMode`` during the capture only), so an ``lru_cache`` eviction cannot free memory a
kept graph still reads.

A replay returns the static output itself (no copy): a consumer that keeps it past the next replay
of the same graph must clone it (``GPTBlockLogits`` does where its result could alias it).

Testing on CPU: the capture is behind :class:`CUDAGraphBackend`; a test passes another backend with
the same ``warmup`` / ``capture`` methods (``tests/integration/generate/`` uses one whose "replay"
re-runs the callable and writes into the captured outputs, so static-buffer and aliasing
semantics are those of a real graph).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence

import torch
from torch import Tensor

#: Graphs kept per :class:`GraphCache` (least recently used evicted). Each holds its static output
#: (``[b, block, V]`` logits: 412 MB in bf16 at b = 128, block 32, V = 50,304) and its inputs.
DEFAULT_MAX_GRAPHS = 8


def cuda_graph_unsupported(model: Any, *, tensor_model_parallel_size: int = 1) -> Optional[str]:
    """Why the sampler's model forward cannot run as a CUDA graph, or ``None`` when it can.

    Refused (the forward runs eager; the reason is recorded in the output as ``cuda_graph_fallback``):

    - tensor parallelism (``tensor_model_parallel_size > 1``): the forward's all-reduces would be
      captured NCCL collectives, which need every rank to capture and replay in lockstep with
      graph-safe NCCL settings; not built or measured here, so refused rather than risked;
    - a megatron-core ``DistributedDataParallel`` wrapper with ``overlap_param_gather``: its forward
      pre-hooks gather the updated parameter shards after each optimizer step, and a replay runs
      no hook (the RL policy would roll out with stale weights); likewise Megatron-FSDP / FSDP2
      (sharded parameters gathered around each forward);
    - a model on the CPU (CUDA graphs are a CUDA feature; the switch is then a no-op).

    Args:
        model: the ``GPTModel`` or a wrapper of it.
        tensor_model_parallel_size: the model's TP.
    """
    if tensor_model_parallel_size > 1:
        return (f"tensor_model_parallel_size = {tensor_model_parallel_size}: capturing the forward's NCCL "
                "all-reduces on every rank in lockstep is not built; the forward runs eager")
    wrapper = model
    while wrapper is not None:
        ddp = getattr(wrapper, "ddp_config", None)
        if ddp is not None and getattr(ddp, "overlap_param_gather", False):
            return ("DistributedDataParallel with overlap_param_gather: its forward pre-hooks gather updated "
                    "parameters, which a graph replay would skip; the forward runs eager")
        sharded = ddp is not None and (getattr(ddp, "use_megatron_fsdp", False) or getattr(ddp, "use_custom_fsdp", False))
        if sharded or "FullySharded" in type(wrapper).__name__:
            return (f"{type(wrapper).__name__}: sharded parameters are gathered by hooks around each forward, which a "
                    "graph replay would skip; the forward runs eager")
        wrapper = getattr(wrapper, "module", None)
    params = getattr(model, "parameters", None)
    if callable(params) and any(type(p).__name__ == "DTensor" or hasattr(p, "_local_tensor") for p in params()):
        return "parameters are DTensors (FSDP2): their gathers run outside any graph; the forward runs eager"
    first = next(iter(params()), None) if callable(params) else None
    if first is None or first.device.type != "cuda":
        where = "no parameters" if first is None else f"parameters on {first.device.type}"
        return f"the model is not on a CUDA device ({where}): CUDA graphs need one; the forward runs eager"
    return None


class CUDAGraphBackend:
    """Warm-up and capture as PyTorch's CUDA-graph notes prescribe, with one shared memory pool.

    Args:
        warmup_iterations: eager runs on a side stream before a capture (PyTorch's example: 3;
            the sampler's forward has no lazily built state after one run, so 1).
    """

    def __init__(self, warmup_iterations: int = 1) -> None:
        self.warmup_iterations = max(1, int(warmup_iterations))
        self.pool = torch.cuda.graph_pool_handle()

    def warmup(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` ``warmup_iterations`` times on a side stream; the last result."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        out = None
        with torch.cuda.stream(side):
            for _ in range(self.warmup_iterations):
                out = fn()
        torch.cuda.current_stream().wait_stream(side)
        return out

    def capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        """``(graph, static_output)``: ``fn`` captured into a ``torch.cuda.CUDAGraph`` in the shared
        pool (``capture_error_mode="thread_local"``: another thread's CUDA calls, e.g. a trainer's,
        do not invalidate the capture)."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = fn()
        return graph, out


@dataclass
class GraphEntry:
    """One captured graph.

    Attributes:
        key: what it is kept by.
        graph: the backend's graph (``replay()``).
        inputs: the static inputs, in the order of the call's arguments (``None`` where the
            argument was ``None``).
        output: the static output (what ``fn`` returned during the capture).
        held: tensors read by the capture that it did not create (kept alive, see the module docstring).
        extras: what the caller attached (e.g. the cached keys and values a refresh graph wrote).
        replays: replays so far.
        serial: its capture's number in its cache (1, 2, ...): what a dependent graph is keyed by.
    """

    key: Hashable
    graph: Any
    inputs: List[Optional[Tensor]]
    output: Any
    held: List[Tensor] = field(default_factory=list)
    extras: Dict[str, Any] = field(default_factory=dict)
    replays: int = 0
    serial: int = 0


def _spec(t: Optional[Tensor]) -> Any:
    return None if t is None else (tuple(t.shape), t.dtype, t.device)


@torch.no_grad()
def _external_reads(fn: Callable[[], Any]) -> tuple[Any, List[Tensor]]:
    """``fn()`` and the tensors its aten ops read that none of its ops created (by storage)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    created: set = set()
    held: Dict[int, Tensor] = {}

    def ptr(t: Tensor) -> int:
        try:
            return t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # a tensor without a storage (meta, sparse): none to keep alive
            return 0

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            flat, _ = tree_flatten((args, kwargs or {}))
            for a in flat:
                if isinstance(a, Tensor):
                    p = ptr(a)
                    if p and p not in created and p not in held:
                        held[p] = a
            out = func(*args, **(kwargs or {}))
            outs, _ = tree_flatten(out)
            for o in outs:
                if isinstance(o, Tensor):
                    p = ptr(o)
                    if p and p not in held:
                        created.add(p)
            return out

    with Reads():
        out = fn()
    return out, list(held.values())


class GraphCache:
    """Shape-keyed CUDA graphs of one callable (see the module docstring).

    Args:
        backend: :class:`CUDAGraphBackend` (default) or a test's stand-in.
        max_graphs: graphs kept (>= 1); the least recently used is dropped beyond it.
        what: what the graphs run, for :attr:`fallback`'s sentence (``"the forward"``).

    Attributes:
        captures, replays, evictions: counts over the cache's life.
        fallback: why graphs stopped being used (a capture raised), or ``None``; once set,
            :meth:`run` calls the callable eagerly.
    """

    def __init__(self, backend: Any = None, *, max_graphs: int = DEFAULT_MAX_GRAPHS, what: str = "the forward") -> None:
        if int(max_graphs) < 1:
            raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
        self.backend = backend if backend is not None else CUDAGraphBackend()
        self.max_graphs = int(max_graphs)
        self._graphs: "OrderedDict[Hashable, GraphEntry]" = OrderedDict()
        self.captures = 0
        self.replays = 0
        self.evictions = 0
        self.fallback: Optional[str] = None
        self.what = what

    def __len__(self) -> int:
        return len(self._graphs)

    def keys(self) -> List[Hashable]:
        """The kept keys, least recently used first."""
        return list(self._graphs)

    def get(self, key: Hashable) -> Optional[GraphEntry]:
        """The entry kept for ``key`` (without marking it used), or ``None``."""
        return self._graphs.get(key)

    def drop(self, key: Hashable) -> None:
        """Forget the graph of ``key`` (if kept)."""
        self._graphs.pop(key, None)

    def run(self, key: Hashable, fn: Callable[..., Any], inputs: Sequence[Optional[Tensor]], *,
            on_capture: Optional[Callable[[GraphEntry], None]] = None,
            on_replay: Optional[Callable[[GraphEntry], None]] = None) -> Any:
        """``fn(*inputs)`` through the graph of ``key``: replayed if kept, else warmed up, captured,
        kept and replayed.

        ``key`` must determine everything ``fn`` bakes in besides the inputs' values (their shapes,
        dtypes and devices are checked; Python values ``fn`` reads must be part of the key).

        Args:
            key: hashable.
            fn: the callable; called as ``fn(*static_inputs)``.
            inputs: this call's tensors (or ``None``), copied into the static inputs.
            on_capture: called with the new entry right after its capture (before its first
                replay), to attach ``extras``.
            on_replay: called with the entry after each replay (e.g. to point the caller's state at
                what the graph wrote).

        Returns:
            The static output (overwritten by the next replay of this graph), or, after a failed
            capture (:attr:`fallback`), ``fn(*inputs)`` run eagerly.
        """
        if self.fallback is not None:
            return fn(*inputs)
        entry = self._graphs.get(key)
        if entry is not None and [_spec(t) for t in entry.inputs] != [_spec(t) for t in inputs]:
            self._graphs.pop(key)  # the caller's key did not capture a shape: recapture
            entry = None
        if entry is None:
            static = [None if t is None else t.clone() for t in inputs]
            try:
                self.backend.warmup(lambda: fn(*static))
                (graph, output), held = _external_reads(lambda: self.backend.capture(lambda: fn(*static)))
            except Exception as exc:  # noqa: BLE001 - any capture failure: eager from now on, recorded
                self.fallback = f"a CUDA-graph capture failed ({type(exc).__name__}: {exc}); {self.what} runs eager"
                self._graphs.clear()
                return fn(*inputs)
            entry = GraphEntry(key=key, graph=graph, inputs=static, output=output,
                               held=[t for t in held if not any(t is s for s in static)])
            self.captures += 1
            entry.serial = self.captures
            self._graphs[key] = entry
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
                self.evictions += 1
            if on_capture is not None:
                on_capture(entry)
        else:
            self._graphs.move_to_end(key)
            for dst, src in zip(entry.inputs, inputs):
                if dst is not None and dst is not src:
                    dst.copy_(src)
        entry.graph.replay()
        entry.replays += 1
        self.replays += 1
        if on_replay is not None:
            on_replay(entry)
        return entry.output


#: The attribute of a model (the object the sampler calls) that holds its :class:`GraphCache`, so the
#: graphs outlive one ``generate`` call (the RL stage makes a new logits function per rollout).
MODEL_ATTRIBUTE = "_dlmspec_cuda_graphs"
#: The attribute holding the graphs of the sampler's commit step (the tokens a denoising step writes,
#: from the step's logits: ``dlmspec.backends.generate.sampler``), kept apart from the forward's so
#: that neither evicts the other; they share the forward graphs' backend and memory pool.
COMMIT_ATTRIBUTE = "_dlmspec_cuda_commit_graphs"


def model_graph_cache(model: Any, backend: Any = None, *, max_graphs: int = DEFAULT_MAX_GRAPHS,
                      attribute: str = MODEL_ATTRIBUTE, what: str = "the forward") -> GraphCache:
    """The :class:`GraphCache` kept on ``model`` under ``attribute`` (made at the first call; a new one
    when ``backend`` is given and differs from the kept one's). Every sampler of the same model object
    shares it: graphs are captured once per shape for the model's life (or until evicted);
    :func:`release_model_graphs` drops them (and their memory)."""
    cache = model.__dict__.get(attribute)
    if cache is None or (backend is not None and cache.backend is not backend):
        cache = GraphCache(backend, max_graphs=max_graphs, what=what)
        model.__dict__[attribute] = cache
    return cache


def release_model_graphs(model: Any) -> bool:
    """Drop the graphs kept on ``model``, the forward's and the commit step's (their static buffers
    return to the pool; the pool's memory to the allocator once no graph holds it). Returns whether
    there were any."""
    dropped = [model.__dict__.pop(name, None) is not None for name in (MODEL_ATTRIBUTE, COMMIT_ATTRIBUTE)]
    return any(dropped)
