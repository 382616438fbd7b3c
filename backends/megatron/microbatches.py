"""One step's microbatches, fed to megatron-core's schedules and to every model chunk.

A stage's data reaches the model through a :class:`MicrobatchFeed`: megatron's schedules call
``next(data_iterator)`` once per microbatch (per model chunk with virtual pipelining), and each
item carries the RNG stream, the step and the microbatch index that seed the objective's draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import torch


@dataclass
class MicrobatchItem:
    """One microbatch as handed to a stage's forward step (:meth:`~dlmspec.backends.megatron.stage.Stage.forward_step`).

    Attributes:
        stream: :data:`~dlmspec.backends.megatron.rng.TRAIN_STREAM` or ``VALID_STREAM``.
        iteration: Step index used for the masking RNG.
        index: Microbatch index inside the step on this data-parallel rank.
        batch: Collated CPU batch (``tokens``, ``labels``, ``loss_mask``,
            ``position_ids``, each ``[mbs, s]``).
    """

    stream: int
    iteration: int
    index: int
    batch: Dict[str, torch.Tensor]


class MicrobatchFeed:
    """Feeds one step's microbatches to every model chunk of this rank.

    Megatron's schedules call ``next(data_iterator)`` once per microbatch on
    each pipeline stage and, with virtual pipelining, on each model chunk's own
    iterator.  All chunks of a rank must see the same microbatches in the same
    order, so one loader is read once and the batches of the current step are
    shared by per-chunk views (:attr:`iterators`).

    Args:
        loader: Iterable of collated batches (a DataLoader).
        num_chunks: Number of model chunks on this rank.
        stream: RNG stream id of these microbatches.
    """

    def __init__(self, loader, num_chunks: int, stream: int) -> None:
        self._source = iter(loader)
        self._stream = stream
        self._iteration = 0
        self._batches: List[Dict[str, torch.Tensor]] = []
        self.iterators = [_ChunkView(self) for _ in range(num_chunks)]

    def start(self, iteration: int) -> None:
        """Begin a step: the next ``next()`` on every view returns microbatch 0."""
        self._iteration = iteration
        self._batches = []
        for view in self.iterators:
            view.index = 0

    def get(self, index: int) -> MicrobatchItem:
        """Microbatch ``index`` of the current step (read from the loader on first use).

        Raises:
            StopIteration: When the loader is exhausted.
        """
        while len(self._batches) <= index:
            self._batches.append(next(self._source))
        return MicrobatchItem(self._stream, self._iteration, index, self._batches[index])

    def data_iterator(self):
        """What to pass as ``data_iterator`` to megatron's schedule."""
        return self.iterators if len(self.iterators) > 1 else self.iterators[0]

    def close(self) -> None:
        """Stop the loader's worker processes now (idempotent).

        The views and the feed refer to each other, so the loader's iterator is only freed by
        the garbage collector, possibly never before the interpreter exits. Its workers ignore
        stop signals (:func:`~dlmspec.backends.megatron.signals.ignore_exit_signals`), and Python's
        ``multiprocessing`` exit hook SIGTERMs daemonic children and then joins them, so a
        worker still alive at exit hangs the rank for ever after training has finished (seen on
        the H200: runs printed their result and were killed by the runner's time limit).
        ``_shutdown_workers`` is what PyTorch's iterator runs when it is deleted: it tells each
        worker to stop and joins it.
        """
        source, self._source = self._source, iter(())
        shutdown = getattr(source, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._batches = []


class _ChunkView:
    def __init__(self, feed: MicrobatchFeed) -> None:
        self.feed = feed
        self.index = 0

    def __iter__(self) -> "_ChunkView":
        return self

    def __next__(self) -> MicrobatchItem:
        item = self.feed.get(self.index)
        self.index += 1
        return item

