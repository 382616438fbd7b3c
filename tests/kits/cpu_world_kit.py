"""CPU process groups for runtime tests: a one-process gloo world, with or without megatron-core's
model-parallel state. torch and megatron-core are imported inside the functions, so importing this
kit costs nothing. (The benchmark scripts, which may not import tests/kits, have the same world in
bench/sampling/one_rank_world.py.)"""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest


@contextlib.contextmanager
def _gloo_group(tmp_path_factory, name: str) -> Iterator[None]:
    """A one-process gloo group whose rendezvous is a file store in a new temporary folder (so it
    binds no port: tests run in parallel); created only if none exists, and destroyed afterwards if
    it was."""
    import torch.distributed as dist

    created = False
    if not dist.is_initialized():
        store = tmp_path_factory.mktemp(name) / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        created = True
    try:
        yield
    finally:
        if created:
            dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_world(tmp_path_factory):
    """A one-process gloo world for the module (megatron-core's dataset builder synchronises ranks
    through torch.distributed); created only if none exists, and destroyed afterwards if it was.
    Its rendezvous is a file store in a temporary folder, so it binds no port (tests run in parallel)."""
    with _gloo_group(tmp_path_factory, "gloo"):
        yield


@contextlib.contextmanager
def megatron_cpu_world(tmp_path_factory, mp: pytest.MonkeyPatch):
    """A one-process gloo world with megatron-core's model-parallel state (TP = PP = 1) on CPU.

    megatron-core asks ``torch.cuda.current_device()`` for RoPE and DDP buffers and calls
    ``torch.cuda.synchronize()`` in its checkpoint strategy: both are patched on ``mp`` for the
    CPU. The process group is created only if none exists, and destroyed afterwards if it was.
    """
    import torch
    from megatron.core import parallel_state

    with _gloo_group(tmp_path_factory, "pg"):
        mp.setattr(torch.cuda, "current_device", lambda: "cpu")
        mp.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
        parallel_state.initialize_model_parallel(1, 1)
        try:
            yield
        finally:
            parallel_state.destroy_model_parallel()
