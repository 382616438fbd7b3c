"""Shared fixtures."""

from __future__ import annotations

import contextlib

import pytest

import shared_kit


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``shared_data`` when the offline data kit is missing (tests/shared_kit.py)."""
    if shared_kit.PRESENT:
        return
    skip = pytest.mark.skip(reason=shared_kit.MISSING_REASON)
    for item in items:
        if item.get_closest_marker("shared_data"):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def gloo_world():
    """A one-process gloo world for the module (megatron-core's dataset builder synchronises ranks
    through torch.distributed); created only if none exists, and destroyed afterwards if it was."""
    import os

    import torch.distributed as dist

    created = False
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29547")
        dist.init_process_group("gloo", rank=0, world_size=1)
        created = True
    yield
    if created:
        dist.destroy_process_group()


@contextlib.contextmanager
def megatron_cpu_world(tmp_path_factory, mp: pytest.MonkeyPatch):
    """A one-process gloo world with megatron-core's model-parallel state (TP = PP = 1) on CPU.

    megatron-core asks ``torch.cuda.current_device()`` for RoPE and DDP buffers and calls
    ``torch.cuda.synchronize()`` in its checkpoint strategy: both are patched on ``mp`` for the
    CPU. The process group is created only if none exists, and destroyed afterwards if it was.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    created = False
    if not dist.is_initialized():
        store = tmp_path_factory.mktemp("pg") / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        created = True
    mp.setattr(torch.cuda, "current_device", lambda: "cpu")
    mp.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    parallel_state.initialize_model_parallel(1, 1)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        if created:
            dist.destroy_process_group()
