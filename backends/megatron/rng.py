"""Deterministic, resumable random streams for the training objective.

Every microbatch gets a fresh ``torch.Generator`` seeded with a 64-bit hash of ``(seed, stream,
iteration, data_parallel_rank, microbatch_index)``: a resumed run redraws the masks of an
uninterrupted one, data-parallel ranks differ, and the tensor-, pipeline- and context-parallel
peers of a rank agree; only the base seed is stored, and compared on resume
(:func:`check_resume_seed`). Why: docs/runtime.md, "Random streams".
"""

from __future__ import annotations

import hashlib
import struct
from typing import Optional, Union

import torch

#: Stream identifier of the training objective's draws.
TRAIN_STREAM = 0
#: Stream identifier of the validation objective's draws (kept separate so that
#: evaluating never changes what training draws).
VALID_STREAM = 1

_DOMAIN = b"dlmspec.masking.v1"


def _as_u64(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0 or value >= 2**64:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return value


def masking_seed(
    seed: int,
    iteration: int,
    data_parallel_rank: int,
    microbatch_index: int,
    *,
    stream: int = TRAIN_STREAM,
) -> int:
    """Return the 64-bit seed of one microbatch's objective draws.

    The seed is the first 8 bytes (little endian) of BLAKE2b over a domain tag
    and the five integers packed as unsigned 64-bit values, so distinct inputs
    collide with probability about 2**-64 and the value does not depend on the
    Python version, the platform or ``PYTHONHASHSEED``.

    Args:
        seed: The run's base seed (``RunConfig.seed``), >= 0.
        iteration: The training iteration the microbatch belongs to, counted
            from 0 for the first optimizer step of the run (a resumed run
            continues the count from the checkpoint).  For validation any fixed
            number (the trainer uses 0 so every evaluation sees the same masks).
        data_parallel_rank: Rank in the data-parallel group (without the
            context-parallel dimension: context-parallel peers share data).
        microbatch_index: Index of the microbatch inside the iteration's global
            batch on this data-parallel rank, ``0 <= index < num_microbatches``.
        stream: :data:`TRAIN_STREAM` or :data:`VALID_STREAM` (any int >= 0).

    Returns:
        An int in ``[0, 2**64)``.

    Raises:
        TypeError: If an argument is not an int.
        ValueError: If an argument is negative or does not fit in 64 bits.
    """
    values = (
        _as_u64("seed", seed),
        _as_u64("stream", stream),
        _as_u64("iteration", iteration),
        _as_u64("data_parallel_rank", data_parallel_rank),
        _as_u64("microbatch_index", microbatch_index),
    )
    digest = hashlib.blake2b(_DOMAIN + struct.pack("<5Q", *values), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def masking_generator(
    seed: int,
    iteration: int,
    data_parallel_rank: int,
    microbatch_index: int,
    *,
    stream: int = TRAIN_STREAM,
    device: Union[str, torch.device, None] = None,
) -> torch.Generator:
    """Return a fresh ``torch.Generator`` for one microbatch's objective draws.

    Args:
        seed, iteration, data_parallel_rank, microbatch_index, stream: See
            :func:`masking_seed`.
        device: Device of the generator; draws made with it must be made on the
            same device (``torch.rand(..., generator=g, device=g.device)``).
            ``None`` means CPU.  CPU and CUDA generators seeded alike produce
            different numbers, so a run must be resumed on the same device type
            to redraw the same masks.

    Returns:
        A ``torch.Generator`` on ``device`` seeded with :func:`masking_seed`.
    """
    generator = torch.Generator(device=torch.device(device) if device is not None else "cpu")
    generator.manual_seed(
        masking_seed(seed, iteration, data_parallel_rank, microbatch_index, stream=stream)
    )
    return generator


_CUT_DOMAIN = b"dlmspec.variable_length.v1"


def variable_length_generator(seed: int, iteration: int, microbatch_index: int, *,
                              stream: int = TRAIN_STREAM) -> torch.Generator:
    """A CPU ``torch.Generator`` for the micro-batch cut of ``objective.variable_length =
    "micro_batch"``, seeded from ``(seed, stream, iteration, microbatch_index)`` only (BLAKE2b as
    :func:`masking_seed`, another domain tag): no rank enters it, so every data-, tensor-,
    pipeline- and context-parallel rank cuts micro-batch ``k`` of a step to the same length and
    the ranks stay in step (MegaDLMs seeds numpy with ``step * num_microbatches + k``,
    ``gpt_model.py:269-297``; here the run's seed enters too). On CPU so the length is the same on
    every device type and reading it needs no device synchronisation.

    Raises:
        TypeError, ValueError: as :func:`masking_seed`.
    """
    values = (_as_u64("seed", seed), _as_u64("stream", stream), _as_u64("iteration", iteration),
              _as_u64("microbatch_index", microbatch_index))
    digest = hashlib.blake2b(_CUT_DOMAIN + struct.pack("<4Q", *values), digest_size=8).digest()
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int.from_bytes(digest, "little"))
    return generator


def check_resume_seed(checkpoint_seed: Optional[int], run_seed: int) -> None:
    """Check that a checkpoint was written by a run with the same base seed.

    Resuming with a different seed would silently change every mask drawn from
    the resume point on (and the data order of megatron's datasets), so the
    trainer refuses it.

    Args:
        checkpoint_seed: The seed stored in the checkpoint (``None`` when the
            checkpoint holds none, e.g. it was not written by dlmspec).
        run_seed: ``RunConfig.seed`` of the run being resumed.

    Raises:
        ValueError: If the checkpoint holds no seed or a different one.
    """
    if checkpoint_seed is None:
        raise ValueError(
            "checkpoint holds no masking seed; it was not written by dlmspec's runtime"
        )
    if int(checkpoint_seed) != int(run_seed):
        raise ValueError(
            f"checkpoint was written with seed {checkpoint_seed} but this run has seed "
            f"{run_seed}; resuming would change every mask drawn from here on. Set the "
            f"run's seed to {checkpoint_seed} or start a fresh run directory."
        )
