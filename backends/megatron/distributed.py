"""Process groups, megatron-core's parallel state, the device and the seeds of a run.

``torch.distributed`` from the torchrun environment (NCCL on GPU, gloo on CPU; a plain
``python train.py`` is a world of one), the CUDA check made before megatron-core starts,
Megatron-LM's seeding and the teardown at the end of a run.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Dict, Iterator, Optional, Union

import numpy as np
import torch
import torch.distributed as dist

from megatron.core import parallel_state, tensor_parallel


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def initialize_distributed(timeout_minutes: int = 30) -> bool:
    """Initialise ``torch.distributed`` from the torchrun environment.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``; without them (a plain ``python train.py``) it sets up a
    world of one on a free local port.  Uses NCCL and ``cuda:LOCAL_RANK`` when
    CUDA is available, gloo otherwise.

    Returns:
        ``True`` if this call created the process group (the caller should
        destroy it), ``False`` if it already existed.
    """
    if dist.is_initialized():
        return False
    if "RANK" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = "1"
        os.environ.setdefault("LOCAL_RANK", "0")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=timeout_minutes))
    return True


@contextlib.contextmanager
def one_rank_world(device: str = "cpu", store_dir: Optional[Union[str, Path]] = None) -> Iterator[None]:
    """A one-process world with megatron-core's model-parallel state (TP = PP = 1) around the body:
    gloo on CPU, NCCL on CUDA device 0. For benchmark scripts and CPU tests that build a
    megatron-core model outside :func:`~dlmspec.backends.megatron.training.train`.

    On CPU megatron-core asks ``torch.cuda.current_device()`` for RoPE and DDP buffers and calls
    ``torch.cuda.synchronize()`` in its checkpoint strategy: while the world lasts the first answers
    ``"cpu"`` and the second does nothing (both restored afterwards). The rendezvous is a file store
    in ``store_dir`` (a temporary folder when None), so no port is bound and worlds in parallel
    processes do not collide. A process group that exists already is used and kept; one made here
    is destroyed on exit.

    Raises:
        ValueError: ``device`` is neither ``"cpu"`` nor a CUDA device name (``"cuda"``, ``"cuda:0"``).
    """
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"one_rank_world: device {device!r}; pass 'cpu' or 'cuda'")
    saved = torch.cuda.current_device, torch.cuda.synchronize
    if device == "cpu":
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
        torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    else:
        torch.cuda.set_device(0)
    try:
        with contextlib.ExitStack() as stack:
            folder = Path(store_dir) if store_dir is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
            created = not dist.is_initialized()
            if created:
                dist.init_process_group("gloo" if device == "cpu" else "nccl",
                                        init_method=f"file://{folder / 'pg-store'}", rank=0, world_size=1)
            try:
                parallel_state.initialize_model_parallel(1, 1)
                try:
                    yield
                finally:
                    parallel_state.destroy_model_parallel()
            finally:
                if created:
                    dist.destroy_process_group()
    finally:
        torch.cuda.current_device, torch.cuda.synchronize = saved


def cuda_problem(local_rank: Optional[int] = None, processes_per_node: Optional[int] = None) -> Optional[str]:
    """One line saying why this process cannot train on a GPU, or ``None`` when it can.

    megatron-core's optimizers and schedules allocate on ``cuda`` (``MixedPrecisionOptimizer``,
    ``forward_backward_no_pipelining``), so training needs a CUDA device per process.

    Args:
        local_rank: This process's ``LOCAL_RANK`` (default: the environment's, else 0); it must
            be below the number of visible devices.
        processes_per_node: When given (``train.py --check``, before the processes start), the
            node must show at least this many devices.
    """
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if not torch.cuda.is_available():
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return (f"no CUDA device: this torch {torch.__version__} is a CPU-only build; megatron-core trains on "
                    "NVIDIA GPUs: install a CUDA build of torch and run on a GPU node")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return (f"no CUDA device visible to this process{shown}: megatron-core trains on NVIDIA GPUs; run it on "
                "a GPU node (launch.sh, launch.sbatch) and check nvidia-smi there")
    count = torch.cuda.device_count()
    if processes_per_node is not None and count < processes_per_node:
        return (f"{processes_per_node} processes per node need {processes_per_node} GPUs, {count} CUDA device(s) "
                "visible: set [cluster] gpus_per_node to the GPUs a node has (and compile again), or check "
                "CUDA_VISIBLE_DEVICES")
    if local_rank >= count:
        return (f"LOCAL_RANK {local_rank} but only {count} CUDA device(s) visible: start one process per GPU "
                "([cluster] gpus_per_node, CUDA_VISIBLE_DEVICES)")
    return None



def current_device() -> torch.device:
    """``cuda:<current device>`` when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def parallel_layout() -> Dict[str, int]:
    """This run's parallel sizes from megatron-core's parallel state (``tp``, ``pp``, ``dp``,
    ``cp``, ``ep``): logged at start and written into every checkpoint's ``dlmspec.json``."""
    return {
        "tp": parallel_state.get_tensor_model_parallel_world_size(),
        "pp": parallel_state.get_pipeline_model_parallel_world_size(),
        "dp": parallel_state.get_data_parallel_world_size(),
        "cp": parallel_state.get_context_parallel_world_size(),
        "ep": parallel_state.get_expert_model_parallel_world_size(),
    }


def seed_like_megatron(seed: int) -> int:
    """Seed Python, numpy and torch as Megatron-LM's ``_set_random_seed`` does.

    The seed is ``seed + 100 * pipeline rank``: it differs per pipeline stage and is equal across
    data-parallel replicas; with CUDA megatron-core's model-parallel RNG tracker is seeded too
    (``tensor_parallel.model_parallel_cuda_manual_seed``). Needs megatron-core's parallel state.

    Returns:
        The seed used on this rank.
    """
    init_seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(init_seed)
    np.random.seed(init_seed)
    torch.manual_seed(init_seed)
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(init_seed)
    return init_seed


def shutdown(created_process_group: bool, *, barrier: bool = True) -> None:
    """Leave megatron-core's parallel state, and destroy the process group if this run created it
    (:func:`initialize_distributed` returned ``True``); ``barrier`` waits for every rank first."""
    if barrier and dist.is_initialized():
        dist.barrier()
    parallel_state.destroy_model_parallel()
    if created_process_group and dist.is_initialized():
        dist.destroy_process_group()
