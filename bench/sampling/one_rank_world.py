"""A one-process world with megatron-core's model-parallel state (TP = PP = 1), for the benchmark
scripts and their CPU tests: gloo on CPU, NCCL on CUDA device 0.

On CPU megatron-core asks ``torch.cuda.current_device()`` for RoPE and DDP buffers and calls
``torch.cuda.synchronize()`` in its checkpoint strategy: while the world lasts the first answers
``"cpu"`` and the second does nothing (both restored afterwards, as tests/kits/cpu_world_kit.py
patches them for the test tiers). The rendezvous is a file store in ``store_dir`` (a temporary
folder when None), so no port is bound. A process group that exists already is used and kept; one
made here is destroyed on exit.

Import it as ``one_rank_world`` from a script in bench/sampling/ (its folder is ``sys.path[0]``) or
as ``bench.sampling.one_rank_world`` from the repository root. torch and megatron-core are imported
when the world starts, never at import.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator, Optional, Union

__all__ = ["one_rank_world"]


@contextlib.contextmanager
def one_rank_world(device: str = "cpu", store_dir: Optional[Union[str, Path]] = None) -> Iterator[None]:
    """Run the body in a one-rank world on ``device`` (``"cpu"``: gloo; else NCCL on CUDA device 0),
    with megatron-core's model-parallel state (TP = PP = 1) initialised, and destroyed on exit.

    Raises:
        ValueError: ``device`` is neither ``"cpu"`` nor a CUDA device name (``"cuda"``, ``"cuda:0"``).
    """
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"one_rank_world: device {device!r}; pass 'cpu' or 'cuda'")
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

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
