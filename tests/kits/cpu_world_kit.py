"""CPU process groups for runtime tests: a one-process gloo world, with or without megatron-core's
model-parallel state (the runtime's :func:`dlmspec.backends.megatron.distributed.one_rank_world`,
which the benchmark scripts use too), and worlds of several processes (:func:`spawn_world`). torch
and megatron-core are imported inside the functions, so importing this kit costs nothing."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest


#: What the fork server of :func:`spawn_world` imports once, before it forks any rank.
PRELOAD = ["torch", "torch.distributed", "megatron.core", "megatron.core.models.gpt", "megatron.core.optimizer",
           "megatron.core.dist_checkpointing", "megatron.core.distributed", "dlmspec.backends.megatron.training"]


def spawn_world(fn, args: tuple = (), nprocs: int = 2) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs, join=True)``, each rank forked from a fork
    server (multiprocessing's ``forkserver``) that imported :data:`PRELOAD` once per test process.

    A spawned rank is a fresh interpreter that imports torch and megatron-core again; a rank forked
    from the server starts with them imported, and from a process that runs nothing else (no
    threads, no process group), unlike forking the test process.
    Each rank still gets this process's ``sys.path`` and working directory (multiprocessing sends
    them); environment variables are the server's, set when it started: a rank sets what it needs
    (``RANK``, ``OMP_NUM_THREADS``) itself. Raises what ``spawn`` raises (``ProcessRaisedException``
    with the rank's traceback, ``ProcessExitedException``)."""
    import multiprocessing

    import torch.multiprocessing as tmp

    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)  # read when the server starts
    tmp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


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
    """A one-process gloo world with megatron-core's model-parallel state (TP = PP = 1) on CPU:
    :func:`dlmspec.backends.megatron.distributed.one_rank_world` with its file store in a new
    temporary folder (``torch.cuda.current_device`` answers ``"cpu"`` and ``torch.cuda.synchronize``
    does nothing while it lasts). The process group is created only if none exists, and destroyed
    afterwards if it was. ``mp`` is kept for the callers' signature; the world restores what it patches."""
    from dlmspec.backends.megatron.distributed import one_rank_world

    del mp
    with one_rank_world("cpu", tmp_path_factory.mktemp("pg")):
        yield
