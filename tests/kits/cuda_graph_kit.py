"""A CPU stand-in for ``backends/generate/cuda_graphs.CUDAGraphBackend`` with a real graph's memory semantics.

A CUDA graph replays the captured kernels on the captured addresses: every tensor the capture made
(its output, the keys and values a refresh stored, intermediates) is written again in place, and
no Python runs. :class:`ReplayBackend` emulates that on the CPU: ``capture`` runs the callable once
and records every aten op's output tensors in order; ``replay`` runs it again under a dispatch mode
that copies each op's result into the tensor the capture recorded for that op and hands the
recorded tensor on, so every Python reference made during a replay is to a capture-time tensor
(the static output is the same object and is overwritten, stored keys and values are the
capture's tensors with new contents), exactly what a real replay leaves behind.
"""

from __future__ import annotations

from typing import Any, Callable, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten


class _Record(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.outputs: List[Any] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.outputs.append(out)
        return out


class _Replay(TorchDispatchMode):
    def __init__(self, recorded: List[Any]) -> None:
        super().__init__()
        self.recorded = recorded
        self.index = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        then = self.recorded[self.index]
        self.index += 1
        new_flat, spec = tree_flatten(out)
        old_flat, _ = tree_flatten(then)
        inputs = {a.untyped_storage().data_ptr() for a in tree_flatten((args, kwargs or {}))[0]
                  if isinstance(a, torch.Tensor)}
        result = []
        for new, old in zip(new_flat, old_flat):
            fresh = (isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor) and new.shape == old.shape
                     and new.untyped_storage().data_ptr() not in inputs)
            if fresh:  # a new allocation: a graph writes it at the captured address
                with torch.no_grad():
                    old.copy_(new)
                result.append(old)
            else:  # a view or an in-place result: over its input's (captured) memory already
                result.append(new)
        return tree_unflatten(result, spec)


class FakeGraph:
    """A captured callable: :meth:`replay` re-runs it writing into the capture's tensors."""

    def __init__(self, fn: Callable[[], Any], recorded: List[Any]) -> None:
        self.fn = fn
        self.recorded = recorded
        self.replays = 0

    def replay(self) -> None:
        with _Replay(self.recorded):
            self.fn()
        self.replays += 1


class ReplayBackend:
    """``warmup`` / ``capture`` as ``CUDAGraphBackend`` has them, on the CPU (see the module docstring).

    Attributes:
        warmups, captures: calls so far.
        fail: an exception ``capture`` raises (a capture that cannot work), or ``None``.
    """

    def __init__(self, fail: BaseException | None = None) -> None:
        self.warmups = 0
        self.captures = 0
        self.fail = fail

    def warmup(self, fn: Callable[[], Any]) -> Any:
        self.warmups += 1
        return fn()

    def capture(self, fn: Callable[[], Any]) -> tuple:
        if self.fail is not None:
            raise self.fail
        self.captures += 1
        record = _Record()
        with record:
            out = fn()
        return FakeGraph(fn, record.outputs), out
