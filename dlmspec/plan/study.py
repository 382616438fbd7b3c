"""One row per member of a sweep, as scaling-law studies read them: ``dlmspec plan SWEEP.py``'s
table and ``--json`` ``result.study``.

Definitions (each row's numbers):

* ``N`` (``non_embedding_params``): the model's parameters without the input embedding, the
  untied output layer and learned position embeddings (:attr:`dlmspec.params.ParamCounts.non_embedding`,
  counted with the tokenizer's vocabulary; MoE: every expert). This is the ``N`` of Kaplan et
  al. 2020 ("Scaling Laws for Neural Language Models", sec. 2.1) and the usual ``N`` of
  Chinchilla-style fits (Hoffmann et al. 2022); ``total_params`` beside it counts everything.
* ``training_flops``: the planner's model FLOPs of the whole run, ``model FLOPs per step x
  train_iters`` (:func:`dlmspec.flops.model_flops_per_token`: forward + backward = 3 x forward,
  attention and logits included, recomputation not), the FLOPs MFU is computed from.
* ``tokens``: ``train_iters x global_batch_size x seq_length`` (what the run draws).
* ``epochs``: ``tokens / unique training tokens`` (:mod:`dlmspec.data.repetition`); None with
  mock data or when a dataset's counts cannot be read here.
* ``gpu_hours``: the planned time to train x GPUs / 3600; ``mfu``: the planned MFU;
  ``peak_bytes``, ``fits``, ``to_train_seconds``: the plan's memory and time.

The study's ``total_gpu_hours`` is the sum over members.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: The table's and ``--json``'s statement of what N is.
N_DEFINITION = ("N: non-embedding parameters (without the input embedding, an untied output layer and learned "
                "positions; Kaplan et al. 2020, as Chinchilla-style fits use; MoE: all experts); total: every "
                "parameter")


@dataclass(frozen=True)
class StudyRow:
    """One member of a sweep (see the module docstring for each number's definition)."""

    name: str
    spec: str
    non_embedding_params: int
    total_params: int
    training_flops: float
    tokens: int
    unique_tokens: int | None
    epochs: float | None
    gpu_hours: float
    mfu: float
    peak_bytes: int
    fits: bool
    to_train_seconds: float | None


def study_row(name: str, spec: str, resolved: Any, plan: Any, repetition: Any | None) -> StudyRow:
    """The row of one member: ``resolved`` (:func:`dlmspec.resolve.resolve`), its ``plan``
    (:func:`dlmspec.plan.make_plan`) and its data's ``repetition``
    (:func:`dlmspec.data.repetition.repetition`, None with mock data)."""
    lay, t = plan.layout, plan.time
    iters = int(lay.train_iters or resolved.train_iters)
    tokens = iters * int(lay.global_batch) * int(lay.seq)
    return StudyRow(
        name=name, spec=spec, non_embedding_params=int(resolved.params.non_embedding),
        total_params=int(resolved.params.total), training_flops=float(t.flops.model_per_step) * iters,
        tokens=tokens, unique_tokens=None if repetition is None else repetition.unique_tokens,
        epochs=None if repetition is None else repetition.epochs, gpu_hours=float(t.gpu_hours),
        mfu=float(t.mfu), peak_bytes=int(round(plan.memory.peak.peak_bytes)), fits=bool(plan.fits),
        to_train_seconds=t.to_train_seconds,
    )


def study_dict(rows: list[StudyRow]) -> dict[str, Any]:
    """``--json``'s ``result.study``: the rows, their total GPU-hours and what N means."""
    return {"parameters": N_DEFINITION, "members": [asdict(r) for r in rows],
            "total_gpu_hours": sum(r.gpu_hours for r in rows)}
