"""Next-token prediction (``objective.kind = "ar"``), compiler side. Runtime half:
:mod:`dlmspec.backends.megatron.objectives.ar`."""

from __future__ import annotations

from typing import Any

from dlmspec.objectives.base import Objective, register


class Autoregressive(Objective):
    kind = "ar"
    description = "next-token prediction"
    attention = "causal"
    attentions = ("causal",)
    diffusion = False
    loss_row_fraction = 1.0
    input_bytes_per_token = 0
    predicts_next_token = True
    rl_algorithm = "grpo"
    adjective = "autoregressive"

    def dataset_extra_token(self, objective: Any, stage_kind: str) -> bool:
        # tokens = text[:-1], labels = text[1:] (megatron-core's GPTDataset default)
        return True


AR = register(Autoregressive())
